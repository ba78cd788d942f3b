"""A classic streaming recognizer as a baseline: CMU PocketSphinx, fed the agent's 100-ms chunks as they arrive.

Frame-synchronous decoders (PocketSphinx; Kaldi's online decoders, which Vosk's server runs) are what streaming
speech servers have long used: the search keeps pace with the audio, so little is left to do at the end of
speech. PocketSphinx is the one installable here with its acoustic model (US English, trained on real read
speech, inside the `pocketsphinx` wheel). So that it knows our commands, its language model is a word trigram of
the corpus's training sentences (models/ngram_lm.py, written as ARPA) and its dictionary is CMUdict's entries for
those words; it recognizes words only, no intents.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pasu.device.agent import VirtualClock
from pasu.device.audio import SAMPLE_RATE, chunks
from pasu.models.ngram_lm import NgramLm

LM_FILE, DICTIONARY_FILE = "lm.arpa", "words.dict"


@dataclass(frozen=True)
class SphinxOptions:
    # True: the one forward pass that keeps pace with the audio, as a live server runs it; False: PocketSphinx's
    # default, which adds a second pass over the whole utterance and a lattice search at the end of speech
    live: bool = True
    chunk_seconds: float = 0.1  # audio per call, as the device agent ingests it


@dataclass(frozen=True)
class SphinxAnswer:
    text: str
    latency: float  # seconds from the end of speech to the answer, on the virtual clock
    end_of_utterance: float  # seconds the decoder's end-of-utterance work took


def write_language_files(sentences: list[str], folder: Path, lm_order: int = 3) -> int:
    """`lm.arpa` (a word n-gram of `sentences`) and `words.dict` (CMUdict's pronunciations of their words) in
    `folder`, for StreamingSphinx; returns how many of their words CMUdict lacks (left out of both)."""
    pronunciations = _read_dictionary(_acoustic_model() / "cmudict-en-us.dict")
    folder.mkdir(parents=True, exist_ok=True)
    NgramLm.train(sentences, lm_order).write_arpa(folder / LM_FILE, keep=pronunciations.__contains__)
    vocabulary = {w for s in sentences for w in s.split()}
    known = sorted(vocabulary & pronunciations.keys())
    _write_dictionary(folder / DICTIONARY_FILE, {w: pronunciations[w] for w in known})
    return len(vocabulary) - len(known)


class StreamingSphinx:
    """PocketSphinx with the LM and dictionary of write_language_files; `replay` one utterance at a time."""

    def __init__(self, language: Path, options: SphinxOptions = SphinxOptions()):
        from pocketsphinx import Decoder

        self.options = options
        passes = {"fwdflat": False, "bestpath": False} if options.live else {}
        self.decoder = Decoder(hmm=str(_acoustic_model() / "en-us"), lm=str(language / LM_FILE),
                               dict=str(language / DICTIONARY_FILE), samprate=SAMPLE_RATE, loglevel="FATAL", **passes)

    def replay(self, audio: np.ndarray) -> SphinxAnswer:
        """Decode one utterance chunk by chunk at real-time pace; the end of speech is the end of `audio`."""
        pcm = (np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0) * 32767).astype(np.int16)
        pieces = chunks(pcm, self.options.chunk_seconds)
        due = np.cumsum([len(p) for p in pieces]) / SAMPLE_RATE
        end_of_speech = float(due[-1]) if len(due) else 0.0
        clock = VirtualClock()
        self.decoder.start_utt()
        for k, piece in enumerate(pieces):
            (clock.idle_until if k == len(pieces) - 1 else clock.wait_until)(due[k])  # as the agent waits
            self.decoder.process_raw(piece.tobytes(), False, False)
        clock.wait_until(end_of_speech)
        ending = clock.now()
        self.decoder.end_utt()
        hypothesis = self.decoder.hyp()
        now = clock.now()
        return SphinxAnswer(hypothesis.hypstr if hypothesis else "", now - end_of_speech, now - ending)


def _acoustic_model() -> Path:
    """The pocketsphinx wheel's US English folder: the acoustic model (en-us/) and CMUdict."""
    from pocketsphinx import get_model_path

    return Path(get_model_path()) / "en-us"


def _read_dictionary(path: Path) -> dict[str, list[str]]:
    """CMUdict: word -> its pronunciations (`word(2)` lines are the second)."""
    entries: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            word, phones = line.split(maxsplit=1)
            entries.setdefault(re.sub(r"\(\d+\)$", "", word), []).append(phones.strip())
    return entries


def _write_dictionary(path: Path, entries: dict[str, list[str]]) -> None:
    lines = [f"{word if i == 0 else f'{word}({i + 1})'} {phones}"
             for word, variants in entries.items() for i, phones in enumerate(variants)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
