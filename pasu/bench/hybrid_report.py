"""What `pasu bench hybrid` prints and draws: Fig. 4 as a table and a plot per network, Table 5, the targets, and
Fig. 6 (how selectively each design offloads) as a plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pasu.bench.figures import pyplot, save_figure
from pasu.bench.hybrid_eval import INTENT_SLACK, OFFLOAD_BAR, Outcome


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def designs_table(outcomes: Sequence[Outcome]) -> str:
    """Fig. 4 as numbers: accuracy and latency of every design."""
    head = f"{'design':<24}{'offload%':>9}{'WER%':>7}{'IC%':>7}{'SLU-F1%':>8}{'mean ms':>9}{'p50 ms':>8}" \
           f"{'p90 ms':>8}{'RTF':>7}{'fallbk':>7}{'tgt off%':>9}{'other off%':>11}"
    lines = [head, "-" * len(head)]
    for o in outcomes:
        lines.append(f"{o.design:<24}{_pct(o.offload_ratio):>9}{_pct(o.wer):>7}{_pct(o.intent_accuracy):>7}"
                     f"{_pct(o.slu_f1):>8}{_ms(o.mean_latency):>9}{_ms(o.p50):>8}{_ms(o.p90):>8}"
                     f"{o.mean_rtf:>7.3f}{o.fallbacks:>7}{_pct(o.target_offloaded):>9}{_pct(o.other_offloaded):>11}")
    return "\n".join(lines)


def table5_text(table: dict[str, dict[str, Outcome | None]]) -> str:
    """Table 5: per WER target, the offload ratio and mean latency (RTF) each design needs."""
    if not table:
        return "(no WER target: the cloud is not more accurate than the device on these utterances)"
    designs = list(next(iter(table.values())))
    head = f"{'design':<24}" + "".join(f"{'WER<=' + t:>28}" for t in table)
    sub = f"{'':<24}" + "".join(f"{'offload%  mean ms    RTF':>28}" for _ in table)
    lines = [head, sub, "-" * len(head)]
    for d in designs:
        cells = []
        for row in table.values():
            o = row[d]
            cells.append(f"{'unreachable':>28}" if o is None else
                         f"{_pct(o.offload_ratio):>12}{_ms(o.mean_latency):>9}{o.mean_rtf:>7.3f}")
        lines.append(f"{d:<24}" + "".join(cells))
    return "\n".join(lines)


def table5_block(result: dict) -> str:
    """Table 5 of one network's result in hybrid.json, with its yardsticks (runs before them have none)."""
    table = {t: {d: Outcome(**o) if o else None for d, o in row.items()} for t, row in result["table5"].items()}
    sticks = result.get("yardsticks")
    return table5_text(table) + ("\n" + yardsticks_text(sticks) if sticks else "")


def yardsticks_text(sticks: dict) -> str:
    """Table 5's yardsticks: the offload% that rankings no offramp has need for each WER target."""
    names = {"NaiveHybrid": "NaiveHybrid (random)",
             "length": "speech length alone",  # what weighing by length gives before any offramp
             "label_oracle": f"oracle of WER>{sticks['bad_wer']:g}",  # the BiLSTM's label, known, weighed by length
             "edits_oracle": "oracle of device edits",  # knows the device's word edits, not the cloud's
             "gain_oracle": "oracle of the gain"}  # knows both answers' word edits
    lines = [f"{'  yardsticks, offload%:':<24}" + "".join(f"{'WER<=' + t:>28}" for t in sticks["NaiveHybrid"])]
    for key, name in ((k, n) for k, n in names.items() if k in sticks):  # runs before a yardstick lack it
        lines.append(f"  {name:<22}" + "".join(f"{_pct(r):>12}{'':>16}" for r in sticks[key].values()))
    return "\n".join(lines)


def intervals_text(result: dict) -> str:
    """The bootstrap intervals of one network's result in hybrid.json: Table 5's ratios to NaiveHybrid and the
    Offload-M intent gaps, each with the share of resamples that met its bar."""
    spans = result["intervals"]
    draws, level = spans["draws"], spans["level"]
    table = result["table5"]
    lines = [f"Table 5 as x NaiveHybrid's offload: measured [{level:.0%} interval over {draws} bootstrap resamples "
             f"of the utterances] and the share of resamples at or under {OFFLOAD_BAR}x:",
             f"{'design':<24}" + "".join(f"{'WER<=' + t:>24}" for t in table)]
    for design, row in spans["table5"].items():
        cells = []
        for target, span in zip(table.values(), row):
            ours, naive = target.get(design), target.get("NaiveHybrid")
            point = "-" if not (ours and naive and naive["offload_ratio"]) else \
                f"{ours['offload_ratio'] / naive['offload_ratio']:.2f}"
            cells.append(f"{point:>6} [{_ratio(span['low'])}-{_ratio(span['high'])}]{span['meeting']:>5.0%}")
        lines.append(f"{design:<24}" + "".join(f"{c:>24}" for c in cells))
    designs = {o["design"]: o for o in result["designs"]}
    every = designs["AllOffload"]["intent_accuracy"]
    lines.append(f"\nOffload-M intent accuracy minus AllOffload's, points: measured [{level:.0%} interval] and the "
                 f"share of resamples within {100 * INTENT_SLACK:g} point:")
    for design, span in spans["offload_m_intent"].items():
        gap = 100 * (designs[design]["intent_accuracy"] - every)
        lines.append(f"{design:<24}{gap:>+6.1f} [{100 * span['low']:+.1f}, {100 * span['high']:+.1f}]"
                     f"{span['meeting']:>6.0%}")
    return "\n".join(lines)


def _ratio(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.2f}"


def checks_text(checks: Sequence[tuple[str, bool | None]]) -> str:
    mark = {True: "PASS", False: "FAIL", None: "n/a "}
    return "\n".join(f"  [{mark[ok]}] {text}" for text, ok in checks)


LEVEL_MARKERS = {"L": "v", "M": "o", "H": "^"}  # Offload-L / M / H; designs without a level: a diamond


def design_family(design: str) -> tuple[str, str | None]:
    """("Ours-PPL", "M") for "Ours-PPL-M"; (design, None) for a design without an offload level."""
    head, _, level = design.rpartition("-")
    return (head, level) if level in LEVEL_MARKERS else (design, None)


def families(outcomes: Sequence[Outcome]) -> dict[str, list[Outcome]]:
    """The designs grouped by offramp, each group in the order given (L, M, H as the bench lists them)."""
    groups: dict[str, list[Outcome]] = {}
    for o in outcomes:
        groups.setdefault(design_family(o.design)[0], []).append(o)
    return groups


def plot_fig4(outcomes: Sequence[Outcome], naive: Sequence[Outcome], path: str | Path, title: str) -> Path:
    """Latency vs WER and vs intent accuracy; NaiveHybrid as the dashed interpolation, as in the paper. One
    colour per offramp, its Offload-L / M / H joined by a line (marker v / o / ^): with a dozen designs, labels
    written beside the points would overlap."""
    plt = pyplot()
    groups = families(outcomes)
    colours = plt.get_cmap("tab10")
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.2))
    for ax, metric, label in ((axes[0], "wer", "WER (%)"), (axes[1], "intent_accuracy", "intent accuracy (%)")):
        ax.plot([1000 * o.mean_latency for o in naive], [100 * getattr(o, metric) for o in naive], "k--",
                lw=1, label="NaiveHybrid")
        for i, (family, members) in enumerate(groups.items()):
            xs = [1000 * o.mean_latency for o in members]
            ys = [100 * getattr(o, metric) for o in members]
            ax.plot(xs, ys, "-", color=colours(i % 10), lw=0.8, alpha=0.6, label=family)
            for o, x, y in zip(members, xs, ys):
                ax.scatter(x, y, marker=LEVEL_MARKERS.get(design_family(o.design)[1], "D"), color=colours(i % 10),
                           s=40, zorder=3)
        ax.set_xlabel("mean user-perceived latency (ms)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(f"{title}  (markers: v Offload-L, o M, ^ H)", fontsize=10)
    return save_figure(fig, path, rect=(0, 0.1, 1, 1))


def plot_fig6(outcomes: Sequence[Outcome], naive: Sequence[Outcome], path: str | Path, title: str) -> Path:
    """The paper's Fig. 6: for each design at Offload-M and -H, the share offloaded of the utterances the device
    gets wrong ("target") and of the others, beside what NaiveHybrid offloads of both to reach the same WER."""
    import numpy as np

    plt = pyplot()
    shown = [o for o in outcomes if design_family(o.design)[1] in ("M", "H") and o.target_offloaded is not None]
    # the offload NaiveHybrid needs for a design's WER, read off its line (its WER is linear in the offload)
    order = np.argsort([o.wer for o in naive])
    naive_wer = np.array([naive[i].wer for i in order])
    naive_p = np.array([naive[i].offload_ratio for i in order])
    chance = [float(np.interp(o.wer, naive_wer, naive_p)) for o in shown]
    x = np.arange(len(shown))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(shown) + 2), 4.6))
    ax.bar(x - 0.2, [100 * o.target_offloaded for o in shown], 0.4, label="target: wrong on the device", color="C3")
    ax.bar(x + 0.2, [100 * (o.other_offloaded or 0.0) for o in shown], 0.4, label="non-target", color="C0")
    ax.scatter(x, [100 * p for p in chance], marker="_", s=400, color="k", zorder=3,
               label="NaiveHybrid at the same WER (either)")
    ax.set_xticks(x, [o.design for o in shown], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("offloaded (%)")
    ax.set_ylim(0, 100)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=10)
    return save_figure(fig, path)
