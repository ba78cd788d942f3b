"""Knowledge distillation in `pasu train`: the KL term, the teacher's pass, and a run that learns from a teacher."""

import copy
import json
from pathlib import Path

import pytest
import torch
import yaml

from pasu.models.build import build_asr_model
from pasu.models.data import SpeechDataset, collate, load_split
from pasu.models.distill import DecoderDistillation, distillation_loss, load_teacher
from pasu.models.package import package_model
from pasu.models.tokenizer import Tokenizer, TokenizerOptions
from pasu.models.train import DataOptions, EvalOptions, ExperimentConfig, OptimOptions, TrainOptions, train

def test_distillation_loss_is_the_kl_over_real_tokens():
    torch.manual_seed(0)
    teacher, student = torch.randn(2, 5, 7), torch.randn(2, 5, 7)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert float(distillation_loss(teacher, teacher, mask)) == pytest.approx(0.0, abs=1e-6)
    got = distillation_loss(student, teacher, mask)
    expected = torch.nn.functional.kl_div(student.log_softmax(-1)[mask], teacher.log_softmax(-1)[mask],
                                          log_target=True, reduction="batchmean")
    assert float(got) == pytest.approx(float(expected), rel=1e-5)
    padded = student.clone()
    padded[0, 3:] = 100.0  # what the padding's positions hold must not matter
    assert float(distillation_loss(padded, teacher, mask)) == pytest.approx(float(got), rel=1e-6)
    # a higher temperature flattens both sides: the KL of the softened pair, scaled by T^2
    soft = distillation_loss(student, teacher, mask, temperature=2.0)
    expected_soft = 4.0 * distillation_loss(student / 2.0, teacher / 2.0, mask)
    assert float(soft) == pytest.approx(float(expected_soft), rel=1e-5)


@pytest.fixture(scope="module")
def tiny_batch(tiny_experiment):
    """(the tiny experiment's model section, with its tokens and feature statistics; one batch of four training
    utterances) for untrained models of its shape."""
    corpus, exp_dir = tiny_experiment
    config = yaml.safe_load((exp_dir / "config.yaml").read_text())["model"]
    ds = SpeechDataset(load_split(corpus, "train")[:4], Tokenizer(exp_dir / "tokenizer.model"))
    return config, collate([ds[i] for i in range(len(ds))])


def _without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def test_a_copy_of_the_model_as_teacher_gives_zero_and_the_pass_must_come_first(tiny_batch):
    config, batch = tiny_batch
    torch.manual_seed(0)
    model = _without_dropout(build_asr_model(config))
    model.specaug = None  # the teacher reads the input unaugmented; so must the copy's student here
    teacher = copy.deepcopy(model).eval()
    distill = DecoderDistillation(model, teacher)
    inputs = batch.model_inputs()
    model.eval()
    with torch.no_grad():
        model(**inputs)  # evaluation passes keep nothing
    with pytest.raises(RuntimeError, match="training pass"):
        distill(**inputs)
    model.train()
    model(**inputs)
    assert float(distill(**inputs).detach()) == pytest.approx(0.0, abs=1e-5)
    with pytest.raises(RuntimeError):  # one KL per training pass: the logits are taken
        distill(**inputs)


def test_the_distillation_term_pulls_the_decoder_towards_the_teacher(tiny_batch):
    config, batch = tiny_batch
    torch.manual_seed(1)
    teacher = _without_dropout(build_asr_model(config)).eval()  # an untrained, nearly flat teacher

    def kl_before_and_after(ce_weight: float, distill_weight: float) -> tuple[float, float]:
        torch.manual_seed(0)
        model = _without_dropout(build_asr_model(config))
        model.specaug = None  # the same input every step and in the check
        distill = DecoderDistillation(model, teacher)
        opt = torch.optim.Adam(model.parameters(), lr=5e-3)
        kls = []
        for _ in range(30):
            loss, _, _ = model(**batch.model_inputs())
            kl = distill(**batch.model_inputs())
            kls.append(float(kl.detach()))
            opt.zero_grad()
            (ce_weight * loss + distill_weight * kl).backward()
            opt.step()
        return kls[0], kls[-1]

    first, alone = kl_before_and_after(0.0, 1.0)
    assert alone < 0.25 * first
    # beside ESPnet's loss, whose targets pull the decoder away from a flat teacher, it holds the decoder nearer
    assert kl_before_and_after(1.0, 5.0)[1] < 0.85 * kl_before_and_after(1.0, 0.0)[1]


def _config(exp_dir: Path, **train_options) -> ExperimentConfig:
    model = yaml.safe_load((exp_dir / "config.yaml").read_text())["model"]
    return ExperimentConfig(
        model={k: v for k, v in model.items() if k not in ("token_list", "stats")},
        tokenizer=TokenizerOptions(vocab_size=50),
        data=DataOptions(batch_seconds=6.0, stats_utterances=4),
        optim=OptimOptions(warmup_steps=1),
        train=TrainOptions(**{"max_epochs": None, "max_steps": 2, "num_threads": 1, "log_interval_steps": 1,
                              "checkpoint_minutes": 60, **train_options}),
        eval=EvalOptions(interval_steps=2, interval_minutes=None, dev_utterances=3, keep_best=2),
    )


def test_a_run_with_a_teacher_logs_its_distillation_loss(tiny_experiment, tmp_path):
    corpus, exp_dir = tiny_experiment
    package = package_model(exp_dir, tmp_path / "teacher")
    exp = tmp_path / "student"
    train(_config(exp_dir, init_from=str(package), teacher=str(package), distill_weight=1.0), corpus, exp)
    lines = [r for r in map(json.loads, (exp / "log.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert [r["step"] for r in lines] == [1, 2]
    # the student starts as the teacher: only SpecAugment and dropout part them, so the KL is small but there
    assert all(0.0 < r["loss_distill"] < 1.0 for r in lines)


def test_a_teacher_needs_a_weight_and_the_same_tokens(tiny_experiment, tmp_path):
    corpus, exp_dir = tiny_experiment
    package = package_model(exp_dir, tmp_path / "teacher")
    with pytest.raises(ValueError, match="train.teacher and train.distill_weight"):
        train(_config(exp_dir, teacher=str(package)), corpus, tmp_path / "a")
    with pytest.raises(ValueError, match="train.teacher and train.distill_weight"):
        train(_config(exp_dir, distill_weight=0.5), corpus, tmp_path / "b")
    tokens = Tokenizer(package / "tokenizer.model").token_list
    with pytest.raises(ValueError, match="token list differs"):
        load_teacher(package, tokens[:-1] + ["<other>"], torch.device("cpu"))
    teacher = load_teacher(package, tokens, torch.device("cpu"))
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
