"""`pasu corpus build` end to end on the project's own sample text, with the real TTS engines."""

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import soundfile as sf

from pasu.corpus.build import BuildOptions, Shard, _interleaved, build_corpus, read_manifest
from pasu.corpus.plan import PRESETS, SPLITS, Job
from pasu.corpus.text import PSEUDO_SOURCE, Sentence, load_corpus_text, samples_dir, write_sentences
from pasu.settings import shipped_model

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                reason="needs the TTS engines: run scripts/install_tts.sh (make test does)")

CONFIGS = Path(__file__).parents[2] / "models" / "configs"
ROW_FIELDS = {"id", "audio", "duration", "engine", "voice", "augmentation", "text", "scenario", "action",
              "intent", "slots", "sentence_id", "source", "rate", "pitch"}


def _pasu(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pasu.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus") / "tiny"
    proc = _pasu("corpus", "build", "--preset", "tiny", "--samples", "--out", str(out), "--workers", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_tiny_build_writes_every_split_with_complete_rows(tiny):
    for split in SPLITS:
        rows = read_manifest(tiny / f"{split}.jsonl")
        assert rows, split
        for row in rows:
            assert set(row) == ROW_FIELDS
            audio, sr = sf.read(tiny / row["audio"], dtype="float32")
            assert sr == 16000 and audio.ndim == 1
            assert abs(len(audio) / sr - row["duration"]) < 1e-3
            assert 0.3 < row["duration"] < 20
            assert row["intent"] == f"{row['scenario']}_{row['action']}"
    train = read_manifest(tiny / "train.jsonl")
    assert len(train) == PRESETS["tiny"].train_utterances
    assert len({r["voice"] for r in train}) >= 25


def test_unseen_voices_are_held_out_of_training(tiny):
    voices = {s: {r["voice"] for r in read_manifest(tiny / f"{s}.jsonl")} for s in SPLITS}
    assert voices["test_unseen"].isdisjoint(voices["train"] | voices["dev"] | voices["test"])


def test_report_summarizes_the_build(tiny):
    report = json.loads((tiny / "report.json").read_text())
    assert report["splits"]["train"]["utterances"] == PRESETS["tiny"].train_utterances
    assert sum(report["snr_histogram_db"].values()) > 0
    assert (tiny / "snr_hist.png").stat().st_size > 1000
    assert "| train |" in (tiny / "report.md").read_text()


def test_the_corpus_commands_run_alone_as_a_module(tiny):
    """`python -m pasu.corpus.cli`: what a lent GPU machine without the rest of PASU's dependencies runs."""
    proc = subprocess.run([sys.executable, "-m", "pasu.corpus.cli", "report", str(tiny)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| train |" in proc.stdout


def test_shards_are_rendered_round_robin_over_voices_so_an_early_reader_hears_every_voice():
    def shard(voice: str, k: int, size: int) -> Shard:
        job = Job(utt_id=f"{voice}-{k}", split="train", sentence=None, voice_id=voice, rate=1.0, pitch=1.0, seed=0)
        return Shard(f"train--{voice}--{k:03d}", (job,) * size)

    shards = [shard("a", 0, 150), shard("a", 1, 150), shard("a", 2, 20), shard("b", 0, 150), shard("c", 0, 90),
              shard("c", 1, 10)]
    order = [s.name for s in _interleaved(shards)]
    assert order == ["train--a--000", "train--b--000", "train--c--000",  # every voice in the first round
                     "train--a--001", "train--c--001", "train--a--002"]
    assert sorted(order) == sorted(s.name for s in shards)


def test_rebuild_resumes_only_missing_shards_and_gives_the_same_manifests(tiny):
    before = {s: (tiny / f"{s}.jsonl").read_text() for s in SPLITS}
    shard = sorted((tiny / "shards").glob("dev--*.jsonl"))[0]
    shard.unlink()
    proc = _pasu("corpus", "build", "--preset", "tiny", "--samples", "--out", str(tiny), "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "1 to render" in proc.stderr
    assert {s: (tiny / f"{s}.jsonl").read_text() for s in SPLITS} == before


def test_a_different_preset_in_the_same_folder_is_refused(tiny):
    proc = _pasu("corpus", "build", "--preset", "small", "--samples", "--out", str(tiny))
    assert proc.returncode != 0
    assert "another preset" in proc.stderr


def test_a_voice_that_is_not_installed_is_skipped_and_named(tmp_path):
    preset = replace(PRESETS["tiny"], train_utterances=12, dev_sentences=3, test_sentences=3, babble_clips=2,
                     min_unseen_voices=1)
    voices = ("espeak:en-us+m1", "espeak:en-gb+f2", "espeak:en-us+f3", "festival:no_such_voice")
    report = build_corpus(BuildOptions(preset, samples_dir(), tmp_path / "c", workers=1, voices=voices))
    assert report["voices"]["not_installed"] == ["festival:no_such_voice"]
    assert "festival:no_such_voice" in (tmp_path / "c" / "report.md").read_text()
    assert sum(s["utterances"] for s in report["splits"].values()) > 0
    for split in SPLITS:
        for row in read_manifest(tmp_path / "c" / f"{split}.jsonl"):
            assert row["voice"] != "festival:no_such_voice"
            assert (tmp_path / "c" / row["audio"]).exists()


def test_a_sentence_a_voice_cannot_render_is_reported_and_the_build_goes_on(tmp_path, monkeypatch):
    from pasu.corpus import tts

    render_many = tts.Renderer.render_many

    def failing_on_alarms(self, items):  # an engine error on some sentences, as a crashing TTS gives
        out = render_many(self, items)
        texts = [i.text if isinstance(i, tts.RenderItem) else i[0] for i in items]
        return [tts.TTSError("engine crashed") if "alarm" in t else a for t, a in zip(texts, out)]

    monkeypatch.setattr(tts.Renderer, "render_many", failing_on_alarms)
    preset = replace(PRESETS["tiny"], train_utterances=12, dev_sentences=3, test_sentences=3, babble_clips=2,
                     min_unseen_voices=1)
    voices = ("espeak:en-us+m1", "espeak:en-gb+f2", "espeak:en-us+f3")
    report = build_corpus(BuildOptions(preset, samples_dir(), tmp_path / "c", workers=1, voices=voices))
    rows = [r for split in SPLITS for r in read_manifest(tmp_path / "c" / f"{split}.jsonl")]
    assert report["render_failures"] > 0 and rows
    assert all("alarm" not in r["text"] for r in rows)
    assert all(e["error"] == "engine crashed" for e in report["failure_examples"])


def test_missing_shared_data_gives_a_clear_message(tmp_path):
    proc = _pasu("corpus", "build", "--preset", "tiny", "--data-dir", str(tmp_path / "nowhere"),
                 "--out", str(tmp_path / "c"))
    assert proc.returncode == 2
    assert "--samples" in proc.stderr and "nowhere" in proc.stderr
    assert not (tmp_path / "c" / "train.jsonl").exists()


def test_a_training_variant_builds_beside_the_corpus_not_into_it(tiny, tmp_path):
    proc = _pasu("corpus", "build", "--preset", "tiny", "--samples", "--out", str(tiny), "--train-variant", "1")
    assert proc.returncode != 0
    assert "variant" in proc.stderr

    out = tmp_path / "variant1"
    proc = _pasu("corpus", "build", "--preset", "tiny", "--samples", "--out", str(out), "--train-variant", "1",
                 "--splits", "train", "--workers", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, variant = (json.loads((folder / "build.json").read_text()) for folder in (tiny, out))
    assert variant["train_variant"] == 1 and variant["unseen_voices"] == first["unseen_voices"]
    rows, old = read_manifest(out / "train.jsonl"), read_manifest(tiny / "train.jsonl")
    assert len(rows) == len(old) and {r["id"] for r in rows}.isdisjoint(r["id"] for r in old)
    assert all((out / r["audio"]).is_file() for r in rows)
    # only the rendered split has a manifest: an empty dev.jsonl would read as a corpus with no dev utterances
    assert sorted(p.name for p in out.glob("*.jsonl")) == ["train.jsonl"]
    proc = _pasu("eval", str(shipped_model("device")), "--corpus", str(out), "--splits", "train,dev")
    assert proc.returncode == 1 and "no 'dev' split" in proc.stderr and "Traceback" not in proc.stderr
    proc = _pasu("train", "--config", str(CONFIGS / "device_late_context.yaml"), "--corpus", str(out),
                 "--out", str(tmp_path / "exp"), "--max-steps", "1")
    assert proc.returncode == 1 and "no 'dev' split" in proc.stderr and "Traceback" not in proc.stderr


def test_a_training_text_file_is_rendered_as_the_training_split(tiny, tmp_path):
    dev = load_corpus_text(samples_dir()).dev
    pseudo = [Sentence("pseudo-1", "tell me a joke about penguins", "general", "joke", "general_joke", None,
                       PSEUDO_SOURCE),
              Sentence("pseudo-2", "good morning pasu", "general", "greet", "general_greet", None, PSEUDO_SOURCE)]
    text_file = tmp_path / "pseudo.jsonl"
    write_sentences(text_file, pseudo)
    out = tmp_path / "p4"
    build = ("corpus", "build", "--preset", "tiny", "--samples", "--train-variant", "4", "--splits", "train",
             "--voices", str(tiny / "build.json"), "--train-utterances", "6", "--workers", "2")
    proc = _pasu(*build, "--out", str(out), "--train-text", str(text_file))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = read_manifest(out / "train.jsonl")
    assert len(rows) == 6 and sorted({r["sentence_id"] for r in rows}) == ["pseudo-1", "pseudo-2"]
    assert {(r["source"], r["slots"]) for r in rows} == {(PSEUDO_SOURCE, None)}
    info, first = (json.loads((folder / "build.json").read_text()) for folder in (out, tiny))
    assert info["train_text"] == str(text_file) and info["unseen_voices"] == first["unseen_voices"]

    other = tmp_path / "other.jsonl"
    write_sentences(other, pseudo[:1])
    proc = _pasu(*build, "--out", str(out), "--train-text", str(other))
    assert proc.returncode != 0 and "training text" in proc.stderr

    # an evaluation sentence in the training text would void dev/test: refused before anything is rendered
    write_sentences(other, [replace(dev[0], id="leak", source=PSEUDO_SOURCE)])
    proc = _pasu(*build, "--out", str(tmp_path / "leak"), "--train-text", str(other))
    assert proc.returncode == 2 and "also in train" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "leak" / "train.jsonl").exists()
