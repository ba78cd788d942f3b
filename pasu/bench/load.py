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
the end of the warm-up (1,000 requests) to 5,000 requests later (or to the end of the run when fewer were
answered: the span is printed with the figure). The run ends after `--duration` seconds or `--max-requests` requests,
whichever comes first; requests in flight then finish, and the server is stopped with SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from tqdm import tqdm

from pasu.bench.load_report import RssSample, Tally, figures, format_table
from pasu.bench.server_process import ServerProcess
from pasu.settings import REPO_ROOT, shared_data_dir, shipped_model

DEFAULT_MODEL = shipped_model("device")  # `pasu package` output, when the repository ships one
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
    # Answered requests before the RSS baseline: the allocator keeps growing its pools while it meets new batch
    # shapes (measured: 440 -> 500 MiB over the first ~1,000 short utterances, flat over the next 5,000).
    warmup_requests: int = 1000
    rss_window: int = 5000  # requests over which RSS growth is measured
    server_threads: int | None = None  # torch threads of the server; None: its default (every core)
    server_args: tuple[str, ...] = ()  # further `pasu cloud serve` flags, e.g. ("--max-queue", "8")
    audio_dir: Path | None = None  # utterances to send (wav/flac, any rate); None: shared real speech
    seed: int = 0  # utterance and call-kind choices


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
                    code = "OK"
                    if streaming and not await _stream(stub, payloads[k], chunk_bytes, meta, metadata,
                                                       options.deadline_s):
                        code = "NO_RESULT"  # a stream that ended OK without its answer: a server bug
                    elif not streaming:
                        audio = slu_pb2.Audio(encoding=slu_pb2.LINEAR16, sample_rate=SAMPLE_RATE, data=payloads[k])
                        await stub.Understand(slu_pb2.UnderstandRequest(audio=audio, metadata=meta),
                                              timeout=options.deadline_s, metadata=metadata)
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


async def _stream(stub: Any, data: bytes, chunk_bytes: int, meta: Any, metadata: tuple, deadline_s: float) -> bool:
    """One StreamingUnderstand call; whether it ended with exactly one result."""
    from pasu.protos import slu_pb2

    def messages():
        yield slu_pb2.StreamRequest(config=slu_pb2.StreamConfig(encoding=slu_pb2.LINEAR16, sample_rate=SAMPLE_RATE,
                                                                metadata=meta))
        for start in range(0, len(data), chunk_bytes):
            yield slu_pb2.StreamRequest(audio=data[start : start + chunk_bytes])
        yield slu_pb2.StreamRequest(end=slu_pb2.EndOfAudio())

    replies = [reply async for reply in stub.StreamingUnderstand(messages(), timeout=deadline_s, metadata=metadata)]
    return [r.WhichOneof("response") for r in replies] == ["result"]  # no acks asked for: one result, nothing else


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
        threads = ("--threads", str(options.server_threads)) if options.server_threads is not None else ()
        server = ServerProcess(Path(options.model), ("--token-file", str(token_file), "--grace", "30", *threads,
                                                     *options.server_args))
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
        "figures": figures(tally, samples, elapsed, options.warmup_requests, options.rss_window),
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
               "--out bench/load.json")
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
    parser.add_argument("--warmup", type=int, default=1000, help="answered requests before the RSS baseline")
    parser.add_argument("--seed", type=int, default=0, help="seed of the utterance and call-kind choices (0)")
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    if args.clients < 1 or args.duration <= 0 or not 0.0 <= args.streaming_share <= 1.0:
        raise SystemExit("--clients must be >= 1, --duration > 0 and --streaming-share in [0, 1]")
    options = LoadOptions(model=args.model, clients=args.clients, duration_s=args.duration,
                          max_requests=args.max_requests, streaming_share=args.streaming_share,
                          deadline_s=args.deadline, server_threads=args.threads, audio_dir=args.audio,
                          server_args=tuple(args.server_arg), warmup_requests=args.warmup, seed=args.seed)
    result = run(options)
    print(format_table(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    figures = result["figures"]
    return 0 if result["server_survived"] and figures["failed"] == 0 else 1
