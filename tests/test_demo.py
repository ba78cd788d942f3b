"""pasu demo: which offload policy and threshold it plays with."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pasu.device.offramp_train import CALIBRATION_VERSION


def test_the_demo_plays_the_intent_check_when_the_model_has_its_reader(tmp_path, capsys):
    from pasu.demo import DemoOptions, demo_policy
    from pasu.models.intent_reader import IntentReader, ReaderOptions
    from pasu.device.intent_offramp import INTENT_EVIDENCE, IntentErrorModel, IntentMixture
    from pasu.device.routing import perplexity_offramp
    from pasu.device.runtime import DeviceModel

    import pasu_tests_cloud_support as support  # loaded by tests/conftest.py

    parts, tokenizer = support.tiny_parts()
    model = DeviceModel(parts, tokenizer.token_list, tokenizer.decode, "tiny-untrained")
    with pytest.raises(ValueError, match="pasu offramp train"):  # nothing calibrated, no threshold given
        demo_policy(model, tmp_path, DemoOptions())
    assert demo_policy(model, tmp_path, DemoOptions(policy="ppl", threshold=2.0)).threshold == 2.0
    (tmp_path / "offramp").mkdir()
    report = {"calibration_version": CALIBRATION_VERSION, "ppl": support.offramp_levels(4.0, 3.0, 2.5)}
    (tmp_path / "offramp" / "offramp.json").write_text(json.dumps(report))
    without_reader = demo_policy(model, tmp_path, DemoOptions())
    assert without_reader.offramp == perplexity_offramp("pilot")  # no intent reader: perplexity, at its Offload-M
    assert without_reader.threshold == 3.0 and "no intent check" in capsys.readouterr().err
    assert demo_policy(model, tmp_path, DemoOptions(policy="ppl", level="L")).threshold == 4.0
    reader = IntentReader.fit(["wake me up at five", "play the radio"], ["alarm_set", "play_radio"],
                              ReaderOptions(min_df=1))
    reader.save(tmp_path / "offramp")
    rows = np.random.default_rng(0).uniform(size=(8, len(INTENT_EVIDENCE)))
    IntentErrorModel.fit(rows, np.array([0, 1] * 4)).save(tmp_path / "offramp")  # the intent check's model
    model.intent_mixture = IntentMixture(reader)  # what load_device_model attaches from MODEL/offramp
    report["intent"] = support.offramp_levels(1.7, 0.9, 0.4)
    (tmp_path / "offramp" / "offramp.json").write_text(json.dumps(report))
    policy = demo_policy(model, tmp_path, DemoOptions(policy="intent"))
    assert policy.name == "Ours-Intent" and policy.threshold == 0.9
    assert demo_policy(model, tmp_path, DemoOptions(policy="intent", threshold=2.0)).threshold == 2.0
    assert demo_policy(model, tmp_path, DemoOptions()).name == "Ours-PPL+Intent"  # the default, with a reader


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("espeak-ng") is None, reason="needs espeak-ng (make tts)")
def test_the_demo_runs_end_to_end_with_a_cloud_server_on_loopback(tmp_path, capsys):
    """`pasu demo` (make demo's main job) with a tiny model on both sides: it renders the samples, starts `pasu
    cloud serve` as a process, sends what the policy offloads over gRPC, and writes its table, results and picture."""
    from pasu.cli import main

    import pasu_tests_cloud_support as support  # loaded by tests/conftest.py

    model = support.write_model_folder(tmp_path / "model")
    out = tmp_path / "demo-out"
    capsys.readouterr()
    # perplexity x seconds is above -1 for every utterance: all go to the cloud, none fall back
    assert main(["demo", "--model", str(model), "--cloud-model", str(model), "--utterances", "2", "--fast",
                 "--policy", "ppl", "--threshold", "-1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = json.loads((out / "results.json").read_text())
    assert [row["id"] for row in rows] == ["sample-00", "sample-01-noisy"]
    assert [row["route"] for row in rows] == ["cloud", "cloud"] and all(row["reason"] for row in rows)
    assert rows[0]["reference"]["intent"] and rows[0]["timeline"]["events"]
    assert "| sample-01-noisy |" in printed and "routes {'local': 0, 'cloud': 2, 'fallback': 0}" in printed
    assert (out / "timeline.png").stat().st_size > 0 and (out / "samples" / "sample-00.wav").is_file()
    assert "serving" in (out / "cloud.log").read_text().lower()


def test_the_demo_says_what_to_install_without_espeak(tmp_path, capsys, monkeypatch):
    from pasu.cli import main

    import pasu_tests_cloud_support as support  # loaded by tests/conftest.py

    model = support.write_model_folder(tmp_path / "model")
    monkeypatch.setenv("PATH", str(tmp_path))  # no espeak-ng to be found
    assert main(["demo", "--model", str(model), "--cloud-model", str(model), "--utterances", "1", "--fast",
                 "--policy", "ppl", "--threshold", "1", "--out", str(tmp_path / "out")]) == 2
    assert "make tts" in capsys.readouterr().err


def test_the_demo_fuses_an_lm_into_the_final_decode_only():
    from pasu.demo import DemoOptions, agent_options
    from pasu.device.agent import AgentOptions

    assert agent_options(DemoOptions()) == AgentOptions()  # the agent as shipped
    with_lm = agent_options(DemoOptions(lm="models/shipped/lm"))
    assert with_lm.lm == "models/shipped/lm" and with_lm.final_search.lm_weight == 0.2
    assert with_lm.pilot == AgentOptions().pilot  # the pilots the offramps read stay as they were


def test_the_demo_gives_a_slow_cloud_time_to_answer_and_a_given_deadline_wins(capsys):
    """Its cloud shares the machine's cores: a 2.5-s warm-up must not turn every offload into a fallback."""
    from pasu.demo import DEADLINE_MARGIN, with_deadline
    from pasu.device.agent import AgentOptions

    own = AgentOptions().cloud_deadline_s
    assert with_deadline(AgentOptions(), None, 0.5).cloud_deadline_s == own  # a fast cloud: the agent's own
    assert with_deadline(AgentOptions(), None, 2.5).cloud_deadline_s == pytest.approx(DEADLINE_MARGIN * 2.5)
    assert with_deadline(AgentOptions(), 0.3, 2.5).cloud_deadline_s == 0.3  # --deadline
    assert "offload deadline 0.30 s" in capsys.readouterr().err


def test_the_demo_refuses_an_lm_over_other_tokens_before_it_starts(tmp_path, capsys):
    from pasu.cli import main
    from pasu.settings import shipped_model

    import pasu_tests_cloud_support as support  # loaded by tests/conftest.py

    model = support.write_model_folder(tmp_path / "model")  # a tiny tokenizer, not the shipped device's
    assert main(["demo", "--model", str(model), "--cloud-model", str(model), "--utterances", "1", "--fast",
                 "--policy", "ppl", "--threshold", "1", "--lm", str(shipped_model("lm")),
                 "--out", str(tmp_path / "out")]) == 2
    assert "another token list" in capsys.readouterr().err and not (tmp_path / "out").exists()
