"""Training speech read while `pasu corpus build` is still rendering it.

A GPU lent for minutes has 16 cores beside it: rendered there, the training speech needs no 64-MiB carry and the
model hears renderings it has never heard (the device's training log, sittings 19 and 20). `ShardFeed` watches
the builds' `shards/` folders from a thread, reads each finished shard once (a shard's manifest appears only
when its audio is all on disk) and keeps its utterances in memory; `batch` hands out the unheard ones first and
fills up with ones already heard, so the GPU never waits for the renderer and each rendering is heard a few
times at most.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pasu.models.data import read_audio, utterance_from_row
from pasu.models.frontend import SAMPLE_RATE
from pasu.models.tokenizer import Tokenizer

log = logging.getLogger(__name__)

PCM_SCALE = 32768  # soundfile's float <-> 16-bit convention: the FLAC's own samples come back exactly


@dataclass
class FeedItem:
    """One rendering in memory: 16-bit samples (half the memory of float32) and its target's token ids."""

    samples: np.ndarray  # int16, PCM_SCALE to full scale
    tokens: list[int]
    heard: int = 0  # batches it has been in

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


class ShardFeed:
    """Utterances of the builds in `corpus_dirs` as their shards finish; see the module's docstring."""

    def __init__(self, corpus_dirs: Sequence[Path], tokenizer: Tokenizer, seed: int = 0, poll_s: float = 1.0):
        self.corpus_dirs, self.tokenizer, self.poll_s = [Path(c) for c in corpus_dirs], tokenizer, poll_s
        self.rng = random.Random(seed)
        self.unheard: deque[FeedItem] = deque()
        self.heard: list[FeedItem] = []
        self.read_shards: set[Path] = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="shard-feed", daemon=True)
        self.thread.start()

    @property
    def size(self) -> int:
        with self.lock:
            return len(self.unheard) + len(self.heard)

    def stats(self) -> dict:
        """How much has been read and heard (for the run's log and summary)."""
        with self.lock:
            items = list(self.unheard) + self.heard
            return {"shards": len(self.read_shards), "utterances": len(items), "unheard": len(self.unheard),
                    "hours": round(sum(i.seconds for i in items) / 3600, 2),
                    "mean_times_heard": round(float(np.mean([i.heard for i in items])), 2) if items else 0.0}

    def wait_for(self, utterances: int, timeout_s: float) -> bool:
        """Block until at least `utterances` are in memory (True) or `timeout_s` has passed (False)."""
        deadline = time.monotonic() + timeout_s
        while self.size < utterances:
            if time.monotonic() > deadline or not self.thread.is_alive():
                return False
            time.sleep(0.2)
        return True

    def batch(self, max_seconds: float) -> list[FeedItem]:
        """Unheard utterances first, then heard ones at random, while the batch padded to its longest stays
        within `max_seconds` (at least one utterance)."""
        chosen: list[FeedItem] = []
        longest = 0.0
        with self.lock:
            while True:
                if self.unheard:
                    item, from_unheard = self.unheard[0], True
                elif self.heard and len(chosen) < len(self.heard):
                    item, from_unheard = self.heard[self.rng.randrange(len(self.heard))], False
                else:
                    break
                candidate = max(longest, item.seconds)
                if chosen and candidate * (len(chosen) + 1) > max_seconds:
                    break
                if from_unheard:
                    self.heard.append(self.unheard.popleft())
                elif any(item is c for c in chosen):
                    continue
                chosen.append(item)
                longest = candidate
        for item in chosen:
            item.heard += 1
        return chosen

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)

    def _watch(self) -> None:
        while not self.stopped.is_set():
            for shard in self._new_shards():
                try:
                    items = self._read_shard(shard)
                except (OSError, ValueError, RuntimeError) as e:  # a shard being replaced, a damaged file
                    log.warning("shard %s skipped: %s", shard, e)
                    items = []
                with self.lock:
                    self.read_shards.add(shard)
                    self.unheard.extend(items)
                if self.stopped.is_set():
                    return
            self.stopped.wait(self.poll_s)

    def _new_shards(self) -> list[Path]:
        found = [p for c in self.corpus_dirs for p in sorted((c / "shards").glob("*.jsonl"))
                 if not p.name.endswith(".errors.jsonl")]
        return [p for p in found if p not in self.read_shards]

    def _read_shard(self, shard: Path) -> list[FeedItem]:
        corpus = shard.parent.parent
        rows = [json.loads(line) for line in shard.read_text().splitlines() if line.strip()]
        items = []
        for row in rows:
            utterance = utterance_from_row(row, corpus)
            wave = read_audio(utterance.audio)
            samples = np.clip(np.round(wave * PCM_SCALE), -32768, 32767).astype(np.int16)
            items.append(FeedItem(samples, self.tokenizer.encode(utterance.target)))
        return items
