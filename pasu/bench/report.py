"""`pasu bench report`: the benchmarks' JSON results as paper-style tables, PNG plots and one Markdown summary.

Reads whichever results exist (`pasu bench local`, `pasu bench hybrid`, `pasu bench load`, each at its default
output path unless given), and writes into the output folder:
    report.md                  every table, with the figures embedded
    local_latency_accuracy.png latency after end of speech vs WER, every configuration (Fig. 5's axes)
    ablation.png               median latency of each optimization alone and all together (Fig. 5)
    tau_sweep.png              pilot interval and incremental vs from-scratch pilots (Table 4)
    offload_<profile>.png      latency vs accuracy of every hybrid design on that network (Fig. 4)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pasu.bench.figures import pyplot, save_figure
from pasu.bench.local import Row, format_table

ABLATION = ("espnet_beam", "espnet_batch", "ours_no_pilot", "only_beam_collapse", "only_early_termination",
            "only_ctc_leap", "ours", "ours_all")  # "ours": the decided stop alone, as shipped
# Table 4 on the decode that follows the last pilot (every optimization on)
TAU_SWEEP = ("ours_all_tau_2", "ours_all", "ours_all_tau_0.5", "ours_all_non_incremental")
TAU_LABELS = {"ours_all_tau_2": "tau 2 s", "ours_all": "tau 1 s", "ours_all_tau_0.5": "tau 0.5 s",
              "ours_all_non_incremental": "tau 1 s, from scratch"}


@dataclass(frozen=True)
class ReportInputs:
    local: Path | None  # `pasu bench local` JSON
    hybrid: Path | None  # `pasu bench hybrid` hybrid.json
    load: Path | None  # `pasu bench load` JSON


def write_report(inputs: ReportInputs, out_dir: Path) -> Path:
    """Write report.md and the PNGs; returns report.md's path. Missing inputs are named, not fatal."""
    out_dir.mkdir(parents=True, exist_ok=True)
    sections = ["# PASU benchmark report", ""]
    for name, path, section in (("local", inputs.local, _local_section), ("hybrid", inputs.hybrid, _hybrid_section),
                                ("load", inputs.load, _load_section)):
        if path is None or not path.exists():
            sections += [f"## {name}", "", f"(no results: run `pasu bench {name}` first)", ""]
            continue
        sections += section(json.loads(path.read_text()), out_dir, path)
    report = out_dir / "report.md"
    report.write_text("\n".join(sections))
    return report


# --- pasu bench local ----------------------------------------------------------------------------------


def _local_section(data: dict[str, Any], out_dir: Path, source: Path) -> list[str]:
    rows = [Row(**r) for r in data["rows"]]
    lines = ["## Local decoding (`pasu bench local`)", "", f"Source: `{source}`.", "", format_table(rows), ""]
    lines += ["### Ablation (Fig. 5): median latency after end of speech, ms", "", *_ablation_table(rows), ""]
    lines += ["### Pilot interval and incremental pilots (Table 4)", "", *_tau_table(rows), ""]
    extras = {k: v for k, v in data.items() if k != "rows"}
    if extras:
        lines += ["### Other figures", ""] + [f"- {k}: {json.dumps(v)}" for k, v in extras.items()] + [""]
    for name, plot in (("local_latency_accuracy.png", plot_latency_accuracy), ("ablation.png", plot_ablation),
                       ("tau_sweep.png", plot_tau_sweep)):
        plot(rows, out_dir / name)
        lines += [f"![{name}]({name})", ""]
    return lines


def _groups(rows: Sequence[Row]) -> dict[tuple[str, str], dict[str, Row]]:
    """(model, split) -> config -> row."""
    groups: dict[tuple[str, str], dict[str, Row]] = {}
    for r in rows:
        groups.setdefault((r.model, r.split), {})[r.config] = r
    return groups


def _ablation_table(rows: Sequence[Row]) -> list[str]:
    groups = {k: v for k, v in _groups(rows).items() if any(c in v for c in ABLATION)}
    head = ["model / split", *ABLATION]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (model, split), by_config in groups.items():
        cells = [f"{by_config[c].latency_p50_ms:.0f}" if c in by_config else "-" for c in ABLATION]
        lines.append(f"| {model} / {split} | " + " | ".join(cells) + " |")
    return lines


def _tau_table(rows: Sequence[Row]) -> list[str]:
    lines = ["| model / split | pilots | p50 ms | mean ms | WER % | IC % |", "|---|---|---|---|---|---|"]
    for (model, split), by_config in _groups(rows).items():
        for config in TAU_SWEEP:
            if (r := by_config.get(config)) is not None:
                lines.append(f"| {model} / {split} | {TAU_LABELS[config]} ({r.pilots_per_utt:.1f}/utt) | "
                             f"{r.latency_p50_ms:.0f} | {r.latency_mean_ms:.0f} | {100 * r.wer:.1f} | "
                             f"{'-' if r.intent_accuracy is None else f'{100 * r.intent_accuracy:.1f}'} |")
    return lines


def plot_latency_accuracy(rows: Sequence[Row], path: Path) -> Path:
    plt = pyplot()
    groups = _groups(rows)
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4.2), squeeze=False)
    for ax, ((model, split), by_config) in zip(axes[0], groups.items()):
        for config, r in by_config.items():
            ax.scatter(r.latency_p50_ms, 100 * r.wer, s=36, marker="*" if config == "ours" else "o")
            ax.annotate(config, (r.latency_p50_ms, 100 * r.wer), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
        ax.set_xscale("log")
        ax.set_xlabel("median latency after end of speech (ms, log)")
        ax.set_ylabel("WER (%)")
        ax.set_title(f"{model}, {split}", fontsize=10)
        ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_ablation(rows: Sequence[Row], path: Path) -> Path:
    plt = pyplot()
    groups = {k: v for k, v in _groups(rows).items() if any(c in v for c in ABLATION)}
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(ABLATION) * max(len(groups), 1) ** 0.5), 4.2))
    width = 0.8 / max(len(groups), 1)
    for i, ((model, split), by_config) in enumerate(groups.items()):
        xs = [k + i * width for k, c in enumerate(ABLATION) if c in by_config]
        ax.bar(xs, [by_config[c].latency_p50_ms for c in ABLATION if c in by_config], width,
               label=f"{model} / {split}")
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(ABLATION))], ABLATION, rotation=25, ha="right",
                  fontsize=8)
    ax.set_ylabel("median latency after end of speech (ms)")
    ax.set_title("Each optimization alone and all together (Fig. 5)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def plot_tau_sweep(rows: Sequence[Row], path: Path) -> Path:
    plt = pyplot()
    fig, (lat_ax, wer_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for (model, split), by_config in _groups(rows).items():
        configs = [c for c in TAU_SWEEP if c in by_config]
        if not configs:
            continue
        labels = [TAU_LABELS[c] for c in configs]
        lat_ax.plot(labels, [by_config[c].latency_p50_ms for c in configs], marker="o", label=f"{model} / {split}")
        wer_ax.plot(labels, [100 * by_config[c].wer for c in configs], marker="o", label=f"{model} / {split}")
    lat_ax.set_ylabel("median latency after end of speech (ms)")
    wer_ax.set_ylabel("WER (%)")
    for ax in (lat_ax, wer_ax):
        ax.tick_params(axis="x", labelsize=8, rotation=15)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Pilot interval and incremental pilots (Table 4)", fontsize=10)
    return save_figure(fig, path)


# --- pasu bench hybrid ---------------------------------------------------------------------------------


def _hybrid_section(data: dict[str, Any], out_dir: Path, source: Path) -> list[str]:
    from pasu.bench.hybrid_eval import Outcome
    from pasu.bench.hybrid_report import checks_text, designs_table, plot_fig4, plot_fig6, table5_block

    lines = ["## Hybrid offloading (`pasu bench hybrid`)", "",
             f"Source: `{source}`. Device model `{data['device_model']}`, cloud model `{data['cloud_model']}`, "
             f"{data['utterances']} {data['split']} utterances; network emulation: {data['network_emulation']}.", ""]
    for profile, result in data["profiles"].items():
        designs = [Outcome(**o) for o in result["designs"]]
        naive = [Outcome(**o) for o in result["naive_line"]]
        name = f"offload_{profile}.png"
        title = f"{data['split']}, {data['utterances']} utterances, {profile}"
        plot_fig4(designs, naive, out_dir / name, title)
        upload = result.get("proxy", {}).get("encoding", "pcm16")  # runs before uploads could be compressed: pcm16
        cloud = result["cloud_latency"]
        lines += [f"### Network {profile} (Fig. 4)", "",
                  f"Uploads as {upload}; cloud round trip mean {1000 * cloud['mean']:.0f} ms, p90 "
                  f"{1000 * cloud['p90']:.0f} ms; {result['cloud_failures']} of {data['utterances']} calls failed.", "",
                  "```", designs_table(designs), "```", "",
                  "Table 5:", "", "```", table5_block(result), "```", "", "Targets:", "", "```",
                  checks_text([(c["check"], c["ok"]) for c in result["checks"]]), "```", "", f"![{name}]({name})", ""]
        if any(o.target_offloaded is not None for o in designs):  # runs from before Fig. 6 did not record it
            selectivity = f"selectivity_{profile}.png"
            plot_fig6(designs, naive, out_dir / selectivity, title)
            lines += ["Fig. 6, the share offloaded of the utterances the device gets wrong and of the others:", "",
                      f"![{selectivity}]({selectivity})", ""]
    return lines


# --- pasu bench load -----------------------------------------------------------------------------------


def _load_section(data: dict[str, Any], out_dir: Path, source: Path) -> list[str]:
    from pasu.bench.load_report import format_table as load_table

    return ["## Cloud server under load (`pasu bench load`)", "", f"Source: `{source}`.", "", "```",
            load_table(data), "```", ""]


# --- CLI -----------------------------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="turn benchmark JSON into paper-style tables, PNG plots and a Markdown summary",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: pasu bench report --out bench/report   # after pasu bench local / hybrid / load")
    p.add_argument("--local", type=Path, default=Path("bench/local.json"), help="pasu bench local's JSON")
    p.add_argument("--hybrid", type=Path, default=Path("bench/hybrid/hybrid.json"), help="pasu bench hybrid's JSON")
    p.add_argument("--load", type=Path, default=Path("bench/load.json"), help="pasu bench load's JSON")
    p.add_argument("--out", type=Path, default=Path("bench/report"), help="output folder")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    report = write_report(ReportInputs(args.local, args.hybrid, args.load), args.out)
    print(f"wrote {report} and its figures in {args.out}")
    return 0
