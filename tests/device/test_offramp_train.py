"""Offramp training and calibration on a small split: cross-fitted BiLSTM, PPL thresholds, save/load."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from pasu.device.agent import PilotOptions
from pasu.device.bilstm_offramp import BiLstmOfframp, EndBiLstmOfframp, LateBiLstmOfframp, pilot_features
from pasu.device.offramp_net import TrainOptions
from pasu.device.offramp_data import HypothesisFeatures, OfframpSample
from pasu.device.offramp_train import (
    CALIBRATION_VERSION,
    OfframpTrainOptions,
    answer_intent_accuracy,
    calibrated_routing,
    schedule_mismatch,
    either_thresholds,
    fit_offramps,
    load_bilstm,
    load_offramps,
    threshold,
    yardsticks,
)
from pasu.device.intent_offramp import IntentOfframp
from pasu.device.routing import OfframpPolicy, RoutingOptions, intent_policy, perplexity_offramp

from pasu.metrics import SluResult

import pasu_tests_cloud_support as support  # loaded by tests/conftest.py


def split(n: int = 60, seed: int = 0, encoded: bool = False) -> list[OfframpSample]:
    """Half the utterances go wrong locally (4 of 5 words), and their hypotheses hold a run of unlikely tokens
    (`encoded`: and keep encoder outputs, louder where the utterance goes wrong)."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(n):
        bad = i % 2 == 1
        length = int(rng.integers(5, 12))
        att = -rng.exponential(0.2, length + 1)
        if bad:
            att[1:4] -= rng.uniform(2, 4, 3)
        frames = (rng.normal(0, 3 if bad else 0.3, (3 * length, 8))).astype(np.float16) if encoded else None
        features = HypothesisFeatures(tuple(range(length)), tuple(att), tuple(att * 1.5), True, frames)
        ref = SluResult("set an alarm for seven", "alarm_set")
        local = SluResult("play some music now seven" if bad else ref.text, "play_music" if bad else "alarm_set")
        samples.append(OfframpSample(f"u{i}", 2.0, ref, local, 4 if bad else 0, 5, 0.1, 0.02, 1, features, features))
    return samples


def test_training_and_calibration_on_a_small_split(tmp_path):
    options = OfframpTrainOptions(bilstm=TrainOptions(epochs=15), folds=3)
    cloud_edits = [0] * 60  # the cloud gets everything right
    trained = fit_offramps(split(), options, cloud_edits)
    bilstm, report = trained.bilstm, trained.report
    assert trained.cnn is None  # these replays kept no encoder outputs
    assert report["samples"] == 60 and report["bad_share"] == pytest.approx(0.5)
    assert report["bilstm"]["selectivity"]["roc_auc"] > 0.9  # out-of-fold: the network never saw these
    assert report["ppl"]["selectivity"]["roc_auc"] > 0.9
    for name in ("ppl", "bilstm"):
        for level, ratio in (("L", 0.25), ("M", 0.47), ("H", 0.63)):
            assert abs(report[name]["levels"][level]["offload_ratio"] - ratio) <= 0.05
        for target, cal in report[name]["wer_targets"].items():
            assert cal is not None and cal["wer"] <= float(target) + 1e-9
            assert cal["offload_ratio"] <= 0.55  # a selective offramp offloads little more than the bad half
    # the late network learns the full decodes: here they equal the pilots, so it learns what the pilots' network
    # learns (reading their <eos>, which a pilot's network leaves out); its thresholds are weighed by the full
    # decode's tokens, not the seconds
    pilots = [s.early.hypothesis() for s in split(4, seed=2)]
    late, early = [trained.bilstm_late.score(h) for h in pilots], [bilstm.score(h) for h in pilots]
    assert [s > 0.5 for s in late] == [s > 0.5 for s in early] == [False, True, False, True]
    assert late != early  # the same recipe on other inputs
    for level, ratio in (("L", 0.25), ("M", 0.47), ("H", 0.63)):
        assert abs(report["bilstm_late"]["levels"][level]["offload_ratio"] - ratio) <= 0.05
    trained.save(tmp_path / "offramp")
    loaded = load_offramps(tmp_path / "offramp")
    assert loaded.cnn is None and threshold(loaded.report, "bilstm", "M") == threshold(report, "bilstm", "M")
    held = [s.early.hypothesis() for s in split(6, seed=1)]
    assert [loaded.bilstm.score(h) for h in held] == pytest.approx([bilstm.score(h) for h in held])


def test_the_late_bilstm_is_fitted_on_the_full_decodes(tmp_path):
    # every pilot alike, so only the full decode tells the bad replays apart
    blank = HypothesisFeatures((1, 2, 3), (-0.1, -0.1, -0.1, -0.1), (-0.2, -0.2, -0.2), True)
    samples = [dataclasses.replace(s, early=blank) for s in split()]
    trained = fit_offramps(samples, OfframpTrainOptions(bilstm=TrainOptions(epochs=15), folds=3), [0] * 60)
    report = trained.report
    assert report["bilstm_late"]["selectivity"]["roc_auc"] > 0.9  # out of fold, on the full decodes
    assert report["bilstm"]["selectivity"]["roc_auc"] < 0.7  # the pilots say nothing
    assert report["bilstm_late"]["parameters"] == report["bilstm"]["parameters"]  # the same network, refitted
    folder = trained.save(tmp_path / "offramp")
    late = load_bilstm(folder, "final")
    assert isinstance(late, LateBiLstmOfframp) and isinstance(load_offramps(folder).late_network(), LateBiLstmOfframp)
    finals = [s.final.hypothesis() for s in samples[:4]]
    assert [late.score(h) for h in finals] == pytest.approx([trained.bilstm_late.score(h) for h in finals])
    # a folder from before the late network: the late decision reads the pilots' network, as it was calibrated
    (folder / LateBiLstmOfframp.weights_file).unlink()
    assert type(load_bilstm(folder, "final")) is BiLstmOfframp and load_offramps(folder).bilstm_late is None


def test_the_end_bilstm_is_fitted_on_the_end_of_speech_pilots(tmp_path):
    blank = HypothesisFeatures((1, 2, 3), (-0.1, -0.1, -0.1, -0.1), (-0.2, -0.2, -0.2), True)
    # only the end-of-speech pilot tells the bad replays apart
    samples = [dataclasses.replace(s, early=blank, final=blank, end=s.final, end_decision_at=0.01) for s in split()]
    trained = fit_offramps(samples, OfframpTrainOptions(bilstm=TrainOptions(epochs=15), folds=3), [0] * 60)
    report = trained.report
    assert report["bilstm_end"]["selectivity"]["roc_auc"] > 0.9  # out of fold, on the end-of-speech pilots
    assert report["bilstm_late"]["selectivity"]["roc_auc"] < 0.7  # the full decodes say nothing
    assert report["ppl_end"]["selectivity"]["roc_auc"] > 0.9  # the end pilots' perplexity, calibrated apart
    folder = trained.save(tmp_path / "offramp")
    end = load_bilstm(folder, "end")
    assert isinstance(end, EndBiLstmOfframp) and isinstance(load_offramps(folder).bilstm_end, EndBiLstmOfframp)
    ends = [s.end.hypothesis() for s in samples[:4]]
    assert [end.score(h) for h in ends] == pytest.approx([trained.bilstm_end.score(h) for h in ends])
    (folder / EndBiLstmOfframp.weights_file).unlink()  # a folder from before the end network: no guess
    with pytest.raises(FileNotFoundError, match="bilstm-end"):
        load_bilstm(folder, "end")
    # replays from before the end-of-speech pilots: nothing to fit it on, nor to calibrate
    older = fit_offramps(split(), OfframpTrainOptions(bilstm=TrainOptions(epochs=2), folds=3), [0] * 60)
    assert older.bilstm_end is None and not {"ppl_end", "bilstm_end"} & older.report.keys()


def test_the_cnn_is_fitted_and_calibrated_where_the_replays_kept_encoder_outputs(tmp_path):
    options = OfframpTrainOptions(bilstm=TrainOptions(epochs=2), cnn=TrainOptions(epochs=15), folds=3)
    trained = fit_offramps(split(encoded=True), options, [0] * 60)
    cnn = trained.report["cnn"]
    assert cnn["fitted_on"] == 60 and cnn["selectivity"]["roc_auc"] > 0.9  # out-of-fold
    assert cnn["levels"]["M"]["offload_ratio"] == pytest.approx(0.47, abs=0.05)
    assert all(cal is not None for cal in cnn["wer_targets"].values())
    loaded = load_offramps(trained.save(tmp_path / "offramp"))
    held = [s.early.hypothesis() for s in split(6, seed=1, encoded=True)]
    assert [loaded.cnn.score(h) for h in held] == pytest.approx([trained.cnn.score(h) for h in held])
    policy = OfframpPolicy(loaded.cnn, threshold(loaded.report, "cnn", "M"), name="Ours-CNN")
    assert policy.decide(held[1], 2.0).offload and not policy.decide(held[0], 2.0).offload


def test_loading_without_training_says_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="pasu offramp train"):
        load_offramps(tmp_path)


def test_thresholds_are_in_the_policys_units(tmp_path):
    """The calibrated threshold, applied by the policy to the length-weighted score, gives the calibrated ratio."""
    samples = [dataclasses.replace(s, duration=1.0 + (i % 3)) for i, s in enumerate(split())]
    report = fit_offramps(samples, OfframpTrainOptions(bilstm=TrainOptions(epochs=5), folds=3)).report
    cal = report["ppl"]["levels"]["M"]
    policy = OfframpPolicy(perplexity_offramp("pilot"), cal["threshold"])
    offloaded = [policy.decide(s.early.hypothesis(), s.duration).offload for s in samples]
    assert np.mean(offloaded) == pytest.approx(cal["offload_ratio"])


def test_a_report_from_before_length_weighting_is_refused(tmp_path):
    trained = fit_offramps(split(), OfframpTrainOptions(bilstm=TrainOptions(epochs=2), folds=3))
    trained.report["calibration_version"] = 2  # the intent check's thresholds were per hypothesis
    trained.save(tmp_path / "offramp")
    with pytest.raises(ValueError, match="pasu offramp train"):
        load_offramps(tmp_path / "offramp")


def test_the_bilstm_can_learn_from_more_utterances_than_are_calibrated_on():
    """Fitted on 90 replays, calibrated on 30 of them with their out-of-fold scores (the cloud decoded only those)."""
    everything = split(90, seed=2)
    calibration = everything[::3]
    options = OfframpTrainOptions(bilstm=TrainOptions(epochs=10), folds=3)
    report = fit_offramps(calibration, options, [0] * 30, fit_samples=everything).report
    assert report["samples"] == 30 and report["bilstm"]["fitted_on"] == 90
    assert report["bilstm"]["levels"]["M"]["offload_ratio"] == pytest.approx(0.47, abs=0.04)
    assert report["bilstm"]["selectivity"]["roc_auc"] > 0.9
    strangers = split(6, seed=3)  # ids u0..u5 with other features: not the ones fitted
    with pytest.raises(ValueError, match="not among the BiLSTM's training utterances"):
        fit_offramps([dataclasses.replace(s, id=f"x{i}") for i, s in enumerate(strangers)], options,
                     fit_samples=everything)


def test_yardsticks_price_random_and_oracle_offloading():
    """Local WER 0.4, all in the bad half, the cloud perfect: each fifth of the gain costs 6 of 60 utterances to an
    oracle, 12 to NaiveHybrid; every utterance lasts 2 s, so length alone ranks them no better than chance."""
    samples = split()
    table = yardsticks(samples, [0] * 60)
    assert list(table["NaiveHybrid"].values()) == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert list(table["length"].values()) == pytest.approx([0.2, 0.4, 0.6, 0.8], abs=1 / 60)
    for oracle in ("label_oracle", "edits_oracle", "gain_oracle"):
        assert list(table[oracle].values()) == pytest.approx([0.1, 0.2, 0.3, 0.4])
    longer = [dataclasses.replace(s, duration=3.0) if s.local_edits else s for s in samples]
    assert list(yardsticks(longer, [0] * 60)["length"].values()) == pytest.approx([0.1, 0.2, 0.3, 0.4])
    report = fit_offramps(samples, OfframpTrainOptions(bilstm=TrainOptions(epochs=2), folds=3), [0] * 60).report
    assert report["yardsticks"] == table


def test_the_bilstm_label_bar_is_a_training_option():
    """One error in five words (WER 0.2) is wrong under the paper's bar 0.1, right under 0.5."""
    near = SluResult("set an alarm for eight", "alarm_set")
    samples = [dataclasses.replace(s, local=near, local_edits=1) if i % 4 == 0 else s for i, s in enumerate(split())]
    shares = {}
    for bar in (0.1, 0.5):
        report = fit_offramps(samples, OfframpTrainOptions(bilstm=TrainOptions(epochs=2, bad_wer=bar), folds=3)).report
        shares[bar] = report["bad_share"]
        assert report["bilstm"]["train"]["bad_wer"] == bar
    assert shares == {0.1: 0.75, 0.5: 0.5}


def test_the_report_says_what_the_intent_reader_changed_in_the_answers():
    # the odd ones answer play_music, wrongly; their decoder said so too, except in u1 and u3
    samples = [dataclasses.replace(s, final=dataclasses.replace(s.final, tokens=(i,))) for i, s in enumerate(split(10))]
    decoder_said = {(i,): s.local.intent for i, s in enumerate(samples)}
    decoder_said[(1,)] = decoder_said[(3,)] = "alarm_set"  # the mixture turned the decoder's right intent wrong

    def read(tokens):
        return SluResult("", decoder_said[tuple(tokens)])

    assert answer_intent_accuracy(samples, read) == {"utterances": 10, "answers": 0.5, "decoder": 0.7}


def doubt_by_length(hypothesis) -> np.ndarray:
    """Intent evidence that flags long hypotheses: it disagrees with the perplexity about which are bad."""
    return np.array([float(len(hypothesis.tokens) >= 9), len(hypothesis.tokens)])


def test_words_or_intent_is_calibrated_as_the_union_of_both_checks():
    """The combined check's threshold at a level is both parts' own thresholds, scaled alike; applied as the
    agent's ppl+intent policy, it offloads what either part would, at the calibrated ratio."""
    samples = [dataclasses.replace(s, duration=1.0 + (i % 3)) for i, s in enumerate(split())]
    samples = [dataclasses.replace(s, local=dataclasses.replace(s.local, intent="play_music"))
               if len(s.early.tokens) >= 9 else s for s in samples]  # long ones also get the intent wrong
    trained = fit_offramps(samples, OfframpTrainOptions(bilstm=TrainOptions(epochs=2), folds=3), [0] * 60,
                           intent=doubt_by_length)
    report, intent = trained.report, IntentOfframp(doubt_by_length, trained.intent)
    both = report["ppl_intent"]
    assert both["scales"] == {"ppl": threshold(report, "ppl", "M"), "intent": threshold(report, "intent", "M")}
    assert report["bilstm_intent"]["scales"]["bilstm"] == threshold(report, "bilstm", "M")
    assert report["intent"]["evidence"] == ["evidence0", "evidence1"] and report["intent"]["fitted_on"] == 60

    def offloaded(policy):
        return np.array([policy.decide(s.early.hypothesis(), s.duration).offload for s in samples])

    for level in ("L", "M", "H"):
        parts = either_thresholds(report, "ppl_intent", level)
        policy = RoutingOptions(policy="ppl+intent", threshold=parts["ppl"], intent_threshold=parts["intent"])
        # calibration compares score / scale with the level's threshold, the agent score with threshold x scale: the
        # utterance whose score set the threshold may round either way
        ratio = offloaded(policy.make_policy(intent)).mean()
        assert abs(ratio - both["levels"][level]["offload_ratio"]) <= 1 / len(samples) + 1e-9
    # at the scales themselves, each part at its own Offload-M: what either part offloads
    scales = both["scales"]
    union = offloaded(RoutingOptions(policy="ppl+intent", threshold=scales["ppl"],
                                     intent_threshold=scales["intent"]).make_policy(intent))
    ppl_m = offloaded(OfframpPolicy(perplexity_offramp("pilot"), scales["ppl"]))
    intent_m = offloaded(intent_policy(intent, scales["intent"]))
    assert (union == (ppl_m | intent_m)).all() and union.sum() > max(ppl_m.sum(), intent_m.sum())
    assert set(both["wer_targets"]) == set(report["ppl"]["wer_targets"])


def test_without_both_right_and_wrong_intents_the_intent_check_is_left_out():
    """An untrained model or a tiny split: the word checks are still fitted and saved, and the report says why."""
    samples = [dataclasses.replace(s, local=s.reference) for s in split()]  # every intent right
    trained = fit_offramps(samples, OfframpTrainOptions(bilstm=TrainOptions(epochs=2), folds=3), intent=doubt_by_length)
    assert trained.intent is None and "intent" not in trained.report and "ppl_intent" not in trained.report
    assert "right on all or on none" in trained.report["intent_skipped"] and "bilstm" in trained.report


def test_unset_thresholds_are_the_models_calibrated_offload_m(tmp_path):
    """The agent's default thresholds come from the model's own calibration; numbers the user set stay."""
    report = {"calibration_version": CALIBRATION_VERSION, "ppl": support.offramp_levels(2.5, 1.9, 1.6),
              "intent": support.offramp_levels(0.7, 0.3, 0.1)}
    (tmp_path / "offramp.json").write_text(json.dumps(report))
    assert calibrated_routing(RoutingOptions(policy="ppl"), tmp_path).threshold == 1.9
    assert calibrated_routing(RoutingOptions(policy="intent"), tmp_path).intent_threshold == 0.3
    assert calibrated_routing(RoutingOptions(policy="ppl", threshold=4.0), tmp_path).threshold == 4.0
    both = calibrated_routing(RoutingOptions(), tmp_path)  # no combined check in the report: each part at its M
    assert (both.policy, both.threshold, both.intent_threshold) == ("ppl+intent", 1.9, 0.3)
    report["ppl_intent"] = {"scales": {"ppl": 1.9, "intent": 0.3}, **support.offramp_levels(3.0, 1.5, 1.1)}
    (tmp_path / "offramp.json").write_text(json.dumps(report))
    both = calibrated_routing(RoutingOptions(), tmp_path)  # the pair that offloads Offload-M's share together
    assert (both.threshold, both.intent_threshold) == (1.5 * 1.9, 1.5 * 0.3)
    mixed = calibrated_routing(RoutingOptions(threshold=5.0), tmp_path)
    assert (mixed.threshold, mixed.intent_threshold) == (5.0, 1.5 * 0.3)
    report["bilstm"] = support.offramp_levels(0.9, 0.6, 0.4)  # the BiLSTM's thresholds are in its own units
    report["bilstm_intent"] = {"scales": {"bilstm": 0.6, "intent": 0.3}, **support.offramp_levels(2.0, 1.4, 1.0)}
    (tmp_path / "offramp.json").write_text(json.dumps(report))
    assert calibrated_routing(RoutingOptions(policy="bilstm"), tmp_path).threshold == 0.6
    pair = calibrated_routing(RoutingOptions(policy="bilstm+intent"), tmp_path)
    assert (pair.threshold, pair.intent_threshold) == (1.4 * 0.6, 1.4 * 0.3)


def test_thresholds_calibrated_on_another_pilot_schedule_are_named(tmp_path):
    """Calibrated thresholds fit only the pilots they were placed on: another schedule is said, with both."""
    report = {"calibration_version": CALIBRATION_VERSION, "ppl": support.offramp_levels(2.5, 1.9, 1.6)}
    (tmp_path / "offramp.json").write_text(json.dumps(report))  # no schedule named: the paper's
    paper, pause = PilotOptions(at_pause=False), PilotOptions(at_pause=True)
    assert schedule_mismatch(RoutingOptions(policy="ppl"), paper, tmp_path) is None
    mismatch = schedule_mismatch(RoutingOptions(policy="ppl"), pause, tmp_path)
    assert f"calibrated with pilots {paper.describe()}, but the agent runs them {pause.describe()}," in mismatch
    assert "pasu offramp train" in mismatch
    report["pilots"] = pause.schedule()
    (tmp_path / "offramp.json").write_text(json.dumps(report))
    assert schedule_mismatch(RoutingOptions(), pause, tmp_path) is None
    assert schedule_mismatch(RoutingOptions(policy="intent"), paper, tmp_path) is not None  # reads pilots too
    assert schedule_mismatch(RoutingOptions(policy="ppl", threshold=2.0), paper, tmp_path) is None  # set by hand
    assert schedule_mismatch(RoutingOptions(policy="ppl-end"), paper, tmp_path) is None  # reads no pilot
    assert schedule_mismatch(RoutingOptions(policy="ppl"), paper, tmp_path / "none") is None  # nothing calibrated


def test_the_level_picks_the_calibrated_operating_point(tmp_path):
    """routing.level: the thresholds left unset take Offload-L's or -H's instead of -M's, for a pair too."""
    report = {"calibration_version": CALIBRATION_VERSION, "ppl": support.offramp_levels(2.5, 1.9, 1.6),
              "intent": support.offramp_levels(0.7, 0.3, 0.1),
              "ppl_intent": {"scales": {"ppl": 1.9, "intent": 0.3}, **support.offramp_levels(3.0, 1.5, 1.1)}}
    (tmp_path / "offramp.json").write_text(json.dumps(report))
    assert calibrated_routing(RoutingOptions(policy="ppl", level="L"), tmp_path).threshold == 2.5
    assert calibrated_routing(RoutingOptions(policy="intent", level="H"), tmp_path).intent_threshold == 0.1
    pair = calibrated_routing(RoutingOptions(level="H"), tmp_path)
    assert (pair.threshold, pair.intent_threshold) == (1.1 * 1.9, 1.1 * 0.3)
    assert calibrated_routing(RoutingOptions(policy="ppl", threshold=4.0, level="L"), tmp_path).threshold == 4.0
    report["ppl_late"] = support.offramp_levels(2.4, 1.8, 1.5)  # the full decode's perplexity, calibrated apart
    (tmp_path / "offramp.json").write_text(json.dumps(report))
    assert calibrated_routing(RoutingOptions(policy="ppl-late", level="H"), tmp_path).threshold == 1.5
    report["bilstm_late"] = support.offramp_levels(0.8, 0.5, 0.3)  # the BiLSTM on the full decode, apart too
    (tmp_path / "offramp.json").write_text(json.dumps(report))
    assert calibrated_routing(RoutingOptions(policy="bilstm-late", level="M"), tmp_path).threshold == 0.5
    report["ppl_end"] = support.offramp_levels(30.0, 15.0, 9.0)  # the end-of-speech pilot's, apart again
    report["bilstm_end"] = support.offramp_levels(17.0, 9.0, 5.0)
    (tmp_path / "offramp.json").write_text(json.dumps(report))
    assert calibrated_routing(RoutingOptions(policy="ppl-end", level="L"), tmp_path).threshold == 30.0
    assert calibrated_routing(RoutingOptions(policy="bilstm-end"), tmp_path).threshold == 9.0
    assert calibrated_routing(RoutingOptions(policy="naive"), tmp_path).unset_thresholds == []


def test_an_uncalibrated_model_needs_its_thresholds_set(tmp_path):
    routing = calibrated_routing(RoutingOptions(policy="ppl"), tmp_path)  # no offramp.json
    with pytest.raises(ValueError, match="routing.threshold"):
        routing.make_policy()
    assert calibrated_routing(RoutingOptions(policy="ppl", threshold=2.0), tmp_path).make_policy().threshold == 2.0


def test_each_replay_is_judged_by_the_evidence_it_was_read_with():
    """Replays read by held-out readers (`intent_by_replay`): the intent check is fitted on each replay's own
    evidence, not on what the model's reader, which learned those sentences, makes of it."""
    samples = split()
    knowing = lambda hypothesis: np.array([0.0, 1.0])  # the reader that learned the sentences: sure of them all
    held_out = {s.id: (lambda h, wrong=s.local.intent != s.reference.intent: np.array([float(wrong), 1.0]))
                for s in samples}
    options = OfframpTrainOptions(bilstm=TrainOptions(epochs=2), folds=3)
    trained = fit_offramps(samples, options, intent=knowing, intent_by_replay=lambda s: held_out[s.id])
    assert trained.report["intent"]["selectivity_intent"]["roc_auc"] == pytest.approx(1.0)
    assert trained.intent.probabilities([[1.0, 1.0]])[0] > 0.9 > 0.1 > trained.intent.probabilities([[0.0, 1.0]])[0]


def graded_split(n: int, seed: int) -> list[OfframpSample]:
    """A third of the utterances right, a third with one word of five wrong (one unlikely token), a third with
    four wrong (a run of three): the paper's label (WER > 0.1) calls the last two alike."""
    rng = np.random.default_rng(seed)
    ref = SluResult("set an alarm for seven", "alarm_set")
    heard = {0: ref.text, 1: "set an alarm for eleven", 4: "play some music now seven"}
    samples = []
    for i in range(n):
        edits = (0, 1, 4)[i % 3]
        att = -rng.exponential(0.2, 9)
        att[2:2 + min(edits, 3)] -= rng.uniform(2, 4, min(edits, 3))
        features = HypothesisFeatures(tuple(range(8)), tuple(att), tuple(att * 1.5), True)
        samples.append(OfframpSample(f"u{i}", 2.0, ref, SluResult(heard[edits], "alarm_set"), edits, 5, 0.1, 0.02, 1,
                                     features, features))
    return samples


def test_the_bilstm_can_learn_the_local_wer_itself():
    """With soft labels (label "wer") the network ranks four wrong words above one; the paper's label cannot
    tell them apart."""
    options = OfframpTrainOptions(bilstm=TrainOptions(epochs=30, label="wer"), folds=3)
    trained = fit_offramps(graded_split(90, seed=0), options, [0] * 90)
    assert trained.report["bilstm"]["train"]["label"] == "wer"
    held = graded_split(60, seed=1)
    scores = trained.bilstm.probabilities([pilot_features(s.early) for s in held])
    mean = {edits: scores[[s.local_edits == edits for s in held]].mean() for edits in (0, 1, 4)}
    # unbalanced soft labels: the score estimates the WER (the paper's label puts both wrong thirds near 1)
    assert mean[0] == pytest.approx(0.0, abs=0.1)
    assert mean[1] == pytest.approx(0.2, abs=0.1)
    assert mean[4] == pytest.approx(0.8, abs=0.1)


def test_the_label_is_the_bar_or_the_local_wer():
    right, one_wrong, four_wrong = graded_split(3, seed=0)
    assert [TrainOptions().label_of(s) for s in (right, one_wrong, four_wrong)] == [0.0, 1.0, 1.0]
    assert [TrainOptions(label="wer").label_of(s) for s in (right, one_wrong, four_wrong)] == pytest.approx([0, 0.2, 0.8])
    with pytest.raises(ValueError, match="choose one of bad, wer"):
        TrainOptions(label="edits")

