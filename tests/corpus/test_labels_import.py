"""`pasu corpus import-labels`: your own recordings and a JSONL label file become a corpus that training reads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pasu.corpus.build import read_manifest
from pasu.models.data import load_split, read_audio
from pasu.slu import Slot

LABELS = [
    {"audio": "wav/spk1/0001.wav", "text": "Wake me up at FIVE AM", "intent": "alarm_set",
     "slots": [["time", "five AM"]], "split": "train", "speaker": "spk1"},
    {"audio": "wav/spk2/0001.wav", "text": "what's the weather in Paris?", "intent": "weather_query",
     "slots": [["place_name", "Paris"], ["date", "tomorrow"]], "split": "train"},  # tomorrow is not in the text
    {"audio": "wav/spk1/0002.flac", "text": "turn the heating up in the kitchen", "intent": "iot_thermostat",
     "split": "train"},  # no slots: not annotated
    {"audio": "wav/spk1/0003.wav", "text": "play some jazz", "intent": "play_music", "slots": [], "split": "dev"},
    {"audio": "wav/spk2/0004.wav", "text": "play some jazz", "intent": "play_music", "split": "test"},  # missing
    {"audio": "wav/spk2/0005.wav", "text": "stop", "intent": "audio_stop", "split": "test"},  # not audio
    {"audio": "wav/spk1/0001.wav", "text": "wake me up at five am", "intent": "alarm_set", "split": "train"},
]


@pytest.fixture
def labelled(tmp_path) -> Path:
    """A folder of recordings (16 kHz WAV, 44.1 kHz stereo FLAC, a text file posing as audio) and its labels."""
    root = tmp_path / "mine"
    rng = np.random.default_rng(0)
    for name, rate, channels in (("spk1/0001.wav", 16000, 1), ("spk2/0001.wav", 16000, 1),
                                 ("spk1/0002.flac", 44100, 2), ("spk1/0003.wav", 16000, 1)):
        path = root / "wav" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, 0.1 * rng.standard_normal((rate, channels)).astype(np.float32), rate)
    (root / "wav" / "spk2" / "0005.wav").write_text("not audio")
    _write_labels(root, LABELS)
    return root


def _write_labels(root: Path, rows: list[dict]) -> Path:
    path = root / "labels.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_import_writes_manifests_that_training_reads(labelled, tmp_path, pasu_corpus):
    out = tmp_path / "corpus"
    rc, printed = pasu_corpus("import-labels", str(labelled / "labels.jsonl"), "--out", str(out))
    assert rc == 0
    train = read_manifest(out / "train.jsonl")
    assert [r["id"] for r in train] == ["wav-spk1-0001", "wav-spk2-0001", "wav-spk1-0002"]
    assert train[0]["text"] == "wake me up at five am" and train[0]["slots"] == [["time", "five am"]]
    assert train[0]["voice"] == "spk1" and train[1]["voice"] == "unknown" and train[2]["slots"] is None
    assert Path(train[0]["audio"]).is_absolute() and train[2]["duration"] == pytest.approx(1.0)

    utterances = load_split(out, "train")
    assert utterances[0].slots == (Slot("time", "five am"),)
    assert utterances[0].target == "alarm_set wake me up at SLOT_time five am SLOT_END"
    assert utterances[2].target.split()[:2] == ["iot_thermostat", "SLOTS_UNKNOWN"]  # a label SLURP lacks
    assert read_audio(utterances[2].audio).shape == (16000,)  # 44.1 kHz stereo: mono, resampled
    assert [u.intent for u in load_split(out, "dev")] == ["play_music"]
    assert not (out / "test.jsonl").exists()  # neither of its recordings could be read

    summary = json.loads((out / "import.json").read_text())
    assert summary["splits"]["train"]["utterances"] == 3 and summary["splits"]["train"]["skipped"] == {
        "listed twice": 1}
    assert summary["splits"]["test"]["missing"] == 1
    assert summary["splits"]["test"]["skipped"] == {"unreadable audio": 1}
    assert summary["other_sample_rates"] == {"44100": 1} and summary["slots_not_in_text"] == 1
    assert "0004.wav" in printed and "44100 Hz" in printed and "'tomorrow'" in printed


@pytest.mark.parametrize("row, problem", [
    ({"audio": "a.wav", "text": "hi", "intent": "alarm_set"}, "no split"),
    ({"audio": "a.wav", "text": "hi", "intent": "alarm_set", "split": "valid"}, "split 'valid'"),
    ({"audio": "a.wav", "text": "hi", "intent": "alarm", "split": "train"}, "scenario_action"),
    ({"audio": "a.wav", "text": "?!", "intent": "alarm_set", "split": "train"}, "no words"),
    ({"audio": "a.wav", "text": "hi", "intent": "alarm_set", "split": "train", "slots": [["time"]]}, "pairs"),
])
def test_a_malformed_line_stops_the_import_by_its_number_and_writes_nothing(labelled, tmp_path, pasu_corpus,
                                                                             row, problem):
    labels = _write_labels(labelled, [LABELS[0], row])
    out = tmp_path / "corpus"
    rc, printed = pasu_corpus("import-labels", str(labels), "--out", str(out))
    assert rc == 2 and "labels.jsonl:2: " in printed and problem in printed
    assert not out.exists()


def test_not_json_and_no_audio_at_all_are_errors(labelled, tmp_path, pasu_corpus):
    (labelled / "bad.jsonl").write_text(json.dumps(LABELS[0]) + "\n{oops\n")
    rc, printed = pasu_corpus("import-labels", str(labelled / "bad.jsonl"), "--out", str(tmp_path / "a"))
    assert rc == 2 and "bad.jsonl:2: not JSON" in printed
    rc, printed = pasu_corpus("import-labels", str(_write_labels(labelled, [LABELS[4]])), "--out", str(tmp_path / "b"))
    assert rc == 2 and "no recording could be imported" in printed


def test_two_recordings_with_one_id_are_refused(labelled, tmp_path, pasu_corpus):
    rows = [{**LABELS[0], "id": "same"}, {**LABELS[1], "id": "same"}]
    rc, printed = pasu_corpus("import-labels", str(_write_labels(labelled, rows)), "--out", str(tmp_path / "corpus"))
    assert rc == 2 and "same" in printed and "id" in printed
