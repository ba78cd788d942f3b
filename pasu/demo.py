"""`pasu demo`: the whole system on one machine, in one command.

It starts the cloud server on loopback (a real `pasu cloud serve` process), renders sample commands from the
project's own labelled sentences with espeak-ng (half of them buried in noise, so the offramp has something
to send to the cloud), feeds each to the device agent at real-time pace, and prints what happened to every
utterance: transcript, intent, slots, route, latency after end of speech and the pilots in brief. It ends
with a summary and a picture of one utterance's timeline.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pasu.device.cli import add_lm_flags
from pasu.settings import REPO_ROOT, shipped_model

if TYPE_CHECKING:
    from pasu.device.agent import AgentOptions
    from pasu.device.routing import Policy
    from pasu.device.runtime import DeviceModel

SAMPLES = REPO_ROOT / "pasu" / "corpus" / "samples" / "slurp" / "test.jsonl"


@dataclass(frozen=True)
class DemoOptions:
    utterances: int = 8  # sample commands to run
    hard_every: int = 2  # every n-th utterance gets heavy noise (0 dB SNR): the ones to offload
    voice: str = "espeak:en-us"  # TTS voice of the samples (pasu.corpus.tts voice id)
    # the offramp: "ppl+intent" (the last pilot's perplexity or the intent check, whichever fires: at Offload-M
    # in `pasu bench hybrid` about the intent check's intent accuracy with less WER), "intent" or "ppl"; a model
    # without the intent check (MODEL/offramp: its reader and intent_errors.json) falls back to ppl
    policy: str = "ppl+intent"
    # the perplexity's score times the speech's seconds above which the device offloads (routing.threshold; for
    # "intent", routing.intent_threshold); None: the model's, calibrated at `level` (MODEL/offramp/offramp.json,
    # `pasu offramp train`); a model without one needs it
    threshold: float | None = None
    level: str = "M"  # the calibrated operating point (routing.level): Offload-L, -M or -H
    realtime: bool = True  # feed audio at real-time pace (False: virtual clock, faster)
    # a `pasu lm train` folder fused into the final local decode (agent.lm; e.g. models/shipped/lm); "": none.
    # The pilots do not read it (a command too short for a pilot is judged on the final decode)
    lm: str = ""
    lm_weight: float | None = None  # its weight with `lm`; None: the shipped LM's (SHIPPED_LM_WEIGHT)
    # the agent's budget for one offload (agent.cloud_deadline_s); None: the agent's own (2 s), or DEADLINE_MARGIN x
    # the warm-up round trip where that is longer, since the demo's cloud is a CPU process sharing the board's cores
    cloud_deadline_s: float | None = None
    seed: int = 0  # noise


# the demo's deadline by default: this many times the warm-up round trip (the first call, the slowest), at least
# the agent's own; the shipped cloud on a 2-core build machine answered a command in 0.8 s one day and 2.3 s another
DEADLINE_MARGIN = 1.5


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the hybrid pipeline end to end on generated sample commands",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="Example: pasu demo --utterances 8 --out demo-out")
    p.add_argument("--model", type=Path, default=shipped_model("device"), help="device model folder")
    p.add_argument("--cloud-model", type=Path, default=shipped_model("cloud"),
                   help="cloud model folder (default: the shipped cloud model; the device model if none)")
    p.add_argument("--utterances", type=int, default=DemoOptions.utterances,
                   help=f"sample commands to run (default {DemoOptions.utterances})")
    p.add_argument("--policy", choices=("ppl+intent", "intent", "ppl"), default=DemoOptions.policy,
                   help=f"offramp deciding what goes to the cloud (default {DemoOptions.policy})")
    p.add_argument("--threshold", type=float, default=DemoOptions.threshold,
                   help="offload threshold in the offramp's units, for ppl+intent its perplexity's (default: the "
                        "model's, calibrated at --level)")
    p.add_argument("--level", choices=("L", "M", "H"), default=DemoOptions.level,
                   help="the calibrated operating point: Offload-L, -M or -H, which offloaded 25%%, 47%% or 63%% of "
                        f"the model's dev calibration utterances (default {DemoOptions.level})")
    add_lm_flags(p, "; the pilots the offramps read do not change (default: none)")
    p.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                   help="the agent's budget for one offload, then it answers locally (default: the agent's 2 s, or "
                        f"{DEADLINE_MARGIN} x the warm-up round trip where longer: the demo's cloud shares this "
                        "machine's cores)")
    p.add_argument("--fast", action="store_true", help="virtual clock instead of real-time pacing")
    p.add_argument("--out", type=Path, default=Path("demo-out"), help="samples, results and timeline picture")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from pasu.corpus.tts import TTSError
    from pasu.device.agent import AgentOptions, use_lm_of
    from pasu.device.offramp_train import load_device_model
    from pasu.models.recognizer import is_model_folder
    from pasu.torch_threads import set_torch_threads

    options = DemoOptions(utterances=args.utterances, policy=args.policy, threshold=args.threshold,
                          level=args.level, realtime=not args.fast, lm=args.lm or "", lm_weight=args.lm_weight,
                          cloud_deadline_s=args.deadline)
    for folder in (args.model,):
        if not (folder / "config.yaml").is_file():
            print(f"error: no model at {folder}", file=sys.stderr)
            return 2
    cloud_model = args.cloud_model if is_model_folder(args.cloud_model) else args.model
    if cloud_model != args.cloud_model:
        print(f"note: no cloud model at {args.cloud_model}; the cloud serves the device model", file=sys.stderr)
    set_torch_threads(AgentOptions().threads)  # the agent's own setting, as `pasu device run` applies it
    model = load_device_model(args.model)
    try:
        use_lm_of(model, agent_options(options))  # OSError / ValueError: not an LM folder, or other tokens
        policy = demo_policy(model, args.model, options)  # ValueError: not calibrated, and no --threshold
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        samples = make_samples(args.out / "samples", options)
    except TTSError as error:  # the samples are rendered here: the demo needs espeak-ng
        print(f"error: {error}; install the TTS engines with `make tts` (scripts/install_tts.sh)", file=sys.stderr)
        return 2
    with CloudProcess(cloud_model, args.out / "cloud.log") as server:
        rows = run_agent(model, policy, server.address, samples, options)
    print_table(rows)
    print_summary(rows)
    picture = draw_timeline(rows, args.out / "timeline.png")
    (args.out / "results.json").write_text(json.dumps([_jsonable(r) for r in rows], indent=1))
    print(f"\nwrote {args.out / 'results.json'} and the timeline picture {picture}")
    return 0


# ---- samples ---------------------------------------------------------------------------------------------
def make_samples(folder: Path, options: DemoOptions) -> list[dict]:
    """Render (or reuse) the sample commands: [{id, audio, text, intent, slots, hard}]."""
    import soundfile as sf

    from pasu.corpus.tts import render, voice_by_id
    from pasu.slu import parse_annotation

    folder.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in SAMPLES.read_text().splitlines() if line.strip()][: options.utterances]
    rng = np.random.default_rng(options.seed)
    voice = voice_by_id(options.voice)
    samples = []
    for i, row in enumerate(rows):
        hard = options.hard_every > 0 and i % options.hard_every == options.hard_every - 1
        path = folder / f"sample-{i:02d}{'-noisy' if hard else ''}.wav"
        if not path.exists():
            audio = render(voice, row["sentence"])
            if hard:
                audio = audio + rng.standard_normal(len(audio)).astype(np.float32) * float(np.std(audio))
            sf.write(path, np.clip(audio, -1, 1), 16000)
        text, slots = parse_annotation(row["sentence_annotation"])
        samples.append({"id": path.stem, "audio": path, "text": text, "intent": row["intent"],
                        "slots": tuple(slots), "hard": hard})
    return samples


# ---- the cloud -------------------------------------------------------------------------------------------
class CloudProcess:
    """`pasu cloud serve` on a free loopback port, waited for with the gRPC health service."""

    def __init__(self, model: Path, log_path: Path):
        self.model, self.log_path = model, log_path
        self.address = f"127.0.0.1:{_free_port()}"

    def __enter__(self) -> CloudProcess:
        port = self.address.rsplit(":", 1)[1]
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pasu.cli", "cloud", "serve", "--model", str(self.model), "--port", port,
             "--no-metrics", "--threads", "1"], stdout=self.log, stderr=subprocess.STDOUT)
        _wait_healthy(self.address, self.process, timeout_s=120)
        print(f"cloud server up on {self.address} (model {self.model.name}, log {self.log_path})", file=sys.stderr)
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(address: str, process: subprocess.Popen, timeout_s: float) -> None:
    from pasu.device.cloud_client import CloudClient

    deadline = time.monotonic() + timeout_s
    with CloudClient(address) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"the cloud server exited with code {process.returncode}; see its log")
            if client.serving(timeout_s=1.0):
                return
            time.sleep(0.5)
    raise RuntimeError(f"the cloud server did not become healthy within {timeout_s:.0f} s")


# ---- the device ------------------------------------------------------------------------------------------
def demo_policy(model: DeviceModel, model_dir: Path, options: DemoOptions) -> Policy:
    """The policy the demo plays: `options.policy` at its threshold (default: the model's, at `options.level`);
    perplexity when the model has no intent check (its reader and model, MODEL/offramp)."""
    from pasu.device.offramp_train import OFFRAMP_DIR, model_policy
    from pasu.device.routing import RoutingOptions

    def policy(offramp: str) -> Policy:
        routing = RoutingOptions(policy=offramp, level=options.level)
        if options.threshold is not None:
            routing = routing.with_policy_threshold(options.threshold)
        return model_policy(routing, model, model_dir / OFFRAMP_DIR)

    try:
        return policy(options.policy)
    except FileNotFoundError:  # only the policies with the intent check read a file
        print("note: the model has no intent check (`pasu offramp train`); offloading by perplexity",
              file=sys.stderr)
        return policy("ppl")


def agent_options(options: DemoOptions) -> AgentOptions:
    """The agent as shipped, with the demo's LM in its final decode."""
    from pasu.device.agent import AgentOptions, fusing_lm

    return fusing_lm(AgentOptions(), options.lm, options.lm_weight)


def run_agent(model: DeviceModel, policy: Policy, address: str, samples: list[dict],
              options: DemoOptions) -> list[dict]:
    """Each sample through the device agent with the cloud at `address`: the samples with their results."""
    from tqdm import tqdm

    from pasu.device.agent import DeviceAgent, play_realtime, replay
    from pasu.device.audio import load_audio
    from pasu.device.cloud_client import CloudClient

    rows, agent_opts = [], agent_options(options)
    with CloudClient(address, deadline_s=30.0) as cloud:  # the warm-up's budget; the agent passes its own
        first = load_audio(samples[0]["audio"])
        replay(model, first, agent_opts)  # warm-up: first calls are slow, on both sides
        started = time.monotonic()
        cloud.understand(first, 16000, "warm-up")
        agent_opts = with_deadline(agent_opts, options.cloud_deadline_s, time.monotonic() - started)
        agent = DeviceAgent(model, agent_opts, policy, cloud)
        for sample in tqdm(samples, desc="utterances (real-time pace)" if options.realtime else "utterances",
                           unit="utt", file=sys.stderr):
            audio = load_audio(sample["audio"])
            if options.realtime:
                result = play_realtime(agent, audio, sample["id"])
            else:
                result = replay(model, audio, agent_opts, policy, cloud, utterance_id=sample["id"])
            rows.append({**sample, "result": result})
            tqdm.write(f"  {sample['id']}: {result.route:8s} {1000 * result.latency:5.0f} ms  {result.intent}  "
                       f"| {result.text}", file=sys.stderr)
    return rows


def with_deadline(options: AgentOptions, deadline_s: float | None, warm_up_s: float) -> AgentOptions:
    """`options` with the offload budget `deadline_s`, or by default the agent's own or DEADLINE_MARGIN x the warm-up
    round trip, whichever is longer; says which."""
    if deadline_s is None:
        deadline_s = max(options.cloud_deadline_s, DEADLINE_MARGIN * warm_up_s)
    print(f"cloud warm-up round trip {warm_up_s:.2f} s; offload deadline {deadline_s:.2f} s", file=sys.stderr)
    return replace(options, cloud_deadline_s=deadline_s)


def pilot_brief(result) -> str:
    """'1.5s:"set my" > 2.5s:"set my alarm"' from the timeline."""
    parts = [f"{e.info.get('audio', 0):.1f}s:\"{e.info.get('text', '')}\"" for e in result.timeline.events
             if e.kind == "pilot"]
    return " > ".join(parts) or "(no pilot)"


def print_table(rows: list[dict]) -> None:
    print("\n| utterance | transcript | intent | slots | route | latency (ms) | pilots |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        r = row["result"]
        slots = ", ".join(f"{t}={v}" for t, v in r.slots) or "-"
        ok = "ok" if r.intent == row["intent"] else f"want {row['intent']}"
        print(f"| {row['id']} | {r.text} | {r.intent} ({ok}) | {slots} | {r.route} | {1000 * r.latency:.0f} | "
              f"{pilot_brief(r)} |")


def print_summary(rows: list[dict]) -> None:
    from pasu.metrics import LatencyStats, SluResult, evaluate_slu

    results = [row["result"] for row in rows]
    scores = evaluate_slu([SluResult(r["text"], r["intent"], r["slots"]) for r in rows],
                          [SluResult(r.text, r.intent, r.slots) for r in results])
    lat = LatencyStats.from_seconds([r.latency for r in results])
    routes = {k: sum(r.route == k for r in results) for k in ("local", "cloud", "fallback")}
    print(f"\nsummary: {len(rows)} utterances; intent accuracy {100 * scores.intent_accuracy:.1f}%, "
          f"WER {100 * scores.wer:.1f}%, SLU-F1 {100 * scores.slu_f1:.1f}%; routes {routes} "
          f"(offload ratio {routes['cloud'] / len(rows):.2f}); latency after end of speech mean "
          f"{1000 * lat.mean:.0f} ms, p50 {1000 * lat.p50:.0f} ms, p90 {1000 * lat.p90:.0f} ms")


def draw_timeline(rows: list[dict], path: Path) -> Path:
    """The timeline of the local utterance with the most pilots (else the first)."""
    from pasu.device.timeline import plot_timeline

    local = [row for row in rows if row["result"].route == "local"] or rows
    row = max(local, key=lambda r: r["result"].pilots)
    return plot_timeline(row["result"].timeline, path, title=row["result"].text)


def _jsonable(row: dict) -> dict:
    r = row["result"]
    return {"id": row["id"], "hard": row["hard"], "reference": {"text": row["text"], "intent": row["intent"],
                                                               "slots": [list(s) for s in row["slots"]]},
            "text": r.text, "intent": r.intent, "slots": [list(s) for s in r.slots], "route": r.route,
            "reason": r.reason, "offramp_score": r.offramp_score, "latency_ms": 1000 * r.latency, "pilots": r.pilots,
            "timeline": r.timeline.to_dict()}
