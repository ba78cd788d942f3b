"""Sentencepiece tokenizer for SLU targets, with ESPnet's token list around it.

Intents and slot markup (see targets.py) are sentencepiece user-defined symbols, so each is one token, and
they are mapped to their ids directly rather than through sentencepiece's text encoder: fed as text,
sentencepiece puts a lone "▁" before every symbol (`▁ SLOT_time`), which would lengthen every target for
nothing. Words are encoded run by run, so a run's first piece carries the usual word-start "▁".

Token ids are ESPnet model ids: `token_list = ["<blank>", <sentencepiece pieces, "<unk>" first>, "<sos/eos>"]`
(ESPnet wants blank at 0 and sos/eos last), so model id = sentencepiece id + 1.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from pasu.models.targets import is_intent, is_markup

BLANK = "<blank>"
UNK = "<unk>"
SOS_EOS = "<sos/eos>"


@dataclass(frozen=True)
class TokenizerOptions:
    vocab_size: int = 300  # sentencepiece vocabulary INCLUDING the ~120 intent/markup symbols and <unk>
    model_type: str = "unigram"  # "unigram" or "bpe"
    character_coverage: float = 1.0  # corpus text is [a-z0-9'] only: cover every character
    min_word_pieces: int = 40  # raise vocab_size so at least this many word pieces remain next to the symbols


def _user_defined_ids(proto: bytes) -> set[int]:
    """Sentencepiece ids of the user-defined symbols (the Python API has no per-id query for them)."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto.FromString(proto)
    user_defined = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
    return {i for i, piece in enumerate(model.pieces) if piece.type == user_defined}


class Tokenizer:
    """Targets <-> ESPnet token ids; wraps one sentencepiece model (file or serialized bytes)."""

    def __init__(self, model: str | os.PathLike | bytes):
        proto = model if isinstance(model, bytes) else Path(model).read_bytes()
        self.model_proto: bytes = proto  # kept so the model can be copied into a package verbatim
        self.sp = spm.SentencePieceProcessor(model_proto=proto)
        pieces = [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]
        if pieces[0] != UNK:
            raise ValueError("sentencepiece model must have <unk> at id 0 (train it with Tokenizer.train)")
        self.token_list: list[str] = [BLANK, *pieces, SOS_EOS]
        # Symbols (intents, markup) by piece, looked up before sentencepiece sees a word run.
        user_defined = _user_defined_ids(proto)
        self._symbol_ids = {p: i + 1 for i, p in enumerate(pieces) if i in user_defined}
        self._symbol_id_set = set(self._symbol_ids.values())
        self._index = {t: i for i, t in enumerate(self.token_list)}
        self.unk_id = 1

    @classmethod
    def train(
        cls, texts: Iterable[str], symbols: Sequence[str], options: TokenizerOptions = TokenizerOptions()
    ) -> Tokenizer:
        """Train on plain word texts (no markup); `symbols` (intents, markup) become single tokens."""
        texts = [t for t in texts if t.strip()]
        if not texts:
            raise ValueError("no training text for the tokenizer")
        num_chars = len({c for t in texts for c in t if not c.isspace()})
        # Unigram needs room for every character plus "▁" beside the symbols; tiny corpora need more.
        vocab_size = max(options.vocab_size, len(symbols) + 2 + max(options.min_word_pieces, num_chars))
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=buf,
            vocab_size=vocab_size,
            model_type=options.model_type,
            character_coverage=options.character_coverage,
            user_defined_symbols=list(symbols),
            unk_id=0,
            bos_id=-1,  # ESPnet adds <sos/eos> itself
            eos_id=-1,
            pad_id=-1,
            hard_vocab_limit=False,  # a small corpus may not support vocab_size pieces: take fewer
            minloglevel=2,
            num_threads=1,
        )
        return cls(buf.getvalue())

    def with_symbols(self, symbols: Sequence[str]) -> Tokenizer:
        """This tokenizer with `symbols` (new intents, slot markup) appended as single tokens.

        Every existing piece keeps its model id, so a trained model's rows still mean what they meant; only
        <sos/eos>, always last, moves up by the number added (pasu.models.warm_start maps the rows by token).
        """
        from sentencepiece import sentencepiece_model_pb2

        new = [s for s in dict.fromkeys(symbols) if s not in self._index]
        if not new:
            return self
        model = sentencepiece_model_pb2.ModelProto.FromString(self.model_proto)
        user_defined = sentencepiece_model_pb2.ModelProto.SentencePiece.USER_DEFINED
        for symbol in new:
            model.pieces.add(piece=symbol, score=0.0, type=user_defined)
        return Tokenizer(model.SerializeToString())

    def save(self, path: str | os.PathLike) -> Path:
        """Write the sentencepiece .model file."""
        path = Path(path)
        path.write_bytes(self.model_proto)
        return path

    @property
    def vocab_size(self) -> int:
        return len(self.token_list)

    @property
    def symbols(self) -> list[str]:
        """The single-token intents and markup, in id order."""
        return list(self._symbol_ids)

    @property
    def intents(self) -> list[str]:
        return [s for s in self._symbol_ids if is_intent(s)]

    def token_id(self, token: str) -> int:
        """Model id of any token in token_list, <unk>'s when absent (e.g. SLOTS_UNKNOWN, to ban it in search)."""
        return self._index.get(token, self.unk_id)

    def encode(self, target: str) -> list[int]:
        """Model ids of a target string (see targets.py); an unknown intent/markup token becomes <unk>."""
        ids: list[int] = []
        run: list[str] = []
        for token in target.split():
            if is_markup(token) or is_intent(token) or token in self._symbol_ids:
                ids += self._encode_words(run)
                run = []
                ids.append(self._symbol_ids.get(token, self.unk_id))
            else:
                run.append(token)
        return ids + self._encode_words(run)

    def _encode_words(self, words: Sequence[str]) -> list[int]:
        if not words:
            return []
        return [i + 1 for i in self.sp.encode(" ".join(words))]

    def decode(self, ids: Iterable[int]) -> str:
        """Target string of model ids; <blank> and <sos/eos> are dropped, symbols stand as words."""
        eos = self.vocab_size - 1
        out: list[str] = []
        run: list[int] = []
        for i in ids:
            i = int(i)
            if i <= 0 or i >= eos:  # blank, sos/eos, or out of range (ignore_id padding)
                continue
            if i in self._symbol_id_set:
                out.append(self.sp.decode(run))
                out.append(self.sp.id_to_piece(i - 1))
                run = []
            else:
                run.append(i - 1)
        out.append(self.sp.decode(run))
        return " ".join(" ".join(out).split())
