"""`pasu eval`: a packaged model decodes corpus splits and its scores land in a JSON file."""

import json
import subprocess
import sys

import pytest

from pasu.models.data import load_split
from pasu.models.evaluate import decode_split, score_split
from pasu.models.package import package_model
from pasu.models.recognizer import Recognition


@pytest.fixture(scope="module")
def corpus_and_model(tiny_experiment, tmp_path_factory):
    corpus, exp_dir = tiny_experiment
    return corpus, package_model(exp_dir, tmp_path_factory.mktemp("eval") / "model")


def test_eval_command_writes_scores_per_split_and_every_answer(corpus_and_model, tmp_path):
    corpus, model = corpus_and_model
    out, hyps = tmp_path / "eval.json", tmp_path / "hyps.jsonl"
    proc = subprocess.run([sys.executable, "-m", "pasu.cli", "eval", str(model), "--corpus", str(corpus),
                           "--splits", "dev", "--beam", "2", "--threads", "1", "--out", str(out),
                           "--hyps", str(hyps)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    scores = json.loads(out.read_text())["dev"]
    assert scores["n"] == 3
    assert 0.0 <= scores["intent_accuracy"] <= 1.0 and scores["wer"] >= 0.0
    assert scores["decode_rtf"] > 0
    rows = [json.loads(line) for line in hyps.read_text().splitlines()]
    assert [r["id"] for r in rows] == [u.id for u in load_split(corpus, "dev")]
    # the answers' own error counts give the WER and its parts that the scores report
    errors = {kind: sum(r[kind] for r in rows) for kind in ("substitutions", "deletions", "insertions")}
    words = sum(r["ref_words"] for r in rows)
    assert sum(errors.values()) / words == pytest.approx(scores["wer"])
    assert errors["deletions"] / words == pytest.approx(scores["deletion_rate"])
    assert {r["split"] for r in rows} == {"dev"} and all(r["seconds"] > 0 for r in rows)


def _eval_dev_as_agent(corpus, model, reader, tmp_path) -> tuple[dict, str]:
    """`pasu eval --as-agent` on dev, the model's offramp folder holding `reader`: the scores and stderr."""
    import shutil

    folder = shutil.copytree(model, tmp_path / "model")
    reader.save(folder / "offramp")
    out = tmp_path / "eval.json"
    proc = subprocess.run([sys.executable, "-m", "pasu.cli", "eval", str(folder), "--corpus", str(corpus),
                           "--splits", "dev", "--beam", "2", "--threads", "1", "--as-agent", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text()), proc.stderr


def test_eval_as_agent_scores_the_devices_answers_with_its_intent_reader(corpus_and_model, small_reader, tmp_path):
    results, _ = _eval_dev_as_agent(*corpus_and_model, small_reader, tmp_path)
    assert results["dev"]["n"] == 3 and 0.0 <= results["dev"]["intent_accuracy"] <= 1.0
    assert "+intent-reader@" in results["model_id"]  # the reader the answers weighed in is named
    assert results["as_agent"] is True  # what the model card says of how they were decoded
    assert "intent_reader" not in results["dev"]  # it did not learn dev: read as it is


def test_eval_as_agent_reads_a_split_its_reader_learned_with_readers_that_did_not(corpus_and_model, tmp_path):
    """A reader fitted on dev's sentences too (`pasu offramp train --reader-learns-split`) would read dev knowing
    the answers: dev is then read by readers refitted from the reader's own sources, each without a fold of dev's
    sentences, and the scores say so."""
    from pasu.device.offramp_cli import fit_intent_reader
    from pasu.models.intent_reader import ReaderOptions

    corpus, model = corpus_and_model
    reader = fit_intent_reader([corpus], ReaderOptions(min_df=1), also_split="dev")
    results, stderr = _eval_dev_as_agent(corpus, model, reader, tmp_path)
    assert results["dev"]["intent_reader"] == "held out by sentence fold" and results["dev"]["n"] == 3
    assert "the intent reader learned these sentences" in stderr


def test_eval_as_agent_refuses_a_folder_that_is_no_device_model(corpus_and_model, tmp_path):
    corpus, _ = corpus_and_model
    (tmp_path / "whisper.yaml").write_text("name: whisper-tiny.en\n")
    proc = subprocess.run([sys.executable, "-m", "pasu.cli", "eval", str(tmp_path), "--corpus", str(corpus),
                           "--splits", "dev", "--as-agent"], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "--as-agent decodes a device model folder" in proc.stderr
    assert "Traceback" not in proc.stderr


class _Oracle:
    """Answers with the manifest's own labels, so the scoring path alone is under test."""

    def __init__(self, utterances):
        self.queue = list(utterances)

    def recognize_batch(self, waveforms):
        u = self.queue.pop(0)
        return [Recognition(u.text, u.intent, u.slots or (), confidence=1.0)]


def test_scores_are_perfect_when_the_recognizer_returns_the_labels(corpus_and_model):
    corpus, _ = corpus_and_model
    utterances = load_split(corpus, "dev")
    scores = score_split(utterances, decode_split(_Oracle(utterances), utterances))
    assert scores["wer"] == 0.0 and scores["intent_accuracy"] == 1.0 and scores["n"] == len(utterances)


def test_eval_on_two_processes_scores_as_one_process_does(corpus_and_model, tmp_path):
    corpus, model = corpus_and_model
    scores = []
    for jobs in ("1", "2"):
        out = tmp_path / f"eval-{jobs}.json"
        proc = subprocess.run([sys.executable, "-m", "pasu.cli", "eval", str(model), "--corpus", str(corpus),
                               "--splits", "dev", "--beam", "2", "--jobs", jobs, "--as-agent", "--out", str(out)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        results = json.loads(out.read_text())
        assert results["jobs"] == int(jobs)
        scores.append({k: results["dev"][k] for k in ("n", "wer", "intent_accuracy", "slu_f1")})
    assert scores[0] == scores[1]


def test_eval_on_two_processes_refuses_a_recognizer_that_cannot_travel(corpus_and_model):
    from pasu.settings import shipped_model

    corpus, _ = corpus_and_model
    proc = subprocess.run([sys.executable, "-m", "pasu.cli", "eval", str(shipped_model("cloud")), "--corpus",
                           str(corpus), "--splits", "dev", "--jobs", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "--jobs 2: this model's recognizer cannot be sent" in proc.stderr
    assert "Traceback" not in proc.stderr
