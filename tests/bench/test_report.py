"""`pasu bench report`: real `pasu bench local` rows (tiny model, short audio) become tables and plots."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import matplotlib.image
import numpy as np

from pasu.bench.local import configurations, run_configs, summarize, with_speedups
from pasu.bench.report import ABLATION, ReportInputs, write_report
from pasu.models.data import Utterance
import pasu_tests_cloud_support  # loaded by tests/conftest.py


def _tiny_device_model():
    from pasu.device.runtime import DeviceModel

    model, tokenizer = pasu_tests_cloud_support.tiny_parts()
    return DeviceModel(model, tokenizer.token_list, tokenizer.decode, "tiny-untrained")


def _local_results(tmp_path: Path) -> Path:
    model = _tiny_device_model()
    rng = np.random.default_rng(0)
    audio = [(0.1 * rng.standard_normal(int(16000 * s))).astype(np.float32) for s in (2.2, 2.6)]
    utterances = [Utterance(f"u{i}", tmp_path / f"u{i}.flac", len(a) / 16000, "", "wake me up", "alarm_set", ())
                  for i, a in enumerate(audio)]
    names = ("espnet_batch", "only_ctc_leap", "ours", "ours_all", "ours_all_tau_2", "ours_all_non_incremental")
    configs = {name: configurations()[name] for name in names}
    results = run_configs(model, configs, utterances, audio, "tiny")
    rows = [summarize(model.model_id, "test", name, utterances, results[name]) for name in names]
    path = tmp_path / "local.json"
    path.write_text(json.dumps({"rows": [asdict(r) for r in with_speedups(rows)], "note": "tiny"}))
    return path


def test_report_from_local_results(tmp_path):
    local = _local_results(tmp_path)
    out = tmp_path / "report"
    report = write_report(ReportInputs(local, tmp_path / "missing-hybrid.json", None), out).read_text()

    rows = json.loads(local.read_text())["rows"]
    ours = next(r for r in rows if r["config"] == "ours")
    assert f"{ours['latency_p50_ms']:.0f}" in report  # the measured median is in the tables
    ablation = next(line for line in report.splitlines() if line.startswith("| tiny-untrained / test |"))
    assert ablation.count("|") == len(ABLATION) + 2 and ablation.count(" - ") == len(ABLATION) - 4  # 4 were run
    assert "tau 2 s" in report and "from scratch" in report
    assert "run `pasu bench hybrid` first" in report and "run `pasu bench load` first" in report
    for name in ("local_latency_accuracy.png", "ablation.png", "tau_sweep.png"):
        assert f"![{name}]({name})" in report
        image = matplotlib.image.imread(out / name)
        assert image.shape[0] > 200 and image.std() > 0  # a drawn picture, not a blank canvas


def test_cli_writes_the_report(tmp_path, capsys):
    from pasu.cli import main

    assert main(["bench", "report", "--local", str(tmp_path / "none.json"), "--out", str(tmp_path / "r")]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "r" / "report.md").exists()


def _hybrid_data(selectivity: bool) -> dict:
    from pasu.bench.hybrid_eval import Outcome

    extra = lambda target, other: {"target_offloaded": target, "other_offloaded": other} if selectivity else {}
    designs = [Outcome("Ours-NoOffload", 0.0, 0.3, 0.7, 0.1, 0.05, **extra(0.0, 0.0)),
               Outcome("Ours-PPL-M", 0.45, 0.17, 0.8, 0.4, 0.2, **extra(0.8, 0.1)),
               Outcome("Ours-PPL-H", 0.6, 0.15, 0.8, 0.5, 0.2, **extra(0.9, 0.3))]
    naive = [Outcome(f"NaiveHybrid(p={p})", p, 0.3 - 0.2 * p, 0.7, p, 0.1) for p in (0.0, 0.5, 1.0)]
    result = {"designs": [asdict(o) for o in designs], "naive_line": [asdict(o) for o in naive], "table5": {},
              "checks": [], "cloud_failures": 0, "cloud_latency": {"mean": 0.8, "p90": 0.9}}
    return {"device_model": "device", "cloud_model": "cloud", "utterances": 3, "split": "test",
            "network_emulation": "proxy", "profiles": {"wifi": result}}


def test_the_hybrid_section_draws_fig6_when_the_run_recorded_selectivity(tmp_path):
    from pasu.bench.report import _hybrid_section

    lines = _hybrid_section(_hybrid_data(True), tmp_path, Path("hybrid.json"))
    assert "![selectivity_wifi.png](selectivity_wifi.png)" in lines
    assert matplotlib.image.imread(tmp_path / "selectivity_wifi.png").std() > 0
    (tmp_path / "old").mkdir()
    older = _hybrid_section(_hybrid_data(False), tmp_path / "old", Path("hybrid.json"))  # a run from before
    assert not any("selectivity" in line for line in older)
