"""`pasu train`: configs, LR schedule, a few real steps, resume, snapshot averaging, stopping early, the CLI."""

import dataclasses
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

import pasu_tests_cloud_support as support  # loaded by tests/conftest.py
from pasu.models.build import build_asr_model
from pasu.models.checkpoints import average_state_dicts
from pasu.models.data import SpeechDataset, collate, load_split, sample_global_stats, write_synthetic_corpus
from pasu.models.targets import encode_target, target_symbols
from pasu.models.tokenizer import Tokenizer, TokenizerOptions
from pasu.models.train import (
    EvalOptions,
    ExperimentConfig,
    OptimOptions,
    TrainOptions,
    DataOptions,
    FirstTokenLoss,
    STOP_FILE,
    config_from_dict,
    learning_rate,
    load_config,
    train,
    training_utterances,
)

CONFIGS = Path(__file__).parents[2] / "models" / "configs"
TINY_MODEL = {**support.TINY_MODEL, "model_conf": dict(report_cer=False, report_wer=False)}


def tiny_config(**train) -> ExperimentConfig:
    return ExperimentConfig(
        model=TINY_MODEL,
        tokenizer=TokenizerOptions(vocab_size=60),
        data=DataOptions(batch_seconds=6.0, stats_utterances=8),
        optim=OptimOptions(lr=2e-3, warmup_steps=2),
        train=TrainOptions(**{"max_epochs": None, "num_threads": 1, "log_interval_steps": 1,
                              "checkpoint_minutes": 60, **train}),
        eval=EvalOptions(interval_steps=2, interval_minutes=None, dev_utterances=3, keep_best=2),
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_synthetic_corpus(tmp_path_factory.mktemp("corpus"), n_train=10, n_dev=3)


def test_extra_corpora_add_their_training_utterances_when_they_hold_out_the_same_voices(tmp_path):
    main = write_synthetic_corpus(tmp_path / "main", n_train=4, n_dev=2)
    extra = write_synthetic_corpus(tmp_path / "extra", n_train=3, n_dev=2)
    for folder, unseen in ((main, ["espeak:en+f1"]), (extra, ["espeak:en+f1"])):
        (folder / "build.json").write_text(json.dumps({"unseen_voices": unseen}))
    data = DataOptions(extra_corpora=(str(extra),))
    utterances = training_utterances(main, data)
    assert len(utterances) == 7
    assert {u.audio.parent.parent for u in utterances} == {main.resolve(), extra.resolve()}
    assert all(u.audio.is_file() for u in utterances)

    (extra / "build.json").write_text(json.dumps({"unseen_voices": ["espeak:en+m3"]}))
    with pytest.raises(ValueError, match="test_unseen voices in training"):
        training_utterances(main, data)


def test_extra_corpora_are_set_from_the_command_line(tmp_path):
    config = load_config(CONFIGS / "device_late_context.yaml", ["data.extra_corpora=[a, b]"])
    assert config.data.extra_corpora == ("a", "b")


# --- Config and schedule ----------------------------------------------------------------------------


@pytest.mark.parametrize("name, low, high", [
    ("device_late_context", 3e6, 5e6), ("baseline_conformer", 3e6, 5e6), ("baseline_branchformer", 3e6, 5e6),
    ("baseline_streaming", 3e6, 6e6), ("cloud", 12e6, 25e6),  # float16 weights under the 50 MB file limit
])
def test_shipped_configs_load_and_are_sized(name, low, high):
    config = load_config(CONFIGS / f"{name}.yaml")
    tokens = ["<blank>", "<unk>", *[f"t{i}" for i in range(298)], "<sos/eos>"]  # ~300 tokens as trained
    model = build_asr_model({**config.model, "token_list": tokens, "specaug": "specaug"})
    assert low < sum(p.numel() for p in model.parameters()) < high


@pytest.mark.parametrize("name", ["device_late_context", "baseline_conformer", "baseline_branchformer",
                                  "baseline_streaming"])
def test_shipped_configs_have_finite_gradients_on_padded_batches(name, corpus):
    """Regression: xavier init + LateContextEncoder gave a non-finite gradient on every padded batch."""
    torch.manual_seed(0)
    config = load_config(CONFIGS / f"{name}.yaml")
    utts = load_split(corpus, "train")[:3]  # three different lengths: two of them padded
    symbols = target_symbols({u.intent for u in utts}, {s.type for u in utts for s in u.slots or ()})
    tok = Tokenizer.train([u.text for u in utts], symbols, TokenizerOptions(vocab_size=40))
    mean, std = sample_global_stats(utts)
    model = build_asr_model({**config.model, "token_list": tok.token_list, "stats": {"mean": mean, "std": std}})
    ds = SpeechDataset(utts, tok)
    loss, _, _ = model(**collate([ds[i] for i in range(len(ds))]).model_inputs())
    loss.backward()
    assert torch.isfinite(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9))


def test_branchformer_baseline_exposes_branch_weights():
    config = load_config(CONFIGS / "baseline_branchformer.yaml")
    assert config.model["encoder_conf"]["merge_method"] == "learned_ave"
    assert config.model["encoder_conf"]["num_blocks"] == 9


def test_unknown_config_keys_fail():
    with pytest.raises(ValueError, match="optim"):
        config_from_dict({"model": {}, "optim": {"learning_rate": 1.0}})
    with pytest.raises(ValueError, match="sections"):
        config_from_dict({"model": {}, "trainer": {}})


def test_learning_rate_schedules():
    noam = OptimOptions(lr=1e-3, warmup_steps=100, scheduler="noam")
    assert learning_rate(50, noam, None) == pytest.approx(5e-4)
    assert learning_rate(100, noam, None) == pytest.approx(1e-3)  # peak at the end of warmup
    assert learning_rate(400, noam, None) == pytest.approx(5e-4)  # 1/sqrt decay
    lin = dataclasses.replace(noam, scheduler="warmup_linear")
    assert learning_rate(550, lin, 1000) == pytest.approx(5e-4) and learning_rate(1000, lin, 1000) == 0.0


# --- Training -------------------------------------------------------------------------------------------


def _tiny_model_and_batch(corpus):
    """A tiny model with its tokenizer and one batch of the first four training utterances."""
    utts = load_split(corpus, "train")[:4]
    symbols = target_symbols({u.intent for u in utts}, {s.type for u in utts for s in u.slots or ()})
    tok = Tokenizer.train([u.text for u in utts], symbols, TokenizerOptions(vocab_size=40))
    mean, std = sample_global_stats(utts)
    model = build_asr_model({**TINY_MODEL, "token_list": tok.token_list, "stats": {"mean": mean, "std": std}})
    ds = SpeechDataset(utts, tok)
    return model, tok, collate([ds[i] for i in range(len(ds))])


def test_loss_decreases_on_a_repeated_batch(corpus):
    torch.manual_seed(0)
    model, _, batch = _tiny_model_and_batch(corpus)
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    losses = []
    for _ in range(15):
        loss, _, _ = model(**batch.model_inputs())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]


def test_first_token_loss_is_the_intents_cross_entropy_from_the_same_pass(corpus):
    torch.manual_seed(0)
    model, tok, batch = _tiny_model_and_batch(corpus)
    model.eval()
    for module in model.modules():  # no dropout: the hooked training pass and the check's see the same network
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    intent_loss = FirstTokenLoss(model.decoder)
    inputs = batch.model_inputs()
    with torch.no_grad():
        model(**inputs)  # evaluation passes keep nothing
        with pytest.raises(RuntimeError, match="training pass"):
            intent_loss(inputs["text"])
        model.decoder.train()
        model(**inputs)
        got = intent_loss(inputs["text"])
        model.decoder.eval()
        # the decoder's own logits at the first position, from <sos> alone
        encoded, lengths = model.encode(inputs["speech"], inputs["speech_lengths"])
        sos = torch.full((len(lengths), 1), model.sos)
        logits, _ = model.decoder(encoded, lengths, sos, torch.ones(len(lengths), dtype=torch.long))
    intents = inputs["text"][:, 0]
    assert all(tok.token_list[int(t)] in {u.intent for u in load_split(corpus, "train")} for t in intents)
    expected = torch.nn.functional.cross_entropy(logits[:, 0], intents)
    assert torch.allclose(got, expected, atol=1e-5)


def test_intent_loss_weight_trains_the_intent_and_is_logged(corpus, tmp_path):
    exp = tmp_path / "exp"
    train(tiny_config(max_steps=2, intent_loss_weight=2.0), corpus, exp)
    lines = _log(exp, "train")
    assert [r["step"] for r in lines] == [1, 2] and all(r["loss_intent"] > 0 for r in lines)
    plain = tmp_path / "plain"
    train(tiny_config(max_steps=1), corpus, plain)
    assert "loss_intent" not in _log(plain, "train")[0]

    # on a repeated batch the weighted loss lowers the intent's cross-entropy faster than ESPnet's alone
    def intent_ce_after(weight: float) -> float:
        torch.manual_seed(0)
        model, _, batch = _tiny_model_and_batch(corpus)
        intent_loss = FirstTokenLoss(model.decoder)
        opt = torch.optim.Adam(model.parameters(), lr=5e-3)
        for _ in range(8):
            loss, _, _ = model(**batch.model_inputs())
            loss = loss + weight * intent_loss(batch.text)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            model(**batch.model_inputs())
            return float(intent_loss(batch.text))

    assert intent_ce_after(5.0) < intent_ce_after(0.0)


def _log(exp: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (exp / "log.jsonl").read_text().splitlines()) if r["kind"] == kind]


def test_train_resume_and_average(corpus, tmp_path):
    exp = tmp_path / "exp"
    first = train(tiny_config(max_steps=3), corpus, exp, command="pasu train ...")
    assert first.steps == 3 and (exp / "checkpoint.pt").exists()
    assert [r["step"] for r in _log(exp, "train")] == [1, 2, 3]
    assert first.seconds_per_step > 0 and first.final_dev is not None

    second = train(tiny_config(max_steps=5), corpus, exp)  # same command, more steps: resumes
    assert second.steps == 5
    assert [r["step"] for r in _log(exp, "train")] == [1, 2, 3, 4, 5]  # continued, not restarted
    assert yaml.safe_load((exp / "config.yaml").read_text())["train"]["max_steps"] == 5  # the options in effect
    ckpt = torch.load(exp / "checkpoint.pt", weights_only=False)
    assert ckpt["state"]["step"] == 5

    # dev evaluations at 2, 3 (end of run 1), 4, 5: the best 2 are kept and averaged
    assert [r["step"] for r in _log(exp, "dev")] == [2, 3, 4, 5]
    snapshots = sorted((exp / "snapshots").iterdir())
    assert len(snapshots) == 2 and {s.name for s in snapshots} == {b[2] for b in ckpt["state"]["best"]}
    avg = torch.load(exp / "model_avg.pt", weights_only=True)
    expected = average_state_dicts(snapshots)
    assert all(torch.equal(avg[k], expected[k]) for k in avg)
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["steps"] == 5 and len(summary["averaged_steps"]) == 2

    # a resumed run reproduces an uninterrupted one exactly (data order, dropout and SpecAugment RNG)
    straight = tmp_path / "straight"
    train(tiny_config(max_steps=5), corpus, straight)
    a = torch.load(exp / "checkpoint.pt", weights_only=False)["model"]
    b = torch.load(straight / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_resume_that_changes_what_the_run_learns_with_is_warned_recorded_and_carried_to_the_card(
        corpus, tmp_path, caplog):
    from pasu.models.package import package_model

    exp = tmp_path / "exp"
    train(tiny_config(max_steps=2), corpus, exp, command="pasu train first")
    more = tiny_config(max_steps=3, max_minutes=30.0)  # run length only: nothing to warn about
    train(more, corpus, exp, command="pasu train longer")
    changed = dataclasses.replace(more, optim=dataclasses.replace(more.optim, lr=5e-4), train=dataclasses.replace(
        more.train, max_steps=4))
    with caplog.at_level("WARNING", logger="pasu.models.train"):
        train(changed, corpus, exp, command="pasu train other lr")
    assert "optim.lr 0.002 -> 0.0005" in caplog.text and "train.max_steps 3 -> 4" in caplog.text

    starts = json.loads((exp / "run.json").read_text())["starts"]
    assert [(s["step"], s["command"]) for s in starts] == [
        (0, "pasu train first"), (2, "pasu train longer"), (3, "pasu train other lr")]
    assert starts[1]["changed"] == {"train.max_steps": [2, 3]}
    assert starts[2]["changed"] == {"optim.lr": [0.002, 0.0005], "train.max_steps": [3, 4]}

    package = package_model(exp, tmp_path / "pkg")
    training = yaml.safe_load((package / "config.yaml").read_text())["training"]
    assert [s["step"] for s in training["changed_on_resume"]] == [2, 3]
    card = (package / "README.md").read_text()
    assert "- at step 3: `optim.lr` 0.002 -> 0.0005, `train.max_steps` 3 -> 4" in card

    fresh = tmp_path / "fresh"  # a new run starts its record afresh
    train(tiny_config(max_steps=1), corpus, fresh, command="pasu train fresh")
    assert json.loads((fresh / "run.json").read_text())["starts"] == [
        {"step": 0, "command": "pasu train fresh", "changed": {}}]


def test_init_from_a_package_continues_its_weights(corpus, tmp_path):
    from pasu.models.package import load_packaged, package_model

    first = tmp_path / "first"
    train(tiny_config(max_steps=2), corpus, first)
    package = package_model(first, tmp_path / "pkg")
    shipped, tokenizer, _ = load_packaged(package)

    # zero steps: the warm-started model is the package's (float16-rounded) model, with its tokenizer
    warm = tmp_path / "warm"
    train(tiny_config(max_steps=0, init_from=str(package)), corpus, warm)
    restarted, warm_tokenizer, _ = load_packaged(package_model(warm, tmp_path / "pkg2"))
    assert warm_tokenizer.token_list == tokenizer.token_list
    a, b = shipped.state_dict(), restarted.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)

    train(tiny_config(max_steps=2, init_from=str(package)), corpus, warm)  # goes on training from there
    assert json.loads((warm / "summary.json").read_text())["steps"] == 2


def test_a_warm_start_on_a_corpus_with_labels_the_package_lacks_adds_them(corpus, tmp_path, caplog):
    """A corpus with an intent and a slot type the package never saw: they become tokens of their own, not <unk>,
    and every token the package has keeps its trained rows."""
    from pasu.models.package import load_packaged, package_model

    train(tiny_config(max_steps=1), corpus, tmp_path / "first")
    shipped, tokenizer, _ = load_packaged(package_model(tmp_path / "first", tmp_path / "pkg"))
    mine = Path(shutil.copytree(corpus, tmp_path / "mine"))
    rows = [json.loads(line) for line in (mine / "train.jsonl").read_text().splitlines()]
    rows[0].update(intent="iot_thermostat", scenario="iot", action="thermostat",
                   slots=[["room", rows[0]["text"].split()[0]]])
    (mine / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    with caplog.at_level("WARNING", logger="pasu.models.train"):
        train(tiny_config(max_steps=0, init_from=str(tmp_path / "pkg")), mine, tmp_path / "warm")
    assert any("iot_thermostat, SLOT_room" in r.getMessage() for r in caplog.records)
    model, extended, _ = load_packaged(package_model(tmp_path / "warm", tmp_path / "pkg2"))
    assert extended.token_list == [*tokenizer.token_list[:-1], "iot_thermostat", "SLOT_room", "<sos/eos>"]
    target = encode_target(rows[0]["text"], "iot_thermostat", rows[0]["slots"])
    assert extended.unk_id not in extended.encode(target) and extended.decode(extended.encode(target)) == target
    a, b = shipped.state_dict(), model.state_dict()
    assert torch.equal(b["ctc.ctc_lo.weight"][:-3], a["ctc.ctc_lo.weight"][:-1])
    assert all(torch.equal(a[k], b[k]) for k in a if a[k].shape == b[k].shape)


def test_partial_init_warm_starts_another_encoder_from_a_package(corpus, tmp_path):
    """A Branchformer baseline keeps this config's architecture but takes the package's vocabulary and its
    matching weights (which tensors: test_warm_start.py)."""
    from pasu.models.package import load_packaged, package_model

    first = tmp_path / "first"
    train(tiny_config(max_steps=1), corpus, first)
    shipped, tokenizer, _ = load_packaged(package_model(first, tmp_path / "pkg"))
    branchformer = {**TINY_MODEL, "encoder": "branchformer",
                    "encoder_conf": dict(output_size=32, num_blocks=2, cgmlp_linear_units=64, attention_heads=2)}
    config = dataclasses.replace(tiny_config(max_steps=0, init_from=str(tmp_path / "pkg"), init_partial=True),
                                 model=branchformer)
    warm = tmp_path / "warm"
    train(config, corpus, warm)
    model, warm_tokenizer, _ = load_packaged(package_model(warm, tmp_path / "pkg2"))
    assert warm_tokenizer.token_list == tokenizer.token_list
    assert type(model.encoder).__name__ == "BranchformerEncoder"
    assert torch.equal(shipped.state_dict()["ctc.ctc_lo.weight"], model.state_dict()["ctc.ctc_lo.weight"])


@pytest.mark.parametrize("grow_option", ["init_new_decoder_layers_identity", "init_new_conv_blocks_identity"])
def test_growing_from_a_package_needs_init_partial(corpus, tmp_path, grow_option):
    """Without init_partial the package's architecture wins and no layer is new: the option is refused, not
    ignored. (How grown layers start: test_warm_start.py.)"""
    with pytest.raises(ValueError, match="init_partial"):
        train(tiny_config(max_steps=0, init_from=str(tmp_path / "pkg"), **{grow_option: True}), corpus, tmp_path / "x")


def test_time_box_and_overrides(corpus, tmp_path):
    config = load_config(CONFIGS / "device_late_context.yaml",
                         ["optim.lr=0.001", "data.batch_seconds=30", "train.max_minutes=0.5"])
    assert config.optim.lr == 0.001 and config.data.batch_seconds == 30 and config.train.max_minutes == 0.5
    with pytest.raises(ValueError, match="section.field=value"):
        load_config(CONFIGS / "device_late_context.yaml", ["optim.lr"])
    result = train(tiny_config(max_minutes=0.0), corpus, tmp_path / "exp")  # time is up before the first step
    assert result.steps == 0 and result.final_dev is not None and (tmp_path / "exp" / "checkpoint.pt").exists()


def _when_step_logged(exp: Path, step: int, action) -> threading.Thread:
    """A thread that runs `action` once the training log has a train line for `step` (or gives up after 60 s)."""
    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (exp / "log.jsonl").exists() and any(r["step"] >= step for r in _log(exp, "train")):
                action()
                return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("how", ["stop_file", "sigint", "sigterm"])
def test_a_stop_request_ends_the_run_like_a_limit(corpus, tmp_path, how):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / STOP_FILE).touch()  # stale, from an earlier run: must not stop this one
    requests = {"stop_file": lambda: (exp / STOP_FILE).touch(),
                "sigint": lambda: os.kill(os.getpid(), signal.SIGINT),
                "sigterm": lambda: os.kill(os.getpid(), signal.SIGTERM)}
    watcher = _when_step_logged(exp, 2, requests[how])
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    result = train(tiny_config(max_steps=10_000), corpus, exp)
    watcher.join()
    assert 2 <= result.steps < 100  # stopped right after the request, not at the limit
    assert (exp / "model_avg.pt").exists() and result.final_dev is not None  # packaged-ready, as at a limit
    assert json.loads((exp / "summary.json").read_text())["steps"] == result.steps
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # restored


def test_one_command_trains_and_packages(corpus, tmp_path, capsys):
    """`pasu train ... --package DIR`: the run, then its model folder with card, loadable as shipped ones are."""
    import yaml
    from pasu.cli import main
    from pasu.models.package import load_packaged

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_config().to_dict()))
    folder = tmp_path / "models" / "tiny"
    assert main(["train", "--config", str(config), "--corpus", str(corpus), "--out", str(tmp_path / "exp"),
                 "--max-steps", "2", "--package", str(folder)]) == 0
    assert f"wrote {folder}" in capsys.readouterr().out
    card = (folder / "README.md").read_text()
    assert "--max-steps 2" in card and "model_avg.pt" in card  # the command, and the averaged weights it ships
    model, _, packaged = load_packaged(folder)
    assert sum(p.numel() for p in model.parameters()) == packaged["parameters"]


def test_cli_help_has_an_example(capsys):
    from pasu.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    out = capsys.readouterr().out
    assert "pasu train --config" in out and "--corpus" in out
