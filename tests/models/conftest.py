"""A tiny trained experiment shared by the packaging and evaluation tests."""

from pathlib import Path

import pytest

import pasu_tests_cloud_support as support  # loaded by tests/conftest.py
from pasu.models.data import write_synthetic_corpus
from pasu.models.tokenizer import TokenizerOptions
from pasu.models.train import DataOptions, EvalOptions, ExperimentConfig, OptimOptions, TrainOptions, train


@pytest.fixture(scope="session")
def tiny_experiment(tmp_path_factory) -> tuple[Path, Path]:
    """(corpus, EXPDIR) of a 2-step `pasu train` run of a very small late-context model on a synthetic corpus."""
    root = tmp_path_factory.mktemp("tiny_experiment")
    corpus = write_synthetic_corpus(root / "corpus", n_train=6, n_dev=3)
    config = ExperimentConfig(
        model={**support.TINY_MODEL, "model_conf": dict(report_cer=False, report_wer=False)},
        tokenizer=TokenizerOptions(vocab_size=50),
        data=DataOptions(batch_seconds=6.0, stats_utterances=4),
        optim=OptimOptions(warmup_steps=1),
        train=TrainOptions(max_epochs=None, max_steps=2, num_threads=1, checkpoint_minutes=60),
        eval=EvalOptions(interval_steps=1, interval_minutes=None, keep_best=2),
    )
    train(config, corpus, root / "exp", command="pasu train --config c.yaml --corpus corpus --out exp")
    return corpus, root / "exp"
