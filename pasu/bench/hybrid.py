"""`pasu bench hybrid`: offloading policies on a real cloud server behind emulated networks (Fig. 4, Table 5).

The device model replays the test utterances on the agent's virtual clock once (cached next to the results).
A real gRPC cloud server (`ServerThread`) hosts the cloud model on loopback; every utterance is then offloaded
once per network profile through `pasu.netproxy.NetworkProxy`, a user-space TCP proxy that delays, rate-limits
and loses segments (tc netem needs root and the sch_netem module, which this project's machines lack).
Policies are priced from these measurements (see pasu.bench.hybrid_eval), decided by the agent's own policy
objects with the offramp thresholds `pasu offramp train` calibrated on dev. The round trips are saved beside the
results, and `--reuse-offloads` prices another offramp folder on them without a server.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pasu.bench.hybrid_eval import (
    CloudCall,
    EitherScorer,
    Outcome,
    Scorer,
    combine,
    decide,
    design_scores,
    edit_totals,
    intent_right,
    measure_cloud,
    naive_expected,
    ppl_scorer,
    word_scorer,
    run_policy,
    table5,
    target_checks,
)
from pasu.bench.hybrid_report import checks_text, designs_table, intervals_text, plot_fig4, plot_fig6, table5_block
from pasu.bench.intervals import ResampleOptions, gap_interval, table5_intervals
from pasu.files import write_text_atomic
from pasu.device.cli import add_replay_flags

if TYPE_CHECKING:
    from pasu.device.offramp_train import TrainedOfframps
    from pasu.device.routing import Offramp

log = logging.getLogger(__name__)

EMULATION = "user-space TCP delay/loss/bandwidth proxy (pasu.netproxy); tc netem is not available here"


def register(benches: argparse._SubParsersAction) -> None:
    parser = benches.add_parser(
        "hybrid", help="offloading policies vs network: offload ratio, accuracy, latency (Fig. 4, Table 5)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: pasu bench hybrid models/device --cloud-model models/cloud --utterances 60")
    parser.add_argument("model", type=Path, help="packaged device model folder, with offramp/ from `pasu offramp train`")
    parser.add_argument("--cloud-model", type=Path, help="model folder the cloud server hosts (default: the device model)")
    parser.add_argument("--offramp", type=Path, help="offramp folder (default: MODEL/offramp)")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-full"), help="corpus folder")
    parser.add_argument("--split", default="test", help="manifest to evaluate on (default: test)")
    # 300: on 150, the intent and Table 5 checks turned on one to three answers from run to run
    parser.add_argument("--utterances", type=int, default=300, help="a fixed random subset of this many (0: all)")
    parser.add_argument("--profiles", default="wifi,5g,poor", help="network profiles of pasu.netproxy, comma-separated")
    parser.add_argument("--deadline", type=float, default=2.0, help="cloud deadline per utterance (s), as the agent's")
    parser.add_argument("--encoding", default="pcm16",
                        help="upload encoding (pcm16, float32, flac, opus) for every profile, or per profile: poor=opus,wifi=pcm16 "
                             "(unnamed profiles: pcm16)")
    add_replay_flags(parser, ", as `pasu device run --lm` does; the pilots the offramps read do not change")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the machine may be shared)")
    parser.add_argument("--seed", type=int, default=0, help="network jitter/loss seed")
    parser.add_argument("--resamples", type=int, default=ResampleOptions.draws,
                        help="bootstrap resamples of the utterances for the intervals of Table 5's ratios and "
                             "Offload-M's intent gap (0: none)")
    parser.add_argument("--out", type=Path, default=Path("bench/hybrid"), help="folder for JSON, PNGs, caches")
    parser.add_argument("--reuse-offloads", action="store_true",
                        help="price the policies on the round trips an earlier run saved in --out (calls-PROFILE.jsonl) "
                             "for the same cloud model, utterances, encoding, deadline and seed, instead of offloading "
                             "again: other offramps priced on the same cloud answers and latencies, in minutes")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pasu.device.cli import replay_options
    from pasu.device.held_out_reader import model_reader_learned
    from pasu.device.offramp_cli import collect_split
    from pasu.device.offramp_train import OFFRAMP_DIR, intent_offramp, load_device_model, load_offramps
    from pasu.models.data import dev_subset, load_split

    logging.getLogger("espnet").setLevel(logging.WARNING)  # its beam search logs every hypothesis at INFO
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    cloud_model = args.cloud_model or args.model
    if args.cloud_model is None:
        print(f"note: no --cloud-model; the cloud hosts the device model ({args.model})", file=sys.stderr)
    offramp_folder = args.offramp or args.model / OFFRAMP_DIR
    offramps = load_offramps(offramp_folder)
    report = offramps.report
    model = load_device_model(args.model, offramp_folder)  # answers as the agent does, with the intent reader
    options = replay_options(model, args)
    intent = intent_offramp(model, offramp_folder, offramps.intent) if "intent" in report else None
    learned = model_reader_learned(model, args.corpus, args.split)
    if learned:  # its answers and the intent check would read sentences the reader knows
        print(f"warning: the intent reader learned the sentences of {args.split} (pasu offramp train "
              "--reader-learns-split): its intents and the intent check are optimistic there; bench on test",
              file=sys.stderr)
    utterances = dev_subset(load_split(args.corpus, args.split), args.utterances)
    samples = collect_split(model, args.corpus, args.split, utterances, args.out / f"replays-{args.split}.jsonl",
                            options, args.jobs)
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    encodings = upload_encodings(args.encoding, profiles)
    calls, proxies = measured_offloads(cloud_model, utterances, samples, encodings, args.deadline, args.seed, args.out,
                                       reuse=args.reuse_offloads)
    results = {"device_model": str(args.model), "cloud_model": str(cloud_model), "offramps": str(offramp_folder),
               "bilstm_label": learned_label(report["bilstm"]["train"]), "split": args.split,
               "lm": options.lm, "lm_weight": options.final_search.lm_weight, "pilots": options.pilot.schedule(),
               "utterances": len(samples), "intent_reader_learned_split": learned, "network_emulation": EMULATION,
               "profiles": {}}
    print(f"pasu bench hybrid: {len(samples)} {args.split} utterances; device {args.model}; cloud {cloud_model}")
    print(f"network emulation: {EMULATION}")
    print(f"offramps: {offramp_folder}; the BiLSTM learned {results['bilstm_label']}")
    if options.lm:
        print(f"LM {options.lm} fused into the final local decode at weight {options.final_search.lm_weight}")
    print(f"pilots: {options.pilot.describe()}")
    for profile in profiles:
        result = evaluate_profile(samples, calls[profile], offramps, intent, ResampleOptions(draws=args.resamples))
        result["proxy"] = proxies[profile]
        results["profiles"][profile] = result
        print_profile(profile, result)
        designs, naive = [Outcome(**o) for o in result["designs"]], [Outcome(**o) for o in result["naive_line"]]
        title = f"{args.split}, {len(samples)} utterances, network {profile}"
        plot_fig4(designs, naive, args.out / f"fig4-{profile}.png", title)
        plot_fig6(designs, naive, args.out / f"fig6-{profile}.png", title)
    path = args.out / "hybrid.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"wrote {path} and {', '.join(f'fig4-{p}.png, fig6-{p}.png' for p in profiles)} in {args.out}")
    return 0


def learned_label(train: dict[str, Any]) -> str:
    """What an offramp report's BiLSTM was fitted to predict, in words."""
    from pasu.device.offramp_data import BAD_WER

    if train.get("label", "bad") == "wer":  # reports from before the label was an option learned the bar
        return "the local WER (soft labels)"
    return f"local WER > {train.get('bad_wer', BAD_WER):g}"


def upload_encodings(spec: str, profiles: list[str]) -> dict[str, str]:
    """{profile: encoding} from "opus" (every profile) or "poor=opus,5g=flac" (the rest: pcm16)."""
    from typing import get_args

    from pasu.device.cloud_client import Encoding

    choices = get_args(Encoding)
    if "=" not in spec:
        pairs = {p: spec.strip() for p in profiles}
    else:
        pairs = {p: "pcm16" for p in profiles}
        for item in filter(None, (x.strip() for x in spec.split(","))):
            profile, _, encoding = item.partition("=")
            if profile.strip() not in profiles:
                raise SystemExit(f"--encoding names profile {profile.strip()!r}, not one of --profiles {','.join(profiles)}")
            pairs[profile.strip()] = encoding.strip()
    for encoding in pairs.values():
        if encoding not in choices:
            raise SystemExit(f"--encoding: {encoding!r} is not one of {', '.join(choices)}")
    return pairs


def measured_offloads(cloud_model: Path, utterances: list, samples: list, encodings: dict[str, str], deadline: float,
                      seed: int, out: Path, reuse: bool = False
                      ) -> tuple[dict[str, list[CloudCall]], dict[str, dict[str, Any]]]:
    """Each profile's round trips, saved in `out`; `reuse`: those an earlier run saved there where they match,
    the rest offloaded now."""
    keys = {p: offload_key(cloud_model, samples, p, e, deadline, seed) for p, e in encodings.items()}
    paths = {p: out / f"calls-{p}.jsonl" for p in encodings}
    saved = {p: load_offloads(paths[p], keys[p]) for p in encodings} if reuse else {}
    missing = {p: e for p, e in encodings.items() if saved.get(p) is None}
    if reuse and missing:
        print(f"note: no saved offloads in {out} match for {', '.join(missing)}; offloading", file=sys.stderr)
    calls, proxies = offload_all(cloud_model, utterances, samples, missing, deadline, seed)
    for profile in missing:
        save_offloads(paths[profile], keys[profile], proxies[profile], calls[profile])
    for profile, (proxy, earlier) in ((p, s) for p, s in saved.items() if s is not None):
        calls[profile], proxies[profile] = earlier, {**proxy, "reused": str(paths[profile])}
    return calls, proxies


def offload_key(cloud_model: Path, samples: list, profile: str, encoding: str, deadline: float,
                seed: int) -> dict[str, Any]:
    """What makes two runs' offloads interchangeable."""
    return {"cloud_model": str(cloud_model.resolve()), "ids": [s.id for s in samples], "profile": profile,
            "encoding": encoding, "deadline": deadline, "seed": seed}


def save_offloads(path: Path, key: dict[str, Any], proxy: dict[str, Any], calls: list[CloudCall]) -> None:
    """JSONL: a header with the key and the proxy's settings and counters, then one round trip per utterance."""
    lines = [json.dumps({"key": key, "proxy": proxy})] + [json.dumps(asdict(c)) for c in calls]
    write_text_atomic(path, "\n".join(lines) + "\n")


def load_offloads(path: Path, key: dict[str, Any]) -> tuple[dict[str, Any], list[CloudCall]] | None:
    """The proxy record and round trips `save_offloads` wrote for `key`; None when there are none for it."""
    if not path.is_file():
        return None
    head, calls = _read_offloads(path)
    if head.get("key") != key:
        return None
    return head["proxy"], calls


def saved_offloads(path: Path) -> tuple[list[str], list[CloudCall]]:
    """Whatever round trips `save_offloads` wrote in `path`, with the utterance ids they were saved for (the
    offline checks that read a run's answers, whatever its settings)."""
    head, calls = _read_offloads(path)
    return head["key"]["ids"], calls


def _read_offloads(path: Path) -> tuple[dict[str, Any], list[CloudCall]]:
    header, *rows = path.read_text().splitlines()
    return json.loads(header), [_call(json.loads(row)) for row in rows if row.strip()]


def _call(raw: dict[str, Any]) -> CloudCall:
    from pasu.device.offramp_data import slu_from_dict

    result = raw["result"]
    return CloudCall(raw["ok"], raw["latency"], slu_from_dict(result) if result else None, raw["fallback"])


def offload_all(cloud_model: Path, utterances: list, samples: list, encodings: dict[str, str], deadline: float,
                seed: int) -> tuple[dict[str, list[CloudCall]], dict[str, dict[str, Any]]]:
    """Every utterance offloaded once per profile ({profile: upload encoding}) to a real server on loopback,
    through the network proxy; no server is started when `encodings` is empty."""
    if not encodings:
        return {}, {}
    from pasu.cloud.config import ServerConfig
    from pasu.cloud.server import ServerThread
    from pasu.device.audio import SAMPLE_RATE
    from pasu.device.cloud_client import CloudClient
    from pasu.device.offramp_cli import progress_printer
    from pasu.models.data import read_audio
    from pasu.models.recognizer import load_recognizer
    from pasu.netproxy import NetworkProxy

    audio = {u.id: read_audio(u.audio) for u in utterances}
    calls, proxies = {}, {}
    with ServerThread(load_recognizer(cloud_model), ServerConfig(port=0, metrics_port=None)) as server:
        for profile, encoding in encodings.items():
            with NetworkProxy(f"127.0.0.1:{server.port}", profile, seed=seed) as proxy, \
                    CloudClient(proxy.address, deadline_s=deadline, encoding=encoding) as client:
                first = samples[0]  # warm-up: the agent's channel is set up once, not per utterance
                client.understand(audio[first.id], SAMPLE_RATE, first.id)
                understand = lambda s: client.understand(audio[s.id], SAMPLE_RATE, s.id)
                calls[profile] = measure_cloud(understand, samples, progress_printer(f"cloud via {profile}"))
                proxies[profile] = {**asdict(proxy.profile), "stats": asdict(proxy.stats), "encoding": encoding}
    return calls, proxies


def evaluate_profile(samples: list, calls: list[CloudCall], offramps: TrainedOfframps,
                     intent: Offramp | None = None, resampling: ResampleOptions | None = None) -> dict[str, Any]:
    """Every design's outcome, the NaiveHybrid line, Table 5 and the target checks on one network, for the
    offramps of a model (`load_offramps`; the CNN priced where the report calibrated it) and its intent check;
    with `resampling`, the bootstrap intervals of Table 5's ratios and of Offload-M's intent gap."""
    from pasu.device.offramp_data import BAD_WER
    from pasu.device.offramp_train import threshold, yardsticks
    from pasu.device.routing import AllOffload, OnDevice, PerplexityOfframp

    bilstm, cnn, report = offramps.bilstm, offramps.cnn, offramps.report
    on_device = run_policy(OnDevice(name="Ours-NoOffload"), samples, calls)
    all_offload = run_policy(AllOffload(), samples, calls)
    designs = [on_device, all_offload]
    late_bilstm = word_scorer("Late-BiLSTM", offramps.late_network(), "final")
    scorers = {"ppl": ppl_scorer("Ours-PPL", "pilot"), "bilstm": Scorer("Ours-BiLSTM", bilstm)}
    if offramps.bilstm_end is not None and "ppl_end" in report and all(s.end_decision_at is not None for s in samples):
        scorers["ppl_end"] = ppl_scorer("End-PPL", "end")  # folders and replays from before stop 68 have none
        scorers["bilstm_end"] = word_scorer("End-BiLSTM", offramps.bilstm_end, "end")
    scorers["ppl_late"] = ppl_scorer("Late-PPL", "final")
    if "bilstm_late" in report:  # calibrations from before stop 64 have none: then Table 5 alone prices it
        scorers["bilstm_late"] = late_bilstm
    if cnn is not None and "cnn" in report:
        scorers["cnn"] = Scorer("Ours-CNN", cnn)
    if intent is not None:  # P(intent wrong) as it is, as the agent's policies take it (routing.intent_policy)
        scorers["intent"] = Scorer("Ours-Intent", intent, weighing="none")
        for words in ("ppl", "bilstm"):
            key = f"{words}_intent"
            if key in report:  # offramp.json files from before the combined checks have none
                scales = report[key]["scales"]
                parts = ((scorers[words], scales[words]), (scorers["intent"], scales["intent"]))
                scorers[key] = EitherScorer(f"{scorers[words].name}+Intent", parts)
    offload_m: dict[str, np.ndarray] = {}  # what each design offloads at Offload-M, for its intent interval
    for level in ("L", "M", "H"):
        for key, scorer in scorers.items():
            t = threshold(report, key, level)
            policy = replace(scorer, name=f"{scorer.name}-{level}").policy(t)
            offload, cost = decide(policy, samples)
            designs.append(combine(policy.name, samples, calls, offload, policy.judges, cost, t))
            if level == "M":
                offload_m[policy.name] = offload
    edits = edit_totals(samples, calls)
    totals = tuple(x.sum() for x in edits)
    naive_line = [naive_expected(p, on_device, all_offload, totals) for p in np.linspace(0, 1, 11)]
    scorers = [*scorers.values(), *([] if "bilstm_late" in scorers else [late_bilstm]),
               # the paper's per-hypothesis scores, to show what weighing by length changes
               Scorer("Ours-PPL per token", PerplexityOfframp(), weighing="none"),
               Scorer("Ours-BiLSTM per token", bilstm, weighing="none")]
    scores = {scorer.name: design_scores(samples, scorer) for scorer in scorers}
    t5 = table5(samples, calls, scorers, on_device, all_offload, scores=scores)
    checks = target_checks(t5, {o.design: o for o in designs}, all_offload)
    bar = report["bilstm"]["train"].get("bad_wer", BAD_WER)  # reports written before the bar was an option: 0.1
    intervals = (resampled(samples, calls, scores, offload_m, resampling)
                 if resampling is not None and resampling.draws > 0 else None)
    return {"designs": [asdict(o) for o in designs], "naive_line": [asdict(o) for o in naive_line],
            "table5": {t: {d: asdict(o) if o else None for d, o in row.items()} for t, row in t5.items()},
            "yardsticks": {"bad_wer": bar, **yardsticks(samples, edits[1], bar)},
            "intervals": intervals,
            "checks": [{"check": c, "ok": ok} for c, ok in checks],
            "cloud_failures": sum(not c.ok for c in calls),
            "cloud_latency": {"mean": float(np.mean([c.latency for c in calls])),
                              "p90": float(np.percentile([c.latency for c in calls], 90))}}


def resampled(samples: list, calls: list[CloudCall], scores: dict[str, np.ndarray],
              offload_m: dict[str, np.ndarray], options: ResampleOptions) -> dict[str, Any]:
    """The bootstrap intervals (pasu.bench.intervals) of each offramp's Table 5 ratios (the paper's per-token
    scores aside) and of its intent gap to AllOffload at Offload-M."""
    weighed = {name: s for name, s in scores.items() if "per token" not in name}
    ratios = table5_intervals(weighed, *edit_totals(samples, calls), options)
    everything = intent_right(samples, calls, np.ones(len(samples), dtype=bool))
    gaps = {name: gap_interval(intent_right(samples, calls, offload), everything, options)
            for name, offload in offload_m.items()}
    return {"draws": options.draws, "level": options.level, "seed": options.seed,
            "table5": {name: [asdict(i) for i in row] for name, row in ratios.items()},
            "offload_m_intent": {name: asdict(i) for name, i in gaps.items()}}


def print_profile(profile: str, result: dict[str, Any]) -> None:
    cloud = result["cloud_latency"]
    print(f"\n=== network {profile} ({result['proxy']['encoding']} upload): cloud round trip mean {1000 * cloud['mean']:.0f} ms, "
          f"p90 {1000 * cloud['p90']:.0f} ms, {result['cloud_failures']} failed ===")
    if "reused" in result["proxy"]:
        print(f"(round trips measured by an earlier run: {result['proxy']['reused']})")
    print("Fig. 4 (designs; Ours-*-L/M/H thresholds calibrated on dev for 25/47/63% offload; Fig. 6: the share "
          "offloaded of the target utterances, local WER > 0.1, and of the others):")
    print(designs_table([Outcome(**o) for o in result["designs"]]))
    print("\nTable 5 (least offloading meeting each WER target; thresholds and alpha tuned on these utterances; "
          "NaiveHybrid in expectation over its draws):")
    print(table5_block(result))
    if result.get("intervals"):  # runs before stop 69, and --resamples 0, have none
        print("\n" + intervals_text(result))
    print("\nTargets:")
    print(checks_text([(c["check"], c["ok"]) for c in result["checks"]]))

