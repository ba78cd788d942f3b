"""`pasu eval`: a packaged model decodes corpus splits and its scores land in a JSON file."""

import json
import subprocess
import sys

import pytest
import torch

from pasu.models.data import load_split, write_synthetic_corpus
from pasu.models.evaluate import evaluate_split
from pasu.models.package import package_model
from pasu.models.recognizer import Recognition
from pasu.models.tokenizer import TokenizerOptions
from pasu.models.train import DataOptions, EvalOptions, ExperimentConfig, OptimOptions, TrainOptions, train


@pytest.fixture(scope="module")
def corpus_and_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    corpus = write_synthetic_corpus(root / "corpus", n_train=6, n_dev=3)
    config = ExperimentConfig(
        model={"encoder": "late_context",
               "encoder_conf": dict(output_size=32, num_conv_blocks=1, num_attn_blocks=1, cgmlp_linear_units=64,
                                    attention_heads=2),
               "decoder_conf": dict(linear_units=64, attention_heads=2),
               "model_conf": dict(report_cer=False, report_wer=False)},
        tokenizer=TokenizerOptions(vocab_size=50),
        data=DataOptions(batch_seconds=6.0, stats_utterances=4),
        optim=OptimOptions(warmup_steps=1),
        train=TrainOptions(max_epochs=None, max_steps=2, num_threads=1, checkpoint_minutes=60),
        eval=EvalOptions(interval_steps=1, interval_minutes=None, keep_best=2),
    )
    before = torch.get_num_threads()
    train(config, corpus, root / "exp")
    torch.set_num_threads(before)
    return corpus, package_model(root / "exp", root / "model")


def test_eval_command_writes_scores_per_split(corpus_and_model, tmp_path):
    corpus, model = corpus_and_model
    out = tmp_path / "eval.json"
    proc = subprocess.run([sys.executable, "-m", "pasu.cli", "eval", str(model), "--corpus", str(corpus),
                           "--splits", "dev", "--beam", "2", "--threads", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    scores = json.loads(out.read_text())["dev"]
    assert scores["n"] == 3
    assert 0.0 <= scores["intent_accuracy"] <= 1.0 and scores["wer"] >= 0.0
    assert scores["decode_rtf"] > 0


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
    scores = evaluate_split(_Oracle(utterances), utterances)
    assert scores["wer"] == 0.0 and scores["intent_accuracy"] == 1.0 and scores["n"] == len(utterances)
