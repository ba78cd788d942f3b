"""Training speech read while a build renders it: finished shards are read once, unheard utterances come first,
batches keep to their padded budget, and a shard that appears later is picked up."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from pasu.files import write_text_atomic
from pasu.models.data import load_split, read_audio, write_synthetic_corpus
from pasu.models.fresh_feed import ShardFeed
from pasu.models.targets import target_symbols
from pasu.models.tokenizer import Tokenizer, TokenizerOptions


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    return write_synthetic_corpus(tmp_path_factory.mktemp("fresh") / "build", n_train=9, n_dev=1)


@pytest.fixture
def build(rendered) -> Iterator[Path]:
    """A folder laid out like a `pasu corpus build` in progress: audio, and no shard finished yet."""
    yield rendered
    for shard in (rendered / "shards").glob("*"):
        shard.unlink()


@pytest.fixture(scope="module")
def tokenizer(rendered) -> Tokenizer:
    utts = load_split(rendered, "train")
    symbols = target_symbols({u.intent for u in utts}, {s.type for u in utts for s in u.slots or ()})
    return Tokenizer.train([u.text for u in utts], symbols, TokenizerOptions(vocab_size=60))


def _rows(build: Path) -> list[dict]:
    return [json.loads(line) for line in (build / "train.jsonl").read_text().splitlines()]


def _finish_shard(build: Path, name: str, rows: list[dict]) -> None:
    """As `pasu corpus build` finishes one: written whole, then renamed (the feed's watcher may look at any time)."""
    (build / "shards").mkdir(exist_ok=True)
    write_text_atomic(build / "shards" / f"{name}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))


def test_finished_shards_are_read_and_unheard_utterances_come_first(build, tokenizer, tmp_path):
    rows = _rows(build)
    _finish_shard(build, "train--a--000", rows[:4])
    (build / "shards" / "train--a--000.errors.jsonl").write_text('{"id": "x", "error": "no audio"}\n')
    feed = ShardFeed([build], tokenizer, seed=0, poll_s=0.05)
    try:
        assert feed.wait_for(4, timeout_s=10)
        longest = max(read_audio(build / r["audio"]).size for r in rows) / 16000
        first = feed.batch(max_seconds=2 * longest)
        assert len(first) == 2 and all(i.heard == 1 for i in first)
        second = feed.batch(max_seconds=2 * longest)
        assert not {id(i) for i in first} & {id(i) for i in second}  # the two still unheard
        third = feed.batch(max_seconds=100 * longest)  # nothing unheard: heard ones, each once in the batch
        assert len(third) == 4 and len({id(i) for i in third}) == 4

        _finish_shard(build, "train--b--000", rows[4:])  # a shard finishing later
        assert feed.wait_for(len(rows), timeout_s=10)
        fresh = feed.batch(max_seconds=100 * longest)
        assert sum(i.heard == 1 for i in fresh) == len(rows) - 4
        wanted = sorted(tokenizer.encode(u.target) for u in load_split(build, "train"))
        assert sorted(i.tokens for i in feed.heard) == wanted
        stats = feed.stats()
        assert stats["shards"] == 2 and stats["utterances"] == len(rows) and stats["unheard"] == 0
    finally:
        feed.stop()


def test_a_batch_holds_one_utterance_even_over_its_budget(build, tokenizer):
    _finish_shard(build, "train--c--000", _rows(build)[:2])
    feed = ShardFeed([build], tokenizer, poll_s=0.05)
    try:
        assert feed.wait_for(2, timeout_s=10)
        assert len(feed.batch(max_seconds=0.01)) == 1
    finally:
        feed.stop()


def test_a_damaged_shard_is_skipped_with_a_warning(build, tokenizer, caplog):
    rows = _rows(build)
    _finish_shard(build, "train--d--000", [{**rows[0], "audio": "audio/missing.flac"}])
    _finish_shard(build, "train--d--001", rows[1:3])
    with caplog.at_level(logging.WARNING):
        feed = ShardFeed([build], tokenizer, poll_s=0.05)
        try:
            assert feed.wait_for(2, timeout_s=10)
            assert feed.stats()["shards"] == 2 and feed.size == 2
        finally:
            feed.stop()
    assert "train--d--000" in caplog.text


def test_waiting_on_a_build_that_renders_nothing_gives_up(tmp_path, tokenizer):
    feed = ShardFeed([tmp_path], tokenizer, poll_s=0.05)
    try:
        assert not feed.wait_for(1, timeout_s=0.3)
    finally:
        feed.stop()
