"""What `pasu bench hybrid` and `pasu bench report` print of Table 5."""

from __future__ import annotations

from dataclasses import asdict

from pasu.bench.hybrid_eval import Outcome
from pasu.bench.hybrid_report import table5_block

OUTCOME = asdict(Outcome("Ours-PPL", 0.3, 0.33, 0.7, 0.5, 0.2))
RESULT = {"table5": {"0.3300": {"NaiveHybrid": OUTCOME, "Ours-PPL": None}}}


def test_table5_of_a_run_from_before_the_yardsticks_has_no_yardsticks():
    text = table5_block(RESULT)
    assert "WER<=0.3300" in text and "unreachable" in text and "oracle" not in text


def test_table5_shows_what_the_oracles_need_beside_the_offramps():
    sticks = {"bad_wer": 0.3, "NaiveHybrid": {"0.33": 0.4}, "label_oracle": {"0.33": 0.25},
              "gain_oracle": {"0.33": None}}
    lines = table5_block({**RESULT, "yardsticks": sticks}).splitlines()
    rows = {line.split("  ")[1].strip(): line.split()[-1] for line in lines if "oracle" in line or "random" in line}
    assert rows == {"NaiveHybrid (random)": "40.0", "oracle of WER>0.3": "25.0", "oracle of the gain": "-"}
