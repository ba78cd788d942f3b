"""`pasu offramp train`: end to end on a tiny model and corpus; its cloud decode, cached per cloud weights and
utterances since it is the slow part; its printed tables."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile
from pasu.device.offramp_cli import cloud_word_edits, threshold_lines, wer_target_table
from pasu.models.data import Utterance

import pasu_tests_cloud_support  # loaded by tests/conftest.py

support = pasu_tests_cloud_support


def _utterances(folder, n: int) -> list[Utterance]:
    utterances = []
    for i in range(n):
        path = folder / f"u{i}.flac"
        soundfile.write(path, support.waveform(0.6, seed=i), 16000)
        utterances.append(Utterance(f"u{i}", path, 0.6, "", "turn the lights on", "iot_hue_lighton", ()))
    return utterances


def _command(folder, make_speech, seconds: float, seed: int) -> list[Utterance]:
    """One speech-like command of `seconds` (the `speech_like` fixture's maker), as a one-utterance split."""
    path = folder / "u0.flac"
    soundfile.write(path, make_speech(seconds, seed=seed), 16000, subtype="PCM_16")
    return [Utterance("u0", path, seconds, "", "set an alarm for seven", "alarm_set", ())]


def test_cloud_edits_are_decoded_once_then_read_from_the_cache(tmp_path):
    cloud = support.write_model_folder(tmp_path / "cloud")
    utterances = _utterances(tmp_path, 3)
    cache = tmp_path / "offramp" / "cloud-dev.json"
    edits = cloud_word_edits(cloud, utterances, cache)
    assert len(edits) == 3 and all(e >= 0 for e in edits)  # an untrained model: whatever it says, counted
    stored = json.loads(cache.read_text())
    assert stored["edits"] == edits and stored["key"]["ids"] == ["u0", "u1", "u2"]
    stored["edits"] = [101, 102, 103]  # what the cache holds is what a second run returns, without decoding
    cache.write_text(json.dumps(stored))
    assert cloud_word_edits(cloud, utterances, cache) == [101, 102, 103]
    # other utterances: decoded again, not taken from a cache made for others
    assert cloud_word_edits(cloud, utterances[:2], cache) == edits[:2]
    assert np.array_equal(json.loads(cache.read_text())["key"]["ids"], ["u0", "u1"])


def test_the_wer_target_table_shows_each_ranking_against_naive_hybrid():
    report = {"ppl": {"wer_targets": {"0.3": {"offload_ratio": 0.1}, "0.2": None}},
              "yardsticks": {"NaiveHybrid": {"0.3": 0.25, "0.2": 0.5}, "gain_oracle": {"0.3": 0.05, "0.2": 0.1}}}
    header, targets, naive, ppl, oracle = wer_target_table(report)
    assert targets.split()[-2:] == ["0.3", "0.2"] and naive.split()[-2:] == ["25.0%", "50.0%"]
    assert ppl.split() == ["ppl", "10.0%", "(0.40x)", "-"]  # None: the target was out of reach
    assert oracle.split() == ["gain_oracle", "5.0%", "(0.20x)", "10.0%", "(0.20x)"]


def test_a_combined_offramps_thresholds_are_also_printed_as_its_parts():
    level = {"threshold": 1.5, "offload_ratio": 0.47}
    ranks = {"roc_auc": 0.7, "average_precision": 0.8, "positives": 0.6}
    report = {"ppl": {"selectivity": ranks, "levels": {"M": {"threshold": 3.0, "offload_ratio": 0.47}}},
              "ppl_intent": {"selectivity": ranks, "levels": {"M": level},
                             "scales": {"ppl": 3.0, "intent": 0.25}}}
    lines = threshold_lines(report)
    assert lines[1] == "  Offload-M: threshold 3 -> offload 47.0%"
    assert lines[3] == "  Offload-M: threshold 1.5 (ppl > 4.5 or intent > 0.375) -> offload 47.0%"


def test_offramp_train_writes_every_offramp_and_reuses_its_replays(tmp_path, capsys):
    """From a packaged model and a corpus to MODEL/offramp: the intent reader and the intent check's model, the
    BiLSTM, the CNN over the pilots' encoder outputs and their calibration; a second run reads the replays it cached."""
    from pasu.cli import build_parser
    from pasu.device.offramp_train import load_offramps
    from pasu.models.data import write_synthetic_corpus

    model = support.write_model_folder(tmp_path / "model")
    corpus = write_synthetic_corpus(tmp_path / "corpus", n_train=8, n_dev=6)
    args = build_parser().parse_args(["offramp", "train", str(model), "--corpus", str(corpus), "--epochs", "2"])
    assert args.run(args) == 0
    printed = capsys.readouterr().out
    assert "cnn (learned local WER > 0.1): " in printed and "Offload-M" in printed
    assert "bilstm (mean of 3 networks, learned local WER > 0.1): " in printed  # the default's seeds, averaged
    trained = load_offramps(model / "offramp")
    assert len(trained.bilstm.nets) == 3 and len(trained.late_network().nets) == len(trained.cnn.nets) == 1
    assert trained.cnn is not None and trained.report["cnn"]["fitted_on"] == 6
    assert {"ppl", "bilstm", "cnn", "intent", "ppl_intent", "bilstm_intent"} <= trained.report.keys()
    assert trained.intent is not None and trained.report["intent"]["fitted_on"] == 6  # the intent check's model
    assert (model / "offramp" / "replays-dev.encoded.npz").is_file()
    stamp = (model / "offramp" / "replays-dev.jsonl").stat().st_mtime_ns
    assert args.run(args) == 0  # the same model and utterances: replays from the cache
    assert (model / "offramp" / "replays-dev.jsonl").stat().st_mtime_ns == stamp
    args = build_parser().parse_args(["offramp", "train", str(model), "--corpus", str(corpus), "--epochs", "2",
                                      "--networks", "1"])
    assert args.run(args) == 0 and len(load_offramps(model / "offramp").bilstm.nets) == 1


def test_the_intent_reader_learns_every_corpus_given_and_reads_characters(tmp_path):
    """`--reader-corpus`: sentences only another corpus has are learned; a sentence both have keeps the first's label."""
    from pasu.device.intent_offramp import READER_CHAR_NGRAMS
    from pasu.device.offramp_cli import fit_intent_reader
    from pasu.models.data import write_synthetic_corpus

    first = write_synthetic_corpus(tmp_path / "first", n_train=8, n_dev=2)
    rows = [json.loads(line) for line in (first / "train.jsonl").read_text().splitlines()]
    shared, extra = dict(rows[0], intent="news_query"), dict(rows[1], text="play the radio please", intent="play_radio")
    (tmp_path / "second").mkdir()
    (tmp_path / "second" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (shared, extra)))
    reader = fit_intent_reader([first], None)
    both = fit_intent_reader([first, tmp_path / "second"], None)
    assert "play_radio" not in reader.classes and "play_radio" in both.classes
    assert "news_query" not in both.classes  # the first corpus labelled that sentence
    assert both.options.char_ngram_max == READER_CHAR_NGRAMS and len(both.vectorizers) == 2


def test_a_corpus_rendered_without_train_leaves_the_reader_to_the_reader_corpora(tmp_path):
    """A calibration corpus with dev only (its training split rendered elsewhere): the reader learns the
    `--reader-corpus` training sentences and the calibration corpus's split, and its file says so; with no
    reader corpus either there is nothing to learn, and the command says what to do."""
    from pasu.device.offramp_cli import fit_intent_reader, reader_training_corpora
    from pasu.models.data import write_synthetic_corpus

    calibration = write_synthetic_corpus(tmp_path / "calibration", n_train=8, n_dev=3)
    (calibration / "train.jsonl").unlink()
    rendered = write_synthetic_corpus(tmp_path / "rendered", n_train=8, n_dev=2)
    corpora = reader_training_corpora(calibration, [rendered])
    reader = fit_intent_reader(corpora, also_split="dev", also_corpus=calibration)
    assert corpora == [rendered]
    assert list(reader.learned_from) == [f"{rendered}:train", f"{calibration}:dev"]
    with pytest.raises(SystemExit, match="--reader-corpus"):
        reader_training_corpora(calibration, [])


def test_the_reader_learns_the_split_and_its_replays_are_read_by_readers_that_did_not(tmp_path):
    """`--reader-learns-split`: the saved reader knows dev's own sentences; each dev utterance is replayed with the
    reader of its sentence's fold, which never learned it (its cache says which reader answered)."""
    from pasu.cli import build_parser
    from pasu.device.held_out_reader import sentence_fold
    from pasu.device.intent_offramp import IntentMixture
    from pasu.device.offramp_train import load_offramps
    from pasu.models.data import write_synthetic_corpus
    from pasu.models.intent_reader import IntentReader

    model = support.write_model_folder(tmp_path / "model")
    corpus = write_synthetic_corpus(tmp_path / "corpus", n_train=8, n_dev=6)
    rows = [json.loads(line) for line in (corpus / "dev.jsonl").read_text().splitlines()]
    pizza = "order a pizza for dinner"
    for row in rows[:2]:
        row.update(text=pizza, intent="takeaway_order", scenario="takeaway", action="order", slots=[])
    (corpus / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = build_parser().parse_args(["offramp", "train", str(model), "--corpus", str(corpus), "--epochs", "2",
                                      "--reader-learns-split"])
    assert args.run(args) == 0
    offramp = model / "offramp"
    shipped = IntentReader.load(offramp)
    assert "takeaway_order" in shipped.classes  # learned from dev
    assert shipped.learned(corpus, "dev") and shipped.learned(corpus, "train")  # and says so (pasu eval warns)
    replayed, readers = {}, {}
    for cache in sorted(offramp.glob("replays-dev.fold*.jsonl")):
        lines = cache.read_text().splitlines()
        fold = int(cache.stem[-1])
        readers[fold] = json.loads(lines[0])["key"]["intent_reader"]
        replayed.update((json.loads(line)["id"], fold) for line in lines[1:])
    assert sorted(replayed) == sorted(r["id"] for r in rows)
    assert replayed[rows[0]["id"]] == replayed[rows[1]["id"]] == sentence_fold(pizza)
    # the other dev sentences are training sentences too: only the pizza's fold reader differs from the saved one
    assert [f for f, digest in readers.items() if digest != IntentMixture(shipped).digest()] == [sentence_fold(pizza)]
    report = load_offramps(offramp).report
    assert report["reader_learns_split"] is True and report["intent"]["fitted_on"] == 6


def test_the_label_choices_are_the_training_options():
    from pasu.device import offramp_net
    from pasu.device.offramp_cli import LABELS

    assert LABELS == offramp_net.LABELS


def test_offramp_show_prints_a_models_calibration(tmp_path, capsys):
    """`pasu offramp show`: the levels `pasu device run --level` picks, read back from offramp.json."""
    from pasu.cli import build_parser
    from pasu.device.offramp_train import CALIBRATION_VERSION

    parser = build_parser()
    args = parser.parse_args(["offramp", "show", str(tmp_path)])
    assert args.run(args) == 2 and "pasu offramp train" in capsys.readouterr().err  # nothing calibrated yet
    levels = {level: {"threshold": t, "offload_ratio": r, "wer": w}
              for level, t, r, w in (("L", 4.0, 0.25, 0.2), ("M", 3.0, 0.47, 0.15), ("H", 2.0, 0.63, 0.12))}
    report = {"calibration_version": CALIBRATION_VERSION, "utterances": 30, "split": "dev", "model": "m",
              "ppl": {"selectivity": {"roc_auc": 0.75, "average_precision": 0.8, "positives": 0.6}, "levels": levels},
              "bilstm": {"train": {"label": "wer", "bad_wer": 0.1},
                         "selectivity": {"roc_auc": 0.8, "average_precision": 0.9, "positives": 0.6}, "levels": levels},
              "intent": {"selectivity": {"roc_auc": None, "average_precision": None, "positives": 0.0},
                         "levels": levels}}
    (tmp_path / "offramp").mkdir()
    (tmp_path / "offramp" / "offramp.json").write_text(json.dumps(report))
    assert args.run(args) == 0  # a model folder: its offramp/ is read
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("calibrated on 30 dev utterances of m, cloud none")
    assert lines[1] == "pilots: every 1 s of audio from 1.5 s"  # none named: the paper's schedule
    assert lines[2] == "ppl: ROC AUC 0.750, average precision 0.800 (60.0% positive)"
    assert lines[4] == "  Offload-M: threshold 3 -> offload 47.0%, WER 15.0%"
    assert lines[6] == "bilstm (learned the local WER): ROC AUC 0.800, average precision 0.900 (60.0% positive)"
    assert lines[10] == "intent: not measurable (one class only)"
    args = parser.parse_args(["offramp", "show", str(tmp_path / "offramp")])  # the offramp folder itself
    assert args.run(args) == 0 and capsys.readouterr().out.splitlines()[1:] == lines[1:]


def test_replays_with_an_lm_answer_with_it_and_judge_the_same_pilots(with_lm, speech_like, tmp_path):
    from pasu.device.agent import AgentOptions, fusing_lm, replay
    from pasu.device.offramp_cli import collect_split

    utterances = _command(tmp_path, speech_like, 2.6, seed=20)
    fused = fusing_lm(AgentOptions(), None, 0.5)  # the fixture's model already holds its LM
    plain = collect_split(with_lm, tmp_path, "dev", utterances, tmp_path / "plain.jsonl")[0]
    with_it = collect_split(with_lm, tmp_path, "dev", utterances, tmp_path / "fused.jsonl", fused)[0]
    assert with_it.pilots >= 1 and with_it.early == plain.early  # the offloading decision reads the same pilot
    audio = soundfile.read(utterances[0].audio, dtype="float32")[0]
    assert with_it.local.text == replay(with_lm, audio, fused).text
    assert with_it.final.tokens != plain.final.tokens  # the LM had a say in the local answer
    # the cache is per options: the plain replays are not taken for the fused ones
    again = collect_split(with_lm, tmp_path, "dev", utterances, tmp_path / "plain.jsonl", fused)[0]
    assert again.local == with_it.local != plain.local


def test_replays_follow_the_pilot_schedule_asked_for(tiny_model, speech_like, tmp_path):
    """Table 4's offloading half: a shorter tau gives the offramps a later last pilot to judge; without pilots
    they judge the full decode. Each schedule's replays are cached apart."""
    from pasu.device.agent import AgentOptions, with_pilots
    from pasu.device.offramp_cli import collect_split

    utterances = _command(tmp_path, speech_like, 3.9, seed=21)

    def replayed(name: str, options: AgentOptions):
        return collect_split(tiny_model, tmp_path, "dev", utterances, tmp_path / f"{name}.jsonl", options)[0]

    every_second = replayed("tau1", AgentOptions())
    twice_a_second = replayed("tau05", with_pilots(AgentOptions(), interval_seconds=0.5))
    none = replayed("none", with_pilots(AgentOptions(), enabled=False))
    # from 1.5 s: at 1.5, 2.5, 3.5 / every 0.5 s to 3.5, then the pause pilot on all 3.9 s
    assert every_second.pilots == 4 and twice_a_second.pilots == 6
    assert none.pilots == 0 and none.early == none.final  # judged on the full decode
    assert replayed("tau1", with_pilots(AgentOptions(), interval_seconds=0.5)).pilots == 6  # not the cached tau 1
    assert replayed("tau1", with_pilots(AgentOptions(), at_pause=False)).pilots == 3  # nor the pause pilot's


def test_offramps_trained_for_an_agent_with_an_lm_record_it_and_show_it(tmp_path, capsys):
    """`--lm`: the replays answer with the LM fused at the shipped weight, the calibration says so, and `pasu offramp
    show` prints it beside what it was calibrated on; so with `--tau`, the pilots' schedule."""
    from pasu.cli import build_parser
    from pasu.models.data import write_synthetic_corpus

    model = support.write_model_folder(tmp_path / "model")
    corpus = write_synthetic_corpus(tmp_path / "corpus", n_train=8, n_dev=4)
    lm = tmp_path / "lm"
    parser = build_parser()
    args = parser.parse_args(["lm", "train", "--model", str(model), "--corpus", str(corpus), "--exp",
                              str(tmp_path / "exp"), "--out", str(lm), "--units", "16", "--layers", "1", "--max-steps",
                              "3", "--threads", "1"])
    assert args.run(args) == 0
    args = parser.parse_args(["offramp", "train", str(model), "--corpus", str(corpus), "--epochs", "2",
                              "--lm", str(lm), "--tau", "0.5"])
    assert args.run(args) == 0
    report = json.loads((model / "offramp" / "offramp.json").read_text())
    assert report["lm"] == str(lm) and report["lm_weight"] == 0.2
    assert report["pilots"] == {"enabled": True, "start_seconds": 1.5, "interval_seconds": 0.5, "at_pause": True,
                                "pause_seconds": 0.2}
    options = json.loads((model / "offramp" / "replays-dev.jsonl").read_text().splitlines()[0])["key"]["options"]
    assert options["lm"] == str(lm) and options["final_search"]["lm_weight"] == 0.2  # the replays' agent fused it
    capsys.readouterr()
    args = parser.parse_args(["offramp", "show", str(model)])
    assert args.run(args) == 0
    shown = capsys.readouterr().out
    assert f"LM {lm} at 0.2 in the final decode" in shown and "pilots: every 0.5 s of audio from 1.5 s" in shown
