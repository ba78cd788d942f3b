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
from pasu.models.ngram_lm import NgramLm, training_sentences


@dataclass(frozen=True)
class SphinxOptions:
    # True: the one forward pass that keeps pace with the audio, as a live server runs it; False: PocketSphinx's
    # default, which adds a second pass over the whole utterance and a lattice search at the end of speech
    live: bool = True
    chunk_seconds: float = 0.1  # audio per call, as the device agent ingests it
    lm_order: int = 3


@dataclass(frozen=True)
class SphinxAnswer:
    text: str
    latency: float  # seconds from the end of speech to the answer, on the virtual clock
    end_of_utterance: float  # seconds the decoder's end-of-utterance work took


class StreamingSphinx:
    """PocketSphinx with an LM and dictionary made from training sentences; `replay` one utterance at a time."""

    def __init__(self, sentences: list[str], folder: Path, options: SphinxOptions = SphinxOptions()):
        from pocketsphinx import Decoder, get_model_path

        self.options = options
        model = Path(get_model_path()) / "en-us"
        pronunciations = _read_dictionary(model / "cmudict-en-us.dict")
        folder.mkdir(parents=True, exist_ok=True)
        lm = NgramLm.train(sentences, options.lm_order)
        lm.write_arpa(folder / "lm.arpa", keep=pronunciations.__contains__)
        words = sorted({w for s in sentences for w in s.split() if w in pronunciations})
        _write_dictionary(folder / "words.dict", {w: pronunciations[w] for w in words})
        self.unknown_words = len({w for s in sentences for w in s.split()}) - len(words)
        passes = {"fwdflat": False, "bestpath": False} if options.live else {}
        self.decoder = Decoder(hmm=str(model / "en-us"), lm=str(folder / "lm.arpa"), dict=str(folder / "words.dict"),
                               samprate=SAMPLE_RATE, loglevel="FATAL", **passes)

    @classmethod
    def for_corpus(cls, corpus: Path, folder: Path, options: SphinxOptions = SphinxOptions()) -> StreamingSphinx:
        """The LM and dictionary from the corpus's training sentences, the text the device model learned from."""
        return cls(training_sentences(corpus), folder, options)

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
