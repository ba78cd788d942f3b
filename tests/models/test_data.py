"""Manifest loading, duration buckets, collation and global statistics."""

import numpy as np
import pytest
import soundfile as sf
import torch

from pasu.models.data import (
    IGNORE_ID,
    SpeechDataset,
    batch_loader,
    bucket_batches,
    collate,
    dev_subset,
    load_split,
    read_audio,
    sample_global_stats,
    write_synthetic_corpus,
)
from pasu.models.targets import SLOTS_UNKNOWN, target_symbols
from pasu.models.tokenizer import Tokenizer, TokenizerOptions
from pasu.slu import Slot


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_synthetic_corpus(tmp_path_factory.mktemp("corpus"), n_train=12, n_dev=4)


@pytest.fixture(scope="module")
def tokenizer(corpus):
    utts = load_split(corpus, "train")
    symbols = target_symbols({u.intent for u in utts}, {s.type for u in utts for s in u.slots or ()})
    return Tokenizer.train([u.text for u in utts], symbols, TokenizerOptions(vocab_size=60))


def test_load_split_encodes_targets(corpus):
    utts = load_split(corpus, "train")
    assert len(utts) == 12 and all(u.audio.exists() for u in utts)
    first = utts[0]
    assert first.target == "alarm_set wake me up at SLOT_time five am SLOT_END"
    assert first.slots == (Slot("time", "five am"),)
    unknown = [u for u in utts if u.slots is None]
    assert unknown and all(u.target.split()[1] == SLOTS_UNKNOWN for u in unknown)


def test_dataset_and_collate(corpus, tokenizer):
    utts = load_split(corpus, "train")
    ds = SpeechDataset(utts, tokenizer)
    batch = collate([ds[0], ds[3]])
    assert batch.ids == [utts[0].id, utts[3].id]
    n0 = round(utts[0].duration * 16000)
    assert batch.speech.shape == (2, int(batch.speech_lengths.max())) and batch.speech_lengths[0] == n0
    assert batch.speech.dtype == torch.float32
    short = int(batch.text_lengths.argmin())
    assert (batch.text[short, batch.text_lengths[short]:] == IGNORE_ID).all()
    assert tokenizer.decode(batch.text[0, : batch.text_lengths[0]].tolist()) == utts[0].target
    assert set(batch.model_inputs()) == {"speech", "speech_lengths", "text", "text_lengths"}


def test_batch_loader_follows_the_given_batches(corpus, tokenizer):
    ds = SpeechDataset(load_split(corpus, "train"), tokenizer)
    batches = [[3, 1], [0], [2, 5, 4]]
    assert [b.ids for b in batch_loader(ds, batches)] == [[ds.utterances[i].id for i in b] for b in batches]


def test_bucket_batches_cover_everything_within_budget():
    rng = np.random.default_rng(0)
    durations = list(rng.uniform(1.0, 6.0, size=200)) + [30.0]  # one longer than the budget
    for seed in (None, 7):
        batches = bucket_batches(durations, 20.0, seed=seed, epoch=1)
        assert sorted(i for b in batches for i in b) == list(range(len(durations)))
        for b in batches:
            assert len(b) == 1 or len(b) * max(durations[i] for i in b) <= 20.0


def test_bucket_batches_deterministic_per_epoch():
    durations = list(np.random.default_rng(1).uniform(1.0, 5.0, size=100))
    a = bucket_batches(durations, 15.0, seed=3, epoch=0)
    assert a == bucket_batches(durations, 15.0, seed=3, epoch=0)
    assert a != bucket_batches(durations, 15.0, seed=3, epoch=1)
    ordered = bucket_batches(durations, 15.0)  # no seed: by duration, for evaluation
    flat = [i for b in ordered for i in b]
    assert flat == sorted(range(100), key=lambda i: durations[i])


def test_dev_subset_is_fixed(corpus):
    utts = load_split(corpus, "train")
    a, b = dev_subset(utts, 5), dev_subset(utts, 5)
    assert [u.id for u in a] == [u.id for u in b] and len(a) == 5
    assert [u.id for u in a] == sorted(u.id for u in a)  # manifest order
    assert dev_subset(utts, 0) == utts


def test_global_stats_normalize_the_features(corpus):
    from pasu.models.frontend import FbankFrontend

    utts = load_split(corpus, "train")
    mean, std = sample_global_stats(utts, num_utterances=6)
    assert mean.shape == std.shape == (80,) and torch.isfinite(mean).all() and (std > 0).all()
    frontend = FbankFrontend()
    frontend.set_stats(mean, std)
    feats = torch.cat([frontend.extract(torch.from_numpy(read_audio(u.audio))) for u in dev_subset(utts, 6)])
    assert feats.mean().abs() < 0.2 and (feats.std(0).mean() - 1).abs() < 0.2


def test_read_audio_resamples_other_rates_and_mixes_channels(tmp_path):
    """A user's own recordings (8 kHz telephone audio, 44.1 kHz stereo) train and evaluate as they are."""
    for rate, channels in ((8000, 1), (44100, 2)):
        t = np.arange(rate // 2) / rate  # half a second of a 440 Hz tone
        tone = 0.5 * np.sin(2 * np.pi * 440 * t).astype(np.float32)
        sf.write(tmp_path / "a.flac", np.stack([tone] * channels, axis=1), rate)
        audio = read_audio(tmp_path / "a.flac")
        assert audio.dtype == np.float32 and audio.shape == (8000,)
        spectrum = np.abs(np.fft.rfft(audio))
        assert abs(np.argmax(spectrum) * 16000 / len(audio) - 440) <= 2  # the same tone, at 16 kHz
        assert abs(float(np.max(np.abs(audio))) - 0.5) < 0.02
