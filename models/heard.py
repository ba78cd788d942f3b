"""`pasu text-intent hear`: the corpus's training audio as the cloud's recognizer hears it.

The text pass learns intents from written sentences but reads recognizer transcripts (about 20% WER on unseen
voices). Training it also on heard training utterances, each labelled with its gold intent, teaches it the
recognizer's kind of errors. The hearing is Whisper's beam alone, with the decoder as served: the second opinion
(the Conformer) trained on this very audio and would hear it almost perfectly, which teaches nothing.

The result is a JSONL file, one row per utterance: {"id", "text" (the gold words), "scenario", "action", "intent",
"texts": Whisper's n-best, best first}. Heard transcripts carry no slot labels (their values need not be in the
words): they train the intent only. An interrupted run resumes (rows already written are kept).

Measured (README, the text pass): with 10,000 heard utterances the cloud's intent accuracy on dev did not rise
(80.7% vs 82.3% without them), so the shipped text pass trains on written sentences only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from pasu.corpus.text import HEARD_SOURCE, Sentence, normalize_text
from pasu.models.data import Utterance, load_split, read_audio, read_jsonl
from pasu.models.whisper_adapt import EncodedSplit, nested_sample
from pasu.models.whisper_recognizer import WhisperRecognizer, load_model, model_files, read_weights

LABELS = ("text", "scenario", "action", "intent")  # what a heard row keeps of its manifest row


@dataclass(frozen=True)
class HearOptions:
    # training utterances heard: the seeded nested_sample `pasu whisper adapt` draws, so its encodings serve
    utterances: int = 10000
    nbest: int = 3  # Whisper hypotheses kept per utterance (its beam is whisper.yaml's beam_size)
    seed: int = 0  # nested_sample's seed (the adaptation's default)
    threads: int = 2  # CTranslate2 threads


def hear_training_audio(cloud: Path, corpus: Path, out: Path, options: HearOptions = HearOptions(),
                        encoded: Path | None = None) -> Path:
    """Write (or complete) `out` with Whisper's n-best for the first `options.utterances` of the sample.

    `encoded`: a `pasu whisper adapt --exp` folder whose cached train encodings are used, the missing ones
    encoded into it first; without it each utterance is encoded and forgotten."""
    weights = replace(read_weights(cloud), second_opinion="")
    recognizer = WhisperRecognizer(load_model(weights, cpu_threads=options.threads, files=model_files(weights, cloud)),
                                   weights)
    utterances = nested_sample(load_split(corpus, "train"), options.utterances, options.seed)
    gold = {row["id"]: row for row in read_jsonl(Path(corpus) / "train.jsonl")}
    done = {row["id"] for row in read_jsonl(out)} if out.is_file() else set()
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        for utt, window in tqdm(_windows(recognizer, utterances, done, encoded), desc="hearing train",
                                total=len(utterances), initial=len(done), unit="utt", dynamic_ncols=True):
            hypotheses = recognizer.nbest_encoded(window)
            row = gold[utt.id]
            f.write(json.dumps({"id": utt.id, **{k: row[k] for k in LABELS},
                                "texts": [h.text for h in hypotheses[: options.nbest]]}) + "\n")
            f.flush()
    return out


def _windows(recognizer: WhisperRecognizer, utterances: list[Utterance], done: set[str],
             encoded: Path | None) -> Iterator[tuple[Utterance, object]]:
    """(utterance, Whisper's encoder output) for each utterance not in `done`."""
    import ctranslate2

    cache = None
    if encoded is not None:
        cache = EncodedSplit(encoded, "train", utterances, recognizer.encoder_width)
        cache.fill(recognizer, "encode train")  # what is missing, kept for a later `pasu whisper adapt` too
    for i, utt in enumerate(utterances):
        if utt.id in done:
            continue
        if cache is not None:
            yield utt, ctranslate2.StorageView.from_array(np.ascontiguousarray(cache.array[i][None], dtype=np.float32))
        else:
            yield utt, recognizer.encode(read_audio(utt.audio))


def heard_sentences(heard: Path, nbest: int = 1) -> list[Sentence]:
    """The heard transcripts of `heard` (the first `nbest` of each utterance) that differ from its gold words,
    labelled with its gold intent and no slots."""
    sentences = []
    for row in read_jsonl(heard):
        for k, text in enumerate(row["texts"][:nbest]):
            if text.strip() and normalize_text(text) != normalize_text(row["text"]):
                sentences.append(Sentence(f"{row['id']}/{k}", text, row["scenario"], row["action"], row["intent"],
                                          None, HEARD_SOURCE))
    return sentences
