"""`pasu corpus import-slurp` on a tiny fake SLURP release laid out as the official one (no shared data needed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pasu.corpus.build import read_manifest
from pasu.models.data import load_split
from pasu.slu import Slot


def _slurp_row(slurp_id: int, sentence: str, annotation: str, scenario: str, action: str, intent: str,
               recordings: list[tuple[str, float]]) -> dict:
    """One line of an official dataset/slurp/*.jsonl file (tokens and entities abridged)."""
    return {
        "slurp_id": slurp_id, "sentence": sentence, "sentence_annotation": annotation, "intent": intent,
        "action": action,
        "tokens": [{"surface": w, "id": i, "lemma": w, "pos": "NN"} for i, w in enumerate(sentence.split())],
        "scenario": scenario,
        "recordings": [{"file": f, "wer": wer, "ent_wer": None, "status": "correct"} for f, wer in recordings],
        "entities": [],
    }


ROWS = {
    "train": [
        _slurp_row(1, "wake me up at five am this week", "wake me up at [time : five am] [date : this week]",
                   "alarm", "set", "alarm_set",
                   [("audio-1490000001.flac", 0.25), ("audio-1490000001-headset.flac", 0.0)]),
        # its only recording is missing from the audio folder
        _slurp_row(2, "what's the weather in Paris", "what's the weather in [place_name : Paris]",
                   "weather", "query", "weather_query", [("audio-1490000002.flac", 0.0)]),
    ],
    "devel": [
        _slurp_row(13804, "siri what is one american dollar in japanese yen",
                   "siri what is one [currency_name : american dollar] in [currency_name : japanese yen]",
                   "qa", "currency", "qa_currency",
                   [("audio-1434542201-headset.flac", 0.0), ("audio-1434542201.flac", 0.0)]),
    ],
    # SLURP's intent field sometimes holds the action alone: the label is rebuilt as scenario_action
    "test": [
        _slurp_row(16421, "how many unread emails do i have", "how many unread emails do i have",
                   "email", "query", "query", [("audio-1500000003.flac", 0.5), ("audio-1500000003-headset.flac", 0.1)]),
    ],
    "train_synthetic": [
        _slurp_row(3, "turn off the lights", "turn off the lights", "iot", "hue_lightoff", "iot_hue_lightoff",
                   [("audio--1504190166.flac", 0.0)]),
    ],
}
MISSING = "audio-1490000002.flac"


@pytest.fixture
def slurp(tmp_path: Path) -> Path:
    """dataset/slurp/*.jsonl, metadata.json and audio/slurp_{real,synth}/*.flac, one recording missing."""
    root = tmp_path / "slurp"
    text_dir = root / "dataset" / "slurp"
    text_dir.mkdir(parents=True)
    for name, rows in ROWS.items():
        (text_dir / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = {"1": {"recordings": {"audio-1490000001-headset.flac": {"usrid": "FA-0042"}}}}
    (text_dir / "metadata.json").write_text(json.dumps(meta))
    rng = np.random.default_rng(0)
    for name, rows in ROWS.items():
        folder = root / "audio" / ("slurp_synth" if name == "train_synthetic" else "slurp_real")
        folder.mkdir(parents=True, exist_ok=True)
        for rec in (rec for row in rows for rec in row["recordings"] if rec["file"] != MISSING):
            sf.write(folder / rec["file"], 0.1 * rng.standard_normal(8000).astype(np.float32), 16000)
    return root


def test_import_writes_manifests_that_training_reads(slurp, tmp_path, pasu_corpus):
    out = tmp_path / "corpus"
    rc, printed = pasu_corpus("import-slurp", "--slurp-dir", str(slurp), "--out", str(out))
    assert rc == 0, printed

    train, dev, test = (load_split(out, split) for split in ("train", "dev", "test"))
    assert [u.id for u in train] == ["slurp-train-audio-1490000001", "slurp-train-audio-1490000001-headset"]
    assert len(dev) == 2 and len(test) == 2
    for utt in train + dev + test:
        assert utt.audio.is_file() and utt.duration == pytest.approx(0.5)
    assert train[0].intent == "alarm_set"
    assert train[0].slots == (Slot("time", "five am"), Slot("date", "this week"))
    assert train[0].text == "wake me up at five am this week"
    assert dev[0].slots == (Slot("currency_name", "american dollar"), Slot("currency_name", "japanese yen"))
    assert {u.intent for u in test} == {"email_query"} and test[0].slots == ()
    assert not (out / "test_unseen.jsonl").exists()

    rows = read_manifest(out / "train.jsonl")
    assert {r["engine"] for r in rows} == {"real"}
    assert [r["voice"] for r in rows] == ["slurp", "slurp:FA-0042"]  # speaker from metadata.json where known
    assert Path(rows[0]["audio"]).is_absolute()  # the audio stays where SLURP put it


def test_missing_audio_is_reported_not_fatal(slurp, tmp_path, pasu_corpus):
    out = tmp_path / "corpus"
    rc, printed = pasu_corpus("import-slurp", "--slurp-dir", str(slurp), "--out", str(out))
    assert rc == 0
    assert f"train: 1 audio files missing, e.g. {slurp.resolve() / 'audio' / 'slurp_real' / MISSING}" in printed
    summary = json.loads((out / "import.json").read_text())["splits"]
    assert summary["train"]["missing"] == 1 and summary["train"]["sentences_without_audio"] == 1
    assert summary["dev"]["missing"] == 0 and summary["dev"]["utterances"] == 2


def test_best_recording_is_the_lowest_wer_one(slurp, tmp_path, pasu_corpus):
    out = tmp_path / "corpus"
    rc, printed = pasu_corpus("import-slurp", "--slurp-dir", str(slurp), "--out", str(out), "--recordings", "best")
    assert rc == 0, printed
    assert [u.id for u in load_split(out, "train")] == ["slurp-train-audio-1490000001-headset"]
    assert [u.id for u in load_split(out, "test")] == ["slurp-test-audio-1500000003-headset"]
    assert len(load_split(out, "dev")) == 1  # a tie: the first listed


def test_synthetic_training_audio_on_request(slurp, tmp_path, pasu_corpus):
    out = tmp_path / "corpus"
    rc, printed = pasu_corpus("import-slurp", "--slurp-dir", str(slurp), "--out", str(out), "--synthetic", "--splits", "train")
    assert rc == 0, printed
    rows = read_manifest(out / "train.jsonl")
    assert rows[-1]["id"] == "slurp-train_synthetic-audio--1504190166"
    assert (rows[-1]["engine"], rows[-1]["intent"]) == ("slurp_synth", "iot_hue_lightoff")
    assert not (out / "dev.jsonl").exists()


def test_no_audio_at_all_is_an_error(slurp, tmp_path, pasu_corpus):
    rc, printed = pasu_corpus("import-slurp", "--slurp-dir", str(slurp), "--out", str(tmp_path / "corpus"),
                          "--audio-dir", str(tmp_path / "nowhere"))
    assert rc == 2 and "no usable audio found" in printed
    assert not (tmp_path / "corpus").exists()
