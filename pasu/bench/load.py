"""`pasu bench load`: the cloud server under many concurrent clients on loopback, measured.

It starts `pasu cloud serve` as a subprocess on 127.0.0.1 (a free port, no other traffic) with one bearer
token per client, so authentication and the per-client limits see N devices rather than one. N clients run
on one asyncio loop, each with its own channel (its own TCP connection), each sending one utterance after
another: a unary Understand, or a StreamingUnderstand in 100 ms chunks sent as fast as the server takes them
(not at real-time pace: the point is to load the server, not to wait on a microphone). The loop is closed:
a client sends its next utterance when the previous one is answered, so throughput is what the server
sustains and latency includes queueing. A client refused with RESOURCE_EXHAUSTED waits 50 ms, as a device
that falls back to its local answer would not hammer the server either.

Figures: requests served; failed, by status code, with RESOURCE_EXHAUSTED (backpressure the server chose)
counted apart; throughput; client-side latency percentiles; the server's peak RSS; and its RSS growth from
the end of the warm-up to 5,000 requests later (or to the end of the run when fewer were answered: the
span is printed with the figure). The run ends after `--duration` seconds or `--max-requests` requests,
whichever comes first; requests in flight then finish, and the server is stopped with SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tqdm import tqdm

from pasu.metrics import LatencyStats
from pasu.settings import REPO_ROOT, shared_data_dir

# The shipped device model (`pasu package` output) when the repository has one.
DEFAULT_MODEL = REPO_ROOT / "models" / "shipped" / "device"
SAMPLE_RATE = 16000
REAL_SPEECH = ("cards", "librivox", "misc")  # shared real recordings: 1 to 11 s of human speech
BACKPRESSURE_PAUSE_S = 0.05


@dataclass(frozen=True)
class LoadOptions:
    """One load run."""

    model: Path  # packaged model folder the server loads
    clients: int = 32  # concurrent clients, each with its own connection and token
    duration_s: float = 120.0  # no new request is sent after this long
    max_requests: int | None = None  # ... nor after this many were sent
    streaming_share: float = 0.5  # fraction of requests sent as StreamingUnderstand
    deadline_s: float = 60.0  # per request: generous, closed-loop queueing at 32 clients takes seconds
    chunk_ms: int = 100  # audio per stream message
    warmup_requests: int = 100  # answered requests before the RSS baseline (allocator and caches warm)
    rss_window: int = 5000  # requests over which RSS growth is measured
    server_threads: int | None = None  # torch threads of the server; None: its default (every core)
    server_args: tuple[str, ...] = ()  # further `pasu cloud serve` flags, e.g. ("--max-queue", "8")
    audio_dir: Path | None = None  # utterances to send (wav/flac, any rate); None: shared real speech
    seed: int = 0  # utterance and call-kind choices


@dataclass
class Tally:
    """What the clients saw, updated on the client loop."""

    sent: int = 0
    codes: Counter[str] = field(default_factory=Counter)  # (status code name) -> count
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"unary": [], "streaming": []})  # OK only
    audio_s: float = 0.0  # audio seconds in OK answers

    @property
    def answered(self) -> int:
        return sum(self.codes.values())


@dataclass(frozen=True)
class RssSample:
    t_s: float  # since the load began
    answered: int  # requests answered by then (any status)
    rss_bytes: int


# --- The server process ---------------------------------------------------------------------------------


class ServerProcess:
    """`pasu cloud serve` in a subprocess; its JSON log is read on a thread (rpc lines counted by code)."""

    def __init__(self, model: Path, token_file: Path, threads: int | None, extra: tuple[str, ...],
                 timeout_s: float = 120.0):
        command = [sys.executable, "-m", "pasu.cli", "cloud", "serve", "--model", str(model), "--host", "127.0.0.1",
                   "--port", "0", "--no-metrics", "--token-file", str(token_file), "--grace", "30", *extra]
        if threads is not None:
            command += ["--threads", str(threads)]
        self.proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "GRPC_VERBOSITY": "ERROR"})
        self.serving: dict[str, Any] = {}
        self.codes: Counter[str] = Counter()  # the server's own count of finished RPCs
        self.other_lines: list[str] = []  # anything not an rpc line (errors, tracebacks), last 50
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout_s) or not self.serving:
            self.kill()
            raise RuntimeError("the server did not start:\n" + "".join(self.other_lines[-20:]))

    @property
    def address(self) -> str:
        return self.serving["address"]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (graceful) and the exit code; SIGKILL if it does not stop in time."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        self._reader.join(10)
        return code

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            entry = _json(line)
            if entry is not None and entry.get("msg") == "rpc":
                self.codes[entry.get("code", "?")] += 1
                continue
            if entry is not None and entry.get("msg") == "serving":
                self.serving = entry
                self._ready.set()
            self.other_lines = [*self.other_lines[-49:], line]
        self._ready.set()  # exited


def _json(line: str) -> dict | None:
    if not line.startswith("{"):
        return None
    try:
        return json.loads(line)
    except ValueError:
        return None


# --- Audio ----------------------------------------------------------------------------------------------


def load_utterances(audio_dir: Path | None, limit: int = 500) -> tuple[list[np.ndarray], str]:
    """(16 kHz mono waveforms, where they came from): a folder, the shared real speech, or synthetic audio."""
    from pasu.device.audio import AudioError, load_audio

    if audio_dir is not None:
        paths = sorted(p for p in Path(audio_dir).rglob("*") if p.suffix.lower() in (".wav", ".flac"))[:limit]
        source = str(audio_dir)
    else:
        real = shared_data_dir() / "real_speech"
        paths = sorted(p for d in REAL_SPEECH for p in (real / d).glob("*") if p.suffix.lower() in (".wav", ".flac"))
        source = f"{real} ({', '.join(REAL_SPEECH)})"
    waves = []
    for path in paths:
        try:
            wave = load_audio(path, SAMPLE_RATE)
        except AudioError:
            continue
        if 0.2 <= len(wave) / SAMPLE_RATE <= 25.0:  # within the server's default limits
            waves.append(wave)
    if waves:
        return waves, source
    if audio_dir is not None:
        raise SystemExit(f"no usable audio (wav/flac, 0.2-25 s) under {audio_dir}")
    rng = np.random.default_rng(0)  # no shared data: speech-length noise still loads the server the same way
    return [np.clip(0.1 * rng.standard_normal(int(s * SAMPLE_RATE)), -1, 1).astype(np.float32)
            for s in (1.0, 1.5, 2.0, 2.5, 3.0, 4.0)], "synthetic noise (shared real speech not found)"


# --- The clients ----------------------------------------------------------------------------------------


class Budget:
    """Tickets for new requests until the duration or the request count runs out."""

    def __init__(self, duration_s: float, max_requests: int | None):
        self.ends_at = time.monotonic() + duration_s
        self.max_requests = max_requests
        self.issued = 0

    def take(self) -> bool:
        if time.monotonic() >= self.ends_at or (self.max_requests is not None and self.issued >= self.max_requests):
            return False
        self.issued += 1
        return True


async def run_clients(address: str, tokens: list[str], utterances: list[np.ndarray], options: LoadOptions,
                      tally: Tally, budget: Budget) -> None:
    """Every client's loop until the budget is spent and its last request is answered."""
    from pasu.device.cloud_client import encode_audio
    from pasu.protos import slu_pb2, slu_pb2_grpc

    payloads = [encode_audio(w, "pcm16")[1] for w in utterances]
    chunk_bytes = 2 * SAMPLE_RATE * options.chunk_ms // 1000

    async def client(index: int, token: str) -> None:
        rng = np.random.default_rng([options.seed, index])
        metadata = (("authorization", f"Bearer {token}"),)
        async with grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", -1)]) as channel:
            stub = slu_pb2_grpc.SpeechUnderstandingStub(channel)
            n = 0
            while budget.take():
                k = int(rng.integers(len(payloads)))
                streaming = bool(rng.random() < options.streaming_share)
                meta = slu_pb2.UtteranceMetadata(utterance_id=f"c{index}-{n}", client_id=f"load-{index}")
                n += 1
                started = time.perf_counter()
                try:
                    if streaming:
                        await _stream(stub, payloads[k], chunk_bytes, meta, metadata, options.deadline_s)
                    else:
                        audio = slu_pb2.Audio(encoding=slu_pb2.LINEAR16, sample_rate=SAMPLE_RATE, data=payloads[k])
                        await stub.Understand(slu_pb2.UnderstandRequest(audio=audio, metadata=meta),
                                              timeout=options.deadline_s, metadata=metadata)
                    code = "OK"
                except grpc.aio.AioRpcError as error:
                    code = error.code().name
                tally.codes[code] += 1
                if code == "OK":
                    tally.latencies["streaming" if streaming else "unary"].append(time.perf_counter() - started)
                    tally.audio_s += len(payloads[k]) / 2 / SAMPLE_RATE
                elif code == "RESOURCE_EXHAUSTED":
                    await asyncio.sleep(BACKPRESSURE_PAUSE_S)

    await asyncio.gather(*(client(i, token) for i, token in enumerate(tokens)))
    tally.sent = budget.issued


async def _stream(stub: Any, data: bytes, chunk_bytes: int, meta: Any, metadata: tuple, deadline_s: float) -> None:
    from pasu.protos import slu_pb2

    def messages():
        yield slu_pb2.StreamRequest(config=slu_pb2.StreamConfig(encoding=slu_pb2.LINEAR16, sample_rate=SAMPLE_RATE,
                                                                metadata=meta))
        for start in range(0, len(data), chunk_bytes):
            yield slu_pb2.StreamRequest(audio=data[start : start + chunk_bytes])
        yield slu_pb2.StreamRequest(end=slu_pb2.EndOfAudio())

    replies = [reply async for reply in stub.StreamingUnderstand(messages(), timeout=deadline_s, metadata=metadata)]
    if not replies or replies[-1].WhichOneof("response") != "result":
        raise RuntimeError("stream ended without a result")


async def sample_rss(pid: int, tally: Tally, started: float, samples: list[RssSample], done: asyncio.Event,
                     bar: tqdm, options: LoadOptions, every_s: float = 0.5) -> None:
    """Record the server's RSS against the answered count, and move the progress bar."""
    import psutil

    process = psutil.Process(pid)
    while True:
        elapsed = time.monotonic() - started
        try:
            samples.append(RssSample(elapsed, tally.answered, process.memory_info().rss))
        except psutil.Error:  # the server died: the run reports it
            return
        failed = tally.answered - tally.codes["OK"]
        bar.n = tally.answered if options.max_requests else min(elapsed, options.duration_s)
        bar.set_postfix(ok=tally.codes["OK"], failed=failed, rps=f"{tally.codes['OK'] / max(elapsed, 1e-9):.1f}",
                        rss=f"{samples[-1].rss_bytes / 2**20:.0f}M", refresh=False)
        bar.refresh()
        try:
            await asyncio.wait_for(done.wait(), every_s)
            return
        except TimeoutError:
            pass


# --- Figures --------------------------------------------------------------------------------------------


def rss_growth(samples: list[RssSample], warmup: int, window: int) -> dict[str, Any]:
    """RSS change over `window` answered requests after the first `warmup` (or over what was answered).

    The ends are the medians of the first and the last tenth of the span's samples, not single samples: RSS at
    one instant depends on which utterances happen to be in the running batch (an 11 s one pads them all).
    """
    start = next((i for i, s in enumerate(samples) if s.answered >= warmup), None)
    if start is None:
        return {"pct": None, "requests": 0, "full_window": False,
                "note": f"fewer than {warmup} warm-up requests were answered"}
    goal = samples[start].answered + window
    stop = next((i for i, s in enumerate(samples) if s.answered >= goal), len(samples) - 1)
    span = samples[start : stop + 1]
    k = max(1, len(span) // 10)
    first = float(np.median([s.rss_bytes for s in span[:k]]))
    last = float(np.median([s.rss_bytes for s in span[-k:]]))
    requests = span[-1].answered - span[0].answered
    return {"pct": 100.0 * (last - first) / first, "requests": requests, "full_window": requests >= window,
            "from_bytes": first, "to_bytes": last}


def figures(tally: Tally, samples: list[RssSample], elapsed_s: float, options: LoadOptions) -> dict[str, Any]:
    ok = tally.codes["OK"]
    failed = {code: n for code, n in sorted(tally.codes.items()) if code not in ("OK", "RESOURCE_EXHAUSTED")}
    latency = {}
    for kind, values in [("all", tally.latencies["unary"] + tally.latencies["streaming"]), *tally.latencies.items()]:
        if values:
            stats = LatencyStats.from_seconds(values)
            latency[kind] = {"n": stats.n, "p50_ms": 1000 * stats.p50, "p90_ms": 1000 * stats.p90,
                             "p99_ms": 1000 * stats.p99, "max_ms": 1000 * stats.max}
    return {
        "sent": tally.sent,
        "served": ok,
        "failed": sum(failed.values()),
        "failed_by_code": failed,
        "resource_exhausted": tally.codes["RESOURCE_EXHAUSTED"],
        "elapsed_s": elapsed_s,
        "throughput_rps": ok / elapsed_s if elapsed_s > 0 else 0.0,
        "audio_s_per_s": tally.audio_s / elapsed_s if elapsed_s > 0 else 0.0,
        "latency": latency,
        "peak_rss_bytes": max((s.rss_bytes for s in samples), default=0),
        "rss_growth": rss_growth(samples, options.warmup_requests, options.rss_window),
    }


def format_table(result: dict[str, Any]) -> str:
    f, o = result["figures"], result["options"]
    lat = f["latency"]

    def pct(kind: str) -> str:
        if kind not in lat:
            return "-"
        x = lat[kind]
        return f"{x['p50_ms']:.0f} / {x['p90_ms']:.0f} / {x['p99_ms']:.0f} ms (n={x['n']})"

    growth = f["rss_growth"]
    if growth["pct"] is None:
        growth_text = growth["note"]
    else:
        span = "" if growth["full_window"] else f" (run ended before {o['rss_window']:,})"
        growth_text = f"{growth['pct']:+.2f}% over {growth['requests']:,} requests{span}; target < 5%"
    by_code = ", ".join(f"{code} {n}" for code, n in f["failed_by_code"].items()) or "none"
    rows = [
        ("clients / duration",
         f"{o['clients']} clients, {f['elapsed_s']:.1f} s, {100 * o['streaming_share']:.0f}% streaming"),
        ("model", result["model_id"]),
        ("requests sent", f"{f['sent']:,}"),
        ("served (OK)", f"{f['served']:,}"),
        ("failed", f"{f['failed']:,} (by code: {by_code})"),
        ("RESOURCE_EXHAUSTED (backpressure)", f"{f['resource_exhausted']:,}"),
        ("throughput", f"{f['throughput_rps']:.2f} req/s ({f['audio_s_per_s']:.1f} s of audio per s)"),
        ("latency p50 / p90 / p99, all", pct("all")),
        ("  unary", pct("unary")),
        ("  streaming", pct("streaming")),
        ("server peak RSS", f"{f['peak_rss_bytes'] / 2**20:.0f} MiB"),
        ("server RSS growth", growth_text),
        ("server", f"survived, exit code {result['server_exit_code']}" if result["server_survived"]
         else f"DIED (exit code {result['server_exit_code']})"),
        ("machine", f"{os.cpu_count()} CPU cores"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


# --- Running it -----------------------------------------------------------------------------------------


def run(options: LoadOptions) -> dict[str, Any]:
    """Start the server, load it, stop it; the result (options, figures, server counts, RSS series)."""
    if not (Path(options.model) / "config.yaml").is_file():
        raise SystemExit(f"no packaged model at {options.model} (a `pasu package` folder with config.yaml); "
                         "package one, e.g. `pasu package exp/device --out /tmp/pasu-load-model`, and pass "
                         "--model /tmp/pasu-load-model")
    utterances, source = load_utterances(options.audio_dir)
    tokens = [secrets.token_urlsafe(18) for _ in range(options.clients)]
    with tempfile.TemporaryDirectory(prefix="pasu-load-") as folder:
        token_file = Path(folder) / "tokens"
        token_file.touch(mode=0o600)
        token_file.write_text("\n".join(tokens) + "\n")
        server = ServerProcess(Path(options.model), token_file, options.server_threads, options.server_args)
    try:
        tally, samples, elapsed = asyncio.run(_load(server, tokens, utterances, options))
        survived = server.alive()
    finally:
        exit_code = server.stop()
    return {
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
        "model_id": server.serving.get("model_id", "?"),
        "audio": {"source": source, "utterances": len(utterances),
                  "mean_seconds": float(np.mean([len(w) for w in utterances])) / SAMPLE_RATE},
        "figures": figures(tally, samples, elapsed, options),
        "server_counts": dict(server.codes),
        "server_survived": survived,
        "server_exit_code": exit_code,
        "server_errors": [line for line in server.other_lines if '"level": "ERROR"' in line][-10:],
        "rss_samples": [asdict(s) for s in samples[:: max(1, len(samples) // 500)]],
        "cpu_count": os.cpu_count(),
    }


async def _load(server: ServerProcess, tokens: list[str], utterances: list[np.ndarray],
                options: LoadOptions) -> tuple[Tally, list[RssSample], float]:
    tally, samples, done = Tally(), [], asyncio.Event()
    total = options.max_requests or options.duration_s
    with tqdm(total=total, unit="req" if options.max_requests else "s", desc="pasu bench load",
              dynamic_ncols=True, bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} {unit} [{elapsed}{postfix}]") as bar:
        started = time.monotonic()
        sampler = asyncio.create_task(sample_rss(server.pid, tally, started, samples, done, bar, options))
        await run_clients(server.address, tokens, utterances, options, tally, Budget(options.duration_s,
                                                                                     options.max_requests))
        elapsed = time.monotonic() - started
        done.set()
        await sampler
    return tally, samples, elapsed


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "load", help="the cloud server under N concurrent unary and streaming clients: failures, latency, RSS",
        description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: pasu bench load --model /tmp/pasu-load-model --clients 32 --duration 120 "
               "--out runs/load.json")
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL,
                        help=f"packaged model folder (default: {DEFAULT_MODEL.relative_to(REPO_ROOT)})")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (default 32)")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of load (default 120)")
    parser.add_argument("--max-requests", type=int, default=None, help="stop after sending this many")
    parser.add_argument("--streaming-share", type=float, default=0.5, help="fraction sent as streams (0.5)")
    parser.add_argument("--deadline", type=float, default=60.0, help="per-request deadline in seconds (60)")
    parser.add_argument("--threads", type=int, default=None, help="the server's torch threads")
    parser.add_argument("--audio", type=Path, default=None, help="folder of wav/flac utterances to send")
    parser.add_argument("--server-arg", action="append", default=[], metavar="FLAG",
                        help="extra `pasu cloud serve` flag (repeatable), e.g. --server-arg=--max-queue=8")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    if args.clients < 1 or args.duration <= 0 or not 0.0 <= args.streaming_share <= 1.0:
        raise SystemExit("--clients must be >= 1, --duration > 0 and --streaming-share in [0, 1]")
    options = LoadOptions(model=args.model, clients=args.clients, duration_s=args.duration,
                          max_requests=args.max_requests, streaming_share=args.streaming_share,
                          deadline_s=args.deadline, server_threads=args.threads, audio_dir=args.audio,
                          server_args=tuple(args.server_arg), seed=args.seed)
    result = run(options)
    print(format_table(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    figures = result["figures"]
    return 0 if result["server_survived"] and figures["failed"] == 0 else 1
