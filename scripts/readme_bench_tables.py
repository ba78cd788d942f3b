"""The README's offloading tables as Markdown, from a `pasu bench hybrid` JSON: the design table (Fig. 4's rows the
README shows) and Table 5 with its yardsticks. Paste them; no number typed by hand. (The target checks are in
`pasu bench hybrid`'s output and `pasu bench report`'s; reading them here would import the runtime.)

    .venv/bin/python scripts/readme_bench_tables.py exp/hybrid42/hybrid.json wifi
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DESIGN_ROWS = ("Ours-NoOffload", "AllOffload", "Ours-PPL-L", "Ours-Intent-L", "Ours-PPL-M", "Ours-BiLSTM-M",
               "Ours-CNN-M", "Ours-Intent-M", "Ours-PPL+Intent-M", "Ours-BiLSTM+Intent-M", "Late-PPL-M",
               "Ours-PPL-H", "Ours-BiLSTM-H", "Ours-Intent-H")
TABLE5_COLUMNS = ("Ours-PPL", "Ours-BiLSTM", "Ours-CNN", "Late-PPL", "Ours-Intent", "Ours-PPL+Intent",
                  "Ours-PPL per token", "Ours-BiLSTM per token")
SHORT_LABELS = {"Ours-PPL per token": "PPL per token", "Ours-BiLSTM per token": "BiLSTM per token"}
YARDSTICKS = {"length": "length alone", "label_oracle": "label oracle", "edits_oracle": "device-edits oracle"}


def design_table(profile: dict) -> str:
    by_name = {d["design"]: d for d in profile["designs"]}
    lines = ["| design | offload % | WER % | IC % | SLU-F1 % | mean ms | p90 ms |", "|---|---|---|---|---|---|---|"]
    for name in DESIGN_ROWS:
        d = by_name[name]
        label = name + (" (decide after the full decode)" if name.startswith("Late-") else "")
        lines.append(f"| {label} | {100 * d['offload_ratio']:.1f} | {100 * d['wer']:.1f} | "
                     f"{100 * d['intent_accuracy']:.1f} | {100 * d['slu_f1']:.1f} | {1000 * d['mean_latency']:.0f} | "
                     f"{1000 * d['p90']:.0f} |")
    return "\n".join(lines)


def table5(profile: dict) -> str:
    sticks = profile["yardsticks"]
    # one entry per WER target in both, in the same order (as hybrid_report.yardsticks_text reads them)
    per_target = zip(profile["table5"].items(), *(sticks[k].values() for k in (*YARDSTICKS, "gain_oracle")))
    columns = [SHORT_LABELS.get(c, c) for c in TABLE5_COLUMNS]
    header = ["WER target", "NaiveHybrid", *columns, *YARDSTICKS.values(), "gain oracle"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (target, row), *yardsticks, gain in per_target:
        naive = row["NaiveHybrid"]["offload_ratio"]
        cell = lambda r: "-" if r is None else f"{100 * r:.1f}% ({r / naive:.2f}x)"
        cells = [cell(row[c]["offload_ratio"] if row.get(c) else None) for c in TABLE5_COLUMNS]
        cells += [cell(r) for r in yardsticks]
        lines.append(f"| {100 * float(target):.1f}% | {100 * naive:.1f}% | " + " | ".join(cells) + f" | {100 * gain:.1f}% |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="pasu bench hybrid's hybrid.json")
    parser.add_argument("profile", nargs="?", default="wifi", help="network profile (default: wifi)")
    args = parser.parse_args()
    profile = json.loads(args.results.read_text())["profiles"][args.profile]
    print(design_table(profile), table5(profile), sep="\n\n")


if __name__ == "__main__":
    main()
