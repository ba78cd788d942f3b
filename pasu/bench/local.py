"""`pasu bench local`: latency after end of speech and accuracy of local decoding, configuration by configuration.

Every configuration replays the same utterances on the agent's virtual clock (audio due at real-time pace,
work advancing the clock by its measured compute time, see pasu.device.agent) in one process, utterance by
utterance with every configuration in turn, so the ratios between them are measured side by side. Rows:
ESPnet's own BeamSearch and BatchBeamSearch, the agent as shipped (decided stop) without and with the pause pilot
(whose latency counts from the shipped VAD's declared end, 0.6 s after the speech), our pilot-assisted decoding
with every optimization, each optimization alone (the paper's Fig. 5), the pilot interval tau and incremental
vs from-scratch pilots (Table 4), faster-whisper tiny.en (what a user would pick instead), and PocketSphinx
decoding chunk by chunk as a streaming server does (pasu.bench.sphinx), live and with its end-of-utterance
passes. With `--lm`, ESPnet's BatchBeamSearch and the shipped agent also run with the LM fused in
(`espnet_batch+lm`, `ours+lm`); with `--length-bonus B`, both also run with B added per token (ESPnet's
`penalty`; `espnet_batch+bonus`, `ours+bonus`, whose decided stop a bonus turns off; with `--lm` too,
`espnet_batch+lm+bonus` and `ours+lm+bonus`).
`--check-clock N` replays N utterances both on the virtual clock and at real-time pace and prints how far
apart the latencies are.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from pasu.device.agent import (
    AgentOptions,
    DeviceAgent,
    PilotOptions,
    espnet_search_for,
    play_realtime,
    replay,
)
from pasu.device.decoding.search import SearchOptions
from pasu.device.runtime import DeviceModel
from pasu.metrics import LatencyStats, SluResult, evaluate_slu, mean_rtf
from pasu.models.data import Utterance, dev_subset, load_split, read_audio
from pasu.settings import shipped_model

OURS = AgentOptions().final_search  # the agent's shipped final decode (device/agent.yaml): the decided stop
PLAIN = SearchOptions(beam_size=5, ctc_weight=0.3)
# every optimization at once: the pilot-following shortcuts (beam collapse, early termination, CTC leap,
# first-token rescoring) on top of the decided stop
ALL_ON = replace(OURS, beam_collapse=True, early_termination=True, ctc_leap=True, stop_when_decided=True,
                 rescore_first_tokens=5)
NO_PILOT = PilotOptions(enabled=False)


def configurations(taus: tuple[float, ...] = (2.0, 1.0, 0.5), lm_weight: float = 0.0,
                   length_bonus: float = 0.0) -> dict[str, AgentOptions]:
    """Name -> agent options, all with beam 5 and CTC weight 0.3. 'ours' is the agent's shipped decode (pilots
    every tau = 1 s, final decode with the decided stop) on the paper's schedule; 'ours_pause' adds the shipped
    pause pilot; 'ours_all' turns every optimization on. The pilot interval and from-scratch pilots (Table 4) are
    varied on 'ours_all', the decode that follows the last pilot. With `lm_weight` > 0, 'espnet_batch+lm' and
    'ours+lm' fuse the model's LM (DeviceModel.use_lm) at that weight; with `length_bonus` != 0,
    'espnet_batch+bonus' and 'ours+bonus' (and with an LM 'espnet_batch+lm+bonus', 'ours+lm+bonus') add it per
    token."""
    # Every row but 'ours_pause' ends at an oracle endpointer, as ESPnet's decoders do: they cannot start before
    # the end is declared, so a pause pilot would give ours the VAD's wait as a head start (pasu.device.agent)
    pilot = PilotOptions(interval_seconds=1.0, at_pause=False)
    configs = {
        "espnet_beam": AgentOptions(pilot=NO_PILOT, decoder="espnet_beam", final_search=PLAIN),
        "espnet_batch": AgentOptions(pilot=NO_PILOT, decoder="espnet_batch", final_search=PLAIN),
        "ours_no_pilot": AgentOptions(pilot=NO_PILOT, final_search=PLAIN),
        "ours": AgentOptions(pilot=pilot, final_search=OURS),
        "ours_pause": AgentOptions(pilot=replace(pilot, at_pause=True), final_search=OURS),
        "ours_all": AgentOptions(pilot=pilot, final_search=ALL_ON),
        "only_beam_collapse": AgentOptions(pilot=pilot, final_search=replace(PLAIN, beam_collapse=True)),
        "only_early_termination": AgentOptions(pilot=pilot, final_search=replace(PLAIN, early_termination=True)),
        "only_ctc_leap": AgentOptions(pilot=pilot, final_search=replace(PLAIN, ctc_leap=True)),
        "ours_all_non_incremental": AgentOptions(pilot=replace(pilot, incremental=False), final_search=ALL_ON),
    }
    for tau in taus:
        if tau != 1.0:
            configs[f"ours_all_tau_{tau:g}"] = AgentOptions(pilot=replace(pilot, interval_seconds=tau),
                                                            final_search=ALL_ON)
    if lm_weight:
        configs["espnet_batch+lm"] = replace(configs["espnet_batch"], final_search=replace(PLAIN, lm_weight=lm_weight))
        configs["ours+lm"] = replace(configs["ours"], final_search=replace(OURS, lm_weight=lm_weight))
    if length_bonus:
        for name in [n for n in configs if n.split("+")[0] in ("espnet_batch", "ours")]:
            search = replace(configs[name].final_search, length_bonus=length_bonus)
            configs[f"{name}+bonus"] = replace(configs[name], final_search=search)
    return configs


@dataclass(frozen=True)
class Row:
    """One configuration's figures on one model and split."""

    model: str
    split: str
    config: str
    n: int
    latency_mean_ms: float  # after end of speech
    latency_p50_ms: float
    latency_p90_ms: float
    latency_p99_ms: float
    rtf: float  # mean over utterances of latency / duration
    decode_after_eos_ms: float  # mean decode time after end of speech
    pilots_per_utt: float
    wer: float
    intent_accuracy: float | None
    slu_f1: float | None
    speedup_vs_beam: float | None = None  # espnet_beam p50 latency / this p50 latency
    speedup_vs_batch: float | None = None  # espnet_batch p50 latency / this p50 latency


def run_configs(model: DeviceModel, configs: dict[str, AgentOptions], utterances: list[Utterance],
                audio: list[np.ndarray], desc: str) -> dict[str, list[Any]]:
    """Replay every utterance under every configuration; {name: results}. Utterance by utterance, all
    configurations in turn, so that a machine whose speed drifts during a long run (other tenants, the host's
    power management) slows every configuration alike and the ratios between them stay fair."""
    searches = {name: espnet_search_for(model, options) for name, options in configs.items()}
    results: dict[str, list[Any]] = {name: [] for name in configs}
    for utt, wave in tqdm(list(zip(utterances, audio)), desc=desc, unit="utt", dynamic_ncols=True, leave=False):
        for name, options in configs.items():
            results[name].append(replay(model, wave, options, espnet_search=searches[name], utterance_id=utt.id))
    return results


def summarize(model_name: str, split: str, config: str, utterances: list[Utterance], results: list[Any]) -> Row:
    refs = [SluResult(u.text, u.intent, u.slots or ()) for u in utterances]
    scores = evaluate_slu(refs, [SluResult(r.text, r.intent, r.slots) for r in results])
    lat = LatencyStats.from_seconds([r.latency for r in results])
    return Row(model_name, split, config, len(results), 1000 * lat.mean, 1000 * lat.p50, 1000 * lat.p90,
               1000 * lat.p99, mean_rtf([r.latency for r in results], [u.duration for u in utterances]),
               1000 * float(np.mean([r.timings["decode_after_eos"] for r in results])),
               float(np.mean([r.pilots for r in results])), scores.wer, scores.intent_accuracy, scores.slu_f1)


def whisper_row(split: str, utterances: list[Utterance], audio: list[np.ndarray], threads: int) -> Row:
    """faster-whisper tiny.en (int8, beam 5) on the whole utterance after end of speech: WER only (no intents)."""
    from pasu.corpus.tts import load_whisper, word_error_rate

    whisper = load_whisper(cpu_threads=threads)
    whisper.transcribe(audio[0], language="en", beam_size=5)  # warm-up
    hyps, latencies = [], []
    for wave in tqdm(audio, desc=f"whisper {split}", unit="utt", dynamic_ncols=True, leave=False):
        started = time.perf_counter()
        segments, _ = whisper.transcribe(wave, language="en", beam_size=5, without_timestamps=True,
                                         condition_on_previous_text=False)
        hyps.append(" ".join(s.text.strip() for s in segments))
        latencies.append(time.perf_counter() - started)
    lat = LatencyStats.from_seconds(latencies)
    wer = word_error_rate([u.text for u in utterances], hyps)  # both sides normalized: Whisper writes its own way
    return Row("whisper-tiny.en", split, "faster_whisper", len(hyps), 1000 * lat.mean, 1000 * lat.p50,
               1000 * lat.p90, 1000 * lat.p99, mean_rtf(latencies, [u.duration for u in utterances]),
               1000 * lat.mean, 0.0, wer, None, None)


def sphinx_rows(language: Path, split: str, utterances: list[Utterance], audio: list[np.ndarray]) -> list[Row]:
    """PocketSphinx streaming (pasu.bench.sphinx) with the LM and dictionary in `language`, live and with its
    end-of-utterance passes: WER only."""
    from pasu.bench.sphinx import SphinxOptions, StreamingSphinx
    from pasu.corpus.tts import word_error_rate

    rows = []
    for live in (True, False):
        sphinx = StreamingSphinx(language, SphinxOptions(live=live))
        config = "pocketsphinx_live" if live else "pocketsphinx_full"
        sphinx.replay(audio[0])  # warm-up
        answers = [sphinx.replay(wave) for wave in tqdm(audio, desc=f"{config} {split}", unit="utt",
                                                         dynamic_ncols=True, leave=False)]
        latencies = [a.latency for a in answers]
        lat = LatencyStats.from_seconds(latencies)
        wer = word_error_rate([u.text for u in utterances], [a.text for a in answers])
        rows.append(Row("pocketsphinx-en-us", split, config, len(answers), 1000 * lat.mean, 1000 * lat.p50,
                        1000 * lat.p90, 1000 * lat.p99, mean_rtf(latencies, [u.duration for u in utterances]),
                        1000 * float(np.mean([a.end_of_utterance for a in answers])), 0.0, wer, None, None))
    return rows


def _extra_text(value: Any) -> str:
    """An extra figure as printed: dicts as JSON, floats to 3 decimals, the rest as they are."""
    if isinstance(value, dict):
        return json.dumps(value)
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def with_speedups(rows: list[Row]) -> list[Row]:
    base = {(r.model, r.split, r.config): r.latency_p50_ms for r in rows}
    out = []
    for r in rows:
        beam, batch = base.get((r.model, r.split, "espnet_beam")), base.get((r.model, r.split, "espnet_batch"))
        out.append(replace(r, speedup_vs_beam=beam / r.latency_p50_ms if beam else None,
                           speedup_vs_batch=batch / r.latency_p50_ms if batch else None))
    return out


def format_table(rows: list[Row]) -> str:
    head = ("model", "split", "config", "n", "mean", "p50", "p90", "p99", "RTF", "decode", "pilots", "WER",
            "IC", "SLU-F1", "x beam", "x batch")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = (r.model, r.split, r.config, r.n, f"{r.latency_mean_ms:.0f}", f"{r.latency_p50_ms:.0f}",
                 f"{r.latency_p90_ms:.0f}", f"{r.latency_p99_ms:.0f}", f"{r.rtf:.3f}", f"{r.decode_after_eos_ms:.0f}",
                 f"{r.pilots_per_utt:.1f}", f"{100 * r.wer:.1f}", _pct(r.intent_accuracy), _pct(r.slu_f1),
                 _ratio(r.speedup_vs_beam), _ratio(r.speedup_vs_batch))
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n(latencies in ms after end of speech; IC = intent accuracy, %)"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


AFTER_EOS_STAGES = ("ingest_after_eos", "pilot_after_eos", "encode_after_eos", "decode_after_eos")


def check_clock(model: DeviceModel, utterances: list[Utterance], audio: list[np.ndarray]) -> dict[str, Any]:
    """Latency of 'ours' on the virtual clock and at real-time pacing, utterance by utterance, with the mean
    time of each stage after end of speech in both (where they disagree, that stage is what the clock misses)."""
    options = configurations()["ours"]
    agent = DeviceAgent(model, options)
    virtual, real = [], []
    for utt, wave in tqdm(list(zip(utterances, audio)), desc="clock check", unit="utt", dynamic_ncols=True):
        virtual.append(replay(model, wave, options, utterance_id=utt.id))
        real.append(play_realtime(agent, wave, utt.id))
    v, r = (float(np.mean([x.latency for x in xs])) for xs in (virtual, real))
    v50, r50 = (float(np.median([x.latency for x in xs])) for xs in (virtual, real))
    # both statistics: the latency targets are medians, while the mean also weighs the slow tail
    return {"n": len(virtual), "virtual_mean_ms": 1000 * v, "realtime_mean_ms": 1000 * r,
            "virtual_p50_ms": 1000 * v50, "realtime_p50_ms": 1000 * r50,
            "relative_difference": abs(v - r) / r, "p50_relative_difference": abs(v50 - r50) / r50,
            "virtual_stages_ms": _stage_means(virtual), "realtime_stages_ms": _stage_means(real)}


def _stage_means(results: list[Any]) -> dict[str, float]:
    """Mean milliseconds per stage after end of speech; 'other' is the latency no stage accounts for."""
    means = {k: 1000 * float(np.mean([r.timings[k] for r in results])) for k in AFTER_EOS_STAGES}
    means["other"] = 1000 * float(np.mean([r.latency for r in results])) - sum(means.values())
    return {k: round(v, 2) for k, v in means.items()}


def encoder_ingestion_share(model: DeviceModel, seconds: float) -> float:
    from pasu.models.flops import ingestion_fraction

    return ingestion_fraction(model.model.encoder, seconds)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "local", help="local decoding: latency after end of speech and accuracy, ours vs ESPnet, Whisper, PocketSphinx",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: pasu bench local --corpus data/corpus-full --utterances 500 "
               "--models models/shipped/device models/shipped/baseline_branchformer --out bench/local.json")
    p.add_argument("--corpus", type=Path, required=True, help="corpus folder (test.jsonl, test_unseen.jsonl)")
    p.add_argument("--models", type=Path, nargs="+", default=[shipped_model("device")], help="model folders")
    p.add_argument("--splits", nargs="+", default=["test", "test_unseen"],
                   help="corpus manifests to replay (default: test test_unseen)")
    p.add_argument("--utterances", type=int, default=500, help="fixed random subset per split (0: all)")
    p.add_argument("--configs", nargs="+", default=None, help="subset of configurations (default: all)")
    p.add_argument("--no-whisper", action="store_true", help="skip the faster-whisper row")
    p.add_argument("--no-sphinx", action="store_true",
                   help="skip the PocketSphinx streaming rows (a trigram of the corpus's training sentences)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on 2 cores, 1 thread is faster in real time and its virtual "
                        "clock agrees better with real-time pacing; run with OMP_WAIT_POLICY=ACTIVE in the "
                        "environment for the closest agreement, see README)")
    p.add_argument("--jobs", type=int, default=1,
                   help="processes replaying (model, split) groups at once, one core each (default 1). Each "
                        "group's configurations still run side by side in one process; with 2 jobs on 2 cores the "
                        "groups share memory bandwidth, so absolute latencies read slightly higher")
    p.add_argument("--lm", type=Path, default=None,
                   help="a `pasu lm train` folder on the models' tokens: adds the espnet_batch+lm and ours+lm rows")
    p.add_argument("--lm-weight", type=float, default=0.2, help="the LM's weight with --lm (default: %(default)s)")
    p.add_argument("--length-bonus", type=float, default=0.0, metavar="B",
                   help="adds the espnet_batch+bonus and ours+bonus rows (with --lm, also +lm+bonus): B added per "
                        "token (ESPnet's `penalty`)")
    p.add_argument("--check-clock", type=int, default=0, metavar="N",
                   help="also compare virtual-clock and real-time latencies on N utterances (first model, first split)")
    p.add_argument("--out", type=Path, default=Path("bench/local.json"), help="JSON results")
    p.set_defaults(run=_run)


def replay_group(folder: Path, corpus: Path, split: str, utterances: int, config_names: list[str] | None,
                 threads: int, lm: Path | None = None, lm_weight: float = 0.0, length_bonus: float = 0.0
                 ) -> list[Row]:
    """Every configuration on one model and split in this process, interleaved utterance by utterance (so
    their ratios are measured side by side); the group's rows are printed when it is done."""
    torch.set_num_threads(threads)
    configs = configurations(lm_weight=lm_weight if lm is not None else 0.0, length_bonus=length_bonus)
    if config_names:
        configs = {k: configs[k] for k in config_names}
    model = DeviceModel.from_folder(folder)
    if lm is not None:
        from pasu.models.lm import load_lm

        model.use_lm(load_lm(lm))
    utts = dev_subset(load_split(corpus, split), utterances, seed=0)
    audio = [read_audio(u.audio) for u in utts]
    replay(model, audio[0], configs.get("ours", AgentOptions()))  # warm-up: first calls are slow
    results = run_configs(model, configs, utts, audio, f"{model.model_id} {split}")
    rows = [summarize(model.model_id, split, name, utts, results[name]) for name in configs]
    print("\n".join(format_table(with_speedups(rows)).splitlines()[2:]), flush=True)
    return rows


def _replay_groups(args: argparse.Namespace) -> list[Row]:
    """(model, split) groups, in one process or spread over `args.jobs` processes (one core each)."""
    groups = [(folder, args.corpus, split, args.utterances, args.configs, args.threads, args.lm, args.lm_weight,
               args.length_bonus) for folder in args.models for split in args.splits]
    if args.jobs <= 1:
        return [row for group in groups for row in replay_group(*group)]
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch thread pools
    with ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        return [row for rows in pool.map(replay_group, *zip(*groups)) for row in rows]


def _other_recognizers(args: argparse.Namespace) -> list[Row]:
    """faster-whisper's and PocketSphinx's rows on the same utterances per split, unless skipped."""
    import tempfile

    from pasu.bench.sphinx import write_language_files
    from pasu.models.ngram_lm import training_sentences

    rows: list[Row] = []
    if args.no_whisper and args.no_sphinx:
        return rows
    with tempfile.TemporaryDirectory() as folder:
        language = Path(folder)
        if not args.no_sphinx:  # one LM and dictionary for every split and mode
            write_language_files(training_sentences(args.corpus), language)
        for split in args.splits:
            utterances = dev_subset(load_split(args.corpus, split), args.utterances, seed=0)
            audio = [read_audio(u.audio) for u in utterances]
            if not args.no_whisper:
                rows.append(whisper_row(split, utterances, audio, args.threads))
            if not args.no_sphinx:
                rows.extend(sphinx_rows(language, split, utterances, audio))
    return rows


def _run(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    extra: dict[str, Any] = {"torch_threads": args.threads, "jobs": args.jobs,
                             "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset: libgomp's default)")}
    rows = _replay_groups(args)
    # alone on the machine from here on: the clock check paces audio in real time, Whisper uses every thread
    for folder in args.models:
        model = DeviceModel.from_folder(folder)
        extra[f"{model.model_id}_ingestion_flops_share_3s"] = encoder_ingestion_share(model, 3.0)
        if args.check_clock and folder == args.models[0]:  # one check: the clock is the same for every model
            utterances = dev_subset(load_split(args.corpus, args.splits[0]), args.utterances, seed=0)
            utterances = utterances[: args.check_clock]
            extra[f"{model.model_id}_clock_check"] = check_clock(model, utterances,
                                                                 [read_audio(u.audio) for u in utterances])
    rows = with_speedups(rows + _other_recognizers(args))
    print(format_table(rows))
    for key, value in extra.items():
        print(f"{key}: {_extra_text(value)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": [asdict(r) for r in rows], **extra}, indent=1))
    print(f"wrote {args.out}")
    return 0
