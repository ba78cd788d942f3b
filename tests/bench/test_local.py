"""`pasu bench local` end to end on a tiny model folder and a synthetic corpus."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pasu.bench.local import configurations
from pasu.cli import main
from pasu.device.agent import AgentOptions
from pasu.models.data import write_synthetic_corpus

CONFIGS = ("espnet_beam", "espnet_batch", "ours", "ours_all")


def test_ours_is_the_agents_shipped_decode_and_ours_all_turns_every_shortcut_on():
    configs = configurations()
    assert configs["ours"].final_search == AgentOptions().final_search
    assert configs["ours_pause"].pilot == AgentOptions().pilot  # the agent as shipped
    assert not configs["ours"].pilot.at_pause  # ends where ESPnet's decoders do, at the speech's end
    shortcuts = ("beam_collapse", "early_termination", "ctc_leap")
    assert not any(getattr(configs["ours"].final_search, o) for o in shortcuts)
    assert all(getattr(configs["ours_all"].final_search, o) for o in (*shortcuts, "stop_when_decided"))
    assert configs["ours_all_tau_2"].pilot.interval_seconds == 2.0
    assert configs["ours_all_tau_2"].final_search == configs["ours_all"].final_search
    assert configs["espnet_batch"].decoder == "espnet_batch" and not configs["espnet_batch"].pilot.enabled


def test_with_an_lm_weight_espnet_and_ours_also_run_with_the_lm():
    plain, fused = configurations(), configurations(lm_weight=0.2)
    assert "ours+lm" not in plain and set(fused) - set(plain) == {"espnet_batch+lm", "ours+lm"}
    assert fused["ours+lm"].final_search == replace(plain["ours"].final_search, lm_weight=0.2)
    assert fused["espnet_batch+lm"].decoder == "espnet_batch" and fused["espnet_batch+lm"].final_search.lm_weight == 0.2


def test_with_a_length_bonus_espnet_and_ours_also_run_with_it():
    plain, bonus = configurations(), configurations(length_bonus=1.0)
    assert set(bonus) - set(plain) == {"espnet_batch+bonus", "ours+bonus"}
    assert bonus["ours+bonus"].final_search == replace(plain["ours"].final_search, length_bonus=1.0)
    assert bonus["espnet_batch+bonus"].decoder == "espnet_batch"
    assert bonus["espnet_batch+bonus"].final_search.length_bonus == 1.0
    both = configurations(lm_weight=0.2, length_bonus=1.0)
    assert set(both) - set(plain) == {"espnet_batch+lm", "ours+lm", "espnet_batch+bonus", "ours+bonus",
                                      "espnet_batch+lm+bonus", "ours+lm+bonus"}
    assert both["ours+lm+bonus"].final_search == replace(plain["ours"].final_search, lm_weight=0.2, length_bonus=1.0)


def test_bench_local_measures_each_configuration_side_by_side(tmp_path, cloud_support, capsys):
    corpus = write_synthetic_corpus(tmp_path / "corpus", n_train=1, n_dev=3)
    model = cloud_support.write_model_folder(tmp_path / "model")
    out = tmp_path / "local.json"
    code = main(["bench", "local", "--corpus", str(corpus), "--models", str(model), "--splits", "dev",
                 "--utterances", "0", "--configs", *CONFIGS, "--no-whisper", "--check-clock", "2",
                 "--out", str(out)])
    assert code == 0
    results = json.loads(out.read_text())
    rows = {r["config"]: r for r in results["rows"]}
    assert set(rows) == {*CONFIGS, "pocketsphinx_live", "pocketsphinx_full"}
    for name in ("pocketsphinx_live", "pocketsphinx_full"):  # words only, measured on the same utterances
        assert rows[name]["model"] == "pocketsphinx-en-us" and rows[name]["intent_accuracy"] is None
    for row in rows.values():
        assert row["n"] == 3 and row["split"] == "dev"
        assert 0 < row["latency_p50_ms"] <= row["latency_p99_ms"]
        assert 0.0 <= row["wer"]
    # the speed-ups are ratios of medians measured in this one run
    batch, beam = rows["espnet_batch"], rows["espnet_beam"]
    assert rows["ours"]["speedup_vs_batch"] == batch["latency_p50_ms"] / rows["ours"]["latency_p50_ms"]
    assert rows["ours"]["speedup_vs_beam"] == beam["latency_p50_ms"] / rows["ours"]["latency_p50_ms"]
    clock = results["tiny-untrained_clock_check"]
    assert clock["n"] == 2
    assert clock["virtual_p50_ms"] > 0 and clock["realtime_p50_ms"] > 0
    assert clock["p50_relative_difference"] == pytest.approx(
        abs(clock["virtual_p50_ms"] - clock["realtime_p50_ms"]) / clock["realtime_p50_ms"])  # seconds vs ms
    for mode in ("virtual", "realtime"):  # the stages after end of speech add up to the mean latency
        stages = clock[f"{mode}_stages_ms"]
        assert set(stages) == {"ingest_after_eos", "pilot_after_eos", "encode_after_eos", "decode_after_eos", "other"}
        assert sum(stages.values()) == pytest.approx(clock[f"{mode}_mean_ms"], abs=0.1)
    printed = capsys.readouterr().out
    assert "| tiny-untrained | dev | ours |" in printed and "clock_check" in printed


def test_jobs_replay_model_split_groups_in_parallel_processes(tmp_path, cloud_support):
    corpus = write_synthetic_corpus(tmp_path / "corpus", n_train=2, n_dev=2)
    model = cloud_support.write_model_folder(tmp_path / "model")
    out = tmp_path / "local.json"
    code = main(["bench", "local", "--corpus", str(corpus), "--models", str(model), "--splits", "dev", "train",
                 "--utterances", "0", "--configs", "espnet_batch", "ours", "--no-whisper", "--no-sphinx", "--jobs", "2",
                 "--out", str(out)])
    assert code == 0
    results = json.loads(out.read_text())
    # every group's rows, in the order asked for, each with its own group's speed-up
    assert [(r["split"], r["config"]) for r in results["rows"]] == [
        ("dev", "espnet_batch"), ("dev", "ours"), ("train", "espnet_batch"), ("train", "ours")]
    assert all(r["n"] == 2 and r["speedup_vs_batch"] > 0 for r in results["rows"])
    assert results["jobs"] == 2
