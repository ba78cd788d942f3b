"""What `pasu bench hybrid` and `pasu bench report` print of Table 5 and draw of Fig. 4."""

from __future__ import annotations

from dataclasses import asdict

from pasu.bench.hybrid_eval import Outcome
from pasu.bench.hybrid_report import designs_table, design_family, families, plot_fig4, plot_fig6, table5_block

OUTCOME = asdict(Outcome("Ours-PPL", 0.3, 0.33, 0.7, 0.5, 0.2))
RESULT = {"table5": {"0.3300": {"NaiveHybrid": OUTCOME, "Ours-PPL": None}}}


def test_table5_of_a_run_from_before_the_yardsticks_has_no_yardsticks():
    text = table5_block(RESULT)
    assert "WER<=0.3300" in text and "unreachable" in text and "oracle" not in text


def test_table5_shows_what_the_oracles_need_beside_the_offramps():
    sticks = {"bad_wer": 0.3, "NaiveHybrid": {"0.33": 0.4}, "length": {"0.33": 0.35}, "label_oracle": {"0.33": 0.25},
              "gain_oracle": {"0.33": None}}  # a run from before the device-edits oracle: its row is left out
    lines = table5_block({**RESULT, "yardsticks": sticks}).splitlines()
    header = next(i for i, line in enumerate(lines) if "yardsticks" in line)
    rows = {line.split("  ")[1].strip(): line.split()[-1] for line in lines[header + 1:]}
    assert rows == {"NaiveHybrid (random)": "40.0", "speech length alone": "35.0", "oracle of WER>0.3": "25.0",
                    "oracle of the gain": "-"}


def test_fig4_groups_each_offramps_levels_and_draws_them(tmp_path):
    names = ["Ours-NoOffload", "AllOffload", "Ours-PPL-L", "Ours-PPL+Intent-L", "Ours-PPL-M", "Ours-PPL+Intent-M",
             "Late-PPL-M", "Ours-PPL-H"]
    outcomes = [Outcome(name, i / 10, 0.3 - i / 100, 0.7 + i / 100, 0.1 * i, 0.05) for i, name in enumerate(names)]
    groups = families(outcomes)
    assert {family: [design_family(o.design)[1] for o in members] for family, members in groups.items()} == {
        "Ours-NoOffload": [None], "AllOffload": [None], "Ours-PPL": ["L", "M", "H"],
        "Ours-PPL+Intent": ["L", "M"], "Late-PPL": ["M"]}
    path = plot_fig4(outcomes, outcomes[:2], tmp_path / "fig4.png", "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fig6_draws_the_selectivity_of_the_m_and_h_designs_and_the_table_lists_it(tmp_path):
    naive = [Outcome(f"NaiveHybrid(p={p:.1f})", p, 0.3 - 0.2 * p, 0.7, p, 0.1, target_offloaded=p,
                     other_offloaded=p) for p in (0.0, 0.5, 1.0)]
    designs = [Outcome("Ours-NoOffload", 0.0, 0.3, 0.7, 0.1, 0.05, target_offloaded=0.0, other_offloaded=0.0),
               Outcome("Ours-PPL-M", 0.45, 0.17, 0.8, 0.4, 0.2, target_offloaded=0.8, other_offloaded=0.1),
               Outcome("Ours-PPL-H", 0.6, 0.15, 0.8, 0.5, 0.2, target_offloaded=0.9, other_offloaded=0.3),
               Outcome("from-an-old-run-M", 0.5, 0.2, 0.8, 0.5, 0.2)]  # no selectivity recorded: not drawn
    path = plot_fig6(designs, naive, tmp_path / "fig6.png", "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    row = designs_table(designs).splitlines()[3]
    assert row.startswith("Ours-PPL-M") and row.split()[-2:] == ["80.0", "10.0"]
    assert designs_table(designs).splitlines()[-1].split()[-2:] == ["-", "-"]
