"""Device fine-tuning on a lent GPU: the pack holds the model's own features (quantized) and the token ids,
split into parts a call carries; training on the parts writes weights the package loads."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from pasu.models.data import load_split, read_audio
from pasu.models.device_finetune import (PACK_INDEX, FinetuneOptions, PackOptions, dequantize, finetune,
                                         finetune_fresh, quantize, read_packs, spread_over_sentences, write_pack)
from pasu.models.package import load_packaged, package_model


@pytest.fixture(scope="module")
def packed(tiny_experiment, tmp_path_factory):
    """(corpus, package, parts, options): a pack of the tiny model whose budget forces a second part."""
    corpus, exp_dir = tiny_experiment
    root = tmp_path_factory.mktemp("device_finetune")
    package = package_model(exp_dir, root / "package")
    options = PackOptions(train_utterances=6, dev_utterances=3, utterances_per_shard=2, workers=1, part_mib=1e3)
    [whole] = write_pack(package, [corpus], root / "whole", options)
    shard = max(f.stat().st_size for f in whole.glob("*.xz")) / 2**20
    options = dataclasses.replace(options, part_mib=2.5 * shard + 0.002)  # about two shards and their rows
    return corpus, package, write_pack(package, [corpus], root / "pack", options), options


def test_the_pack_lists_every_utterance_once_under_the_part_budget(packed):
    corpus, _, parts, options = packed
    assert len(parts) >= 2
    assert all(sum(f.stat().st_size for f in part.iterdir()) / 2**20 <= options.part_mib for part in parts)
    listed = [row for part in parts for row in json.loads((part / PACK_INDEX).read_text())["utterances"]]
    expected = load_split(corpus, "train") + load_split(corpus, "dev")
    assert sorted(r["id"] for r in listed) == sorted(u.id for u in expected)
    first = json.loads((parts[0] / PACK_INDEX).read_text())["utterances"]
    assert {r["split"] for r in first[:3]} == {"dev"}  # dev first, so part0 always has it


def test_the_packed_features_are_the_models_own_within_half_a_step(packed):
    corpus, package, parts, options = packed
    model, tokenizer, _ = load_packaged(package)
    _, train, dev = read_packs(parts, batch_frames=10**6, device=torch.device("cpu"))
    packed_rows = {tuple(t): f for split in (train, dev) for f, lengths, text, text_lengths in split.batches
                   for f, n, t, m in zip(f, lengths, text, text_lengths) for f, t in [(f[:n], t[:m].tolist())]}
    for u in load_split(corpus, "dev"):
        wave = torch.from_numpy(read_audio(u.audio))[None]
        with torch.no_grad():
            own, _ = model._extract_feats(wave, torch.tensor([wave.shape[1]]))
        features = packed_rows[tuple(tokenizer.encode(u.target))]
        assert features.shape == own[0].shape
        assert torch.max(torch.abs(features - own[0].clamp(-127 * options.step, 127 * options.step))) <= (
            options.step / 2 + 1e-5)


def test_quantized_differences_add_back_up_exactly():
    features = np.random.default_rng(0).normal(size=(50, 8)).astype(np.float32) * 2
    restored = dequantize(quantize(features, 0.25), 0.25)
    assert np.max(np.abs(restored - features)) <= 0.125 + 1e-6


def test_a_subset_covers_every_sentence_before_repeating_one():
    rows = [type("U", (), {"target": f"s{i % 5}", "id": i})() for i in range(20)]
    chosen = spread_over_sentences(rows, 7, seed=1)
    assert len(chosen) == 7 and len({u.target for u in chosen[:5]}) == 5
    assert spread_over_sentences(rows, 7, seed=1) == chosen


def test_finetuning_writes_float16_weights_the_package_loads(packed, tmp_path):
    _, package, parts, _ = packed
    options = FinetuneOptions(minutes=0.02, batch_frames=2000, lr=1e-3, warmup_steps=1, eval_seconds=0.1,
                              average_last=2)
    summary = finetune(parts, package, tmp_path / "run", options)
    assert summary["steps"] >= 1 and summary["train_utterances"] == 6 and summary["dev_utterances"] == 3
    assert summary["best_dev_loss"] <= summary["initial_dev_loss"]
    _assert_loadable_weights(package, tmp_path / "run", summary)


def _assert_loadable_weights(package, run, summary) -> None:
    model, _, _ = load_packaged(package)
    for name in ("best.pt", "avg.pt"):
        state = torch.load(run / name, weights_only=True)
        assert state.keys() == model.state_dict().keys()
        params = dict(model.named_parameters())
        assert all(v.dtype == torch.float16 for k, v in state.items() if k in params)
        model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    assert json.loads((run / "summary.json").read_text())["steps"] == summary["steps"]


def test_fresh_training_reads_a_build_as_it_renders_and_writes_weights_the_package_loads(packed, tmp_path):
    corpus, package, parts, _ = packed
    build = tmp_path / "build"
    (build / "shards").mkdir(parents=True)
    rows = [json.loads(line) for line in (corpus / "train.jsonl").read_text().splitlines()]
    (build / "shards" / "train--tone--000.jsonl").write_text(
        "".join(json.dumps({**r, "audio": str(corpus / r["audio"])}) + "\n" for r in rows))
    options = FinetuneOptions(minutes=0.02, lr=1e-3, warmup_steps=1, eval_seconds=0.1, average_last=2,
                              batch_seconds=20.0, first_utterances=len(rows), wait_seconds=10.0)
    summary = finetune_fresh(parts[:1], [build], package, tmp_path / "run", options)
    assert summary["steps"] >= 1 and summary["dev_utterances"] == 3
    assert summary["fresh"]["utterances"] == len(rows) == 6 and summary["fresh"]["mean_times_heard"] > 0
    _assert_loadable_weights(package, tmp_path / "run", summary)


def test_fresh_training_gives_up_on_a_build_that_renders_nothing(packed, tmp_path):
    _, package, parts, _ = packed
    options = FinetuneOptions(first_utterances=1, wait_seconds=0.3)
    with pytest.raises(RuntimeError, match="is `pasu corpus build` rendering there"):
        finetune_fresh(parts[:1], [tmp_path / "nothing"], package, tmp_path / "run", options)


def test_perturbing_stretches_time_and_mel_axes_and_keeps_padding_silent():
    from pasu.models.device_finetune import perturb
    from pasu.models.frontend import GlobalNormalize

    torch.manual_seed(0)
    normalize = GlobalNormalize(8, mean=torch.linspace(-3, 3, 8), std=torch.linspace(1, 2, 8))
    feats, lengths = torch.randn(3, 40, 8), torch.tensor([40, 30, 10])
    feats[1, 30:] = feats[2, 10:] = 0
    same, same_lengths = perturb(feats, lengths, normalize, warp=0.0, tempo=0.0)
    assert torch.allclose(same, feats, atol=1e-5) and same_lengths.tolist() == [40, 30, 10]
    out, new_lengths = perturb(feats, lengths, normalize, warp=0.2, tempo=0.3)
    assert out.shape[0] == 3 and out.shape[2] == 8 and 28 <= out.shape[1] <= 58
    assert new_lengths[0] == out.shape[1] and torch.all(new_lengths[1:] < new_lengths[0])
    for row, n in zip(out, new_lengths):
        assert torch.all(row[n:] == 0)
    # a pure tempo change keeps each bin's values within the range they had
    stretched, _ = perturb(feats[:1], lengths[:1], normalize, warp=0.0, tempo=0.3)
    assert torch.all(stretched.amax(1) <= feats[:1].amax(1) + 1e-4)


def test_a_pack_read_without_a_part_warns_and_without_part0_is_refused(packed, caplog):
    _, _, parts, _ = packed
    meta, train, dev = read_packs(list(reversed(parts)), batch_frames=10**6, device=torch.device("cpu"))
    assert meta["parts_read"] == list(range(len(parts))) and meta["parts"] == len(parts)
    with caplog.at_level("WARNING"):
        meta, fewer, dev_again = read_packs(parts[:1], batch_frames=10**6, device=torch.device("cpu"))
    assert meta["parts_read"] == [0] and "not given" in caplog.text
    assert dev_again.utterances == dev.utterances and fewer.utterances < train.utterances
    with pytest.raises(ValueError, match="part 0"):
        read_packs(parts[1:], batch_frames=10**6, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="each part once"):
        read_packs([parts[0], parts[0]], batch_frames=10**6, device=torch.device("cpu"))
