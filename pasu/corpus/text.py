"""The labelled text of the corpus: SLURP devel/test for evaluation, SLURP training text and HWU64 for training.

SLURP's training sentences (`slurp/lm.txt`) come without labels. They get an intent from two public sources:
HWU64, the annotated set SLURP's text grew out of (intent and `[type : value]` slots), and slurpfood
(`sentence -> scenario_action`, intent only). HWU64 sentences that are not in `lm.txt` are extra training
text. Nothing whose normalized text is a SLURP devel/test sentence may reach training: `load_corpus_text`
removes such sentences and `check_no_leakage` fails loudly if any is left.

Text normalization (`normalize_text`), the form every sentence and slot value takes, for TTS input and ASR
targets alike:

* Unicode compatibility-decomposed, accents dropped (café -> cafe), lowercased.
* Curly quotes and backticks become `'`; an apostrophe is kept only inside a word (`i'm`, `jessica's`),
  other apostrophes are quotes and are dropped (`parents'` -> `parents`).
* Symbols that are spoken become words: `&` and, `@` at, `#` hashtag, `%` percent, `+` plus
  (`at&t` -> `at and t`, `john@gmail dot com` -> `john at gmail dot com`), following SLURP, which spells
  out what is said (`dot com`, `five pm`).
* A period is spoken `dot` in web addresses (before com/org/net/..., after www), `point` between digits
  (`96.5` -> `96 point 5`), and silent elsewhere: sentence ends and SLURP's spelled letters
  (`i. b. m.`, `a.m.` -> `i b m`, `a m`).
* Every other character that is not a letter, digit or `'` separates words (`bi-weekly` -> `bi weekly`,
  `turn_down` -> `turn down`); whitespace is collapsed. Digits are kept as they are: SLURP already spells
  numbers, the few digits left are names (`tech n9ne`, `h2o`).

Lines that are export damage rather than sentences (`#NAME?`, lines with `<unk>`) are skipped.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import unicodedata
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from pasu.files import write_text_atomic
from pasu.settings import SHARED_DATA_ENV, shared_data_dir
from pasu.slu import Slot, parse_annotation

HEARD_SOURCE = "heard"  # a recognizer's transcript of a training utterance, with its gold labels (models/heard.py)
# an unlabelled SLURP training sentence with the intent a text classifier gave it (models/pseudo_label.py)
PSEUDO_SOURCE = "slurp_train_pseudo"
USER_SOURCE = "user"  # a user's labelled recording (`pasu corpus import-labels`)
SWAP_SOURCE = "slot_swap"  # a training sentence with its slot values swapped for others (models/slot_swap.py)
SOURCES = ("slurp_devel", "slurp_test", "slurp_train", "hwu64", HEARD_SOURCE, PSEUDO_SOURCE, SWAP_SOURCE,
           USER_SOURCE)

# Each input file, relative to the data folder, and where its public original lives.
DEVEL = "slurp/devel.jsonl"
TEST = "slurp/test.jsonl"
LM = "slurp/lm.txt"
SLURPFOOD = "slurpfood/extra_train_sentences_intents.json"
HWU64 = "hwu64/hwu64_annotated_from_cv_testfolds.csv"
ORIGINS = {
    DEVEL: "https://github.com/pswietojanski/slurp (dataset/slurp/devel.jsonl, CC BY 4.0)",
    TEST: "https://github.com/pswietojanski/slurp (dataset/slurp/test.jsonl, CC BY 4.0)",
    LM: "https://github.com/pswietojanski/slurp (dataset/lm/lm.txt, CC BY 4.0)",
    SLURPFOOD: "https://github.com/aalto-speech/slurpfood (extra_train_sentences_intents.json, CC BY 4.0)",
    HWU64: "https://github.com/xliuhw/NLU-Evaluation-Data (the annotated cross-validation test folds, "
           "';'-separated, CC BY 4.0)",
}

# SLURP's (and HWU64's) 18 scenarios; fixed so that a label's scenario part is recognised on any data,
# also the small samples that have only a few of them
SCENARIOS = frozenset({
    "alarm", "audio", "calendar", "cooking", "datetime", "email", "general", "iot", "lists", "music", "news",
    "play", "qa", "recommendation", "social", "takeaway", "transport", "weather",
})

# HWU64 intents that SLURP dropped: no SLURP test sentence carries them, so training on them only teaches a
# model labels it can never be right with. HWU64 sentences with these intents count as unlabelled.
HWU_ONLY_INTENTS = frozenset({
    "general_affirm", "general_commandstop", "general_confirm", "general_dontcare",
    "general_explain", "general_negate", "general_praise", "general_repeat",
})


class CorpusDataError(RuntimeError):
    """An input file of the corpus text is missing or malformed."""


class LeakageError(RuntimeError):
    """A SLURP devel/test sentence also appears in the training text."""


@dataclass(frozen=True)
class Sentence:
    """One labelled sentence; `slots` is None where the slot annotation is unknown, () where there are none."""

    id: str
    text: str
    scenario: str
    action: str
    intent: str
    slots: tuple[Slot, ...] | None
    source: str

    def __post_init__(self) -> None:
        if self.intent != f"{self.scenario}_{self.action}":
            raise ValueError(f"{self.id}: intent {self.intent!r} is not scenario_action "
                             f"({self.scenario!r}, {self.action!r})")
        if self.source not in SOURCES:
            raise ValueError(f"{self.id}: unknown source {self.source!r}")


@dataclass(frozen=True)
class JoinReport:
    """How the training labels were joined; counts are of unique normalized sentences."""

    lm_sentences: int
    lm_labelled_by_slurpfood: int
    lm_labelled_by_hwu64: int
    lm_labelled: int                # by either source (the data README's 6,161)
    lm_labelled_by_both: int        # (944)
    both_agree_as_given: int        # labels equal as the files give them (934)
    both_agree_after_repair: int    # after completing slurpfood's scenario-less labels
    both_disagree: int              # kept with slurpfood's intent, slots unknown
    slurpfood_unresolved: int       # a scenario-less label whose scenario is ambiguous: dropped
    hwu64_sentences: int
    hwu64_only_intent: int          # HWU64 sentences whose only intent is one SLURP dropped
    hwu64_ambiguous: int            # one normalized text, several HWU64 intents: dropped
    hwu64_in_eval: int              # in SLURP devel/test (the data README's 2,161)
    hwu64_not_in_lm: int
    removed_eval_overlap: int       # labelled lm.txt sentences dropped because devel/test has them


@dataclass(frozen=True)
class CorpusText:
    train: tuple[Sentence, ...]
    dev: tuple[Sentence, ...]       # SLURP devel
    test: tuple[Sentence, ...]      # SLURP test
    join: JoinReport | None = field(default=None, compare=False)

    def summary(self) -> dict:
        """Counts per split, per source and of intents, plus the join report when there is one."""
        intents = {name: {s.intent for s in split} for name, split in self.splits().items()}
        unseen = sorted(intents["test"] - intents["train"])
        out: dict = {
            "train": len(self.train),
            "dev": len(self.dev),
            "test": len(self.test),
            "by_source": dict(sorted(Counter(s.source for s in self.all()).items())),
            # a lm.txt sentence labelled by HWU64 has slots; one labelled by slurpfood alone has None
            "train_lm_via_hwu64": sum(s.source == "slurp_train" and s.slots is not None for s in self.train),
            "train_lm_via_slurpfood": sum(s.source == "slurp_train" and s.slots is None for s in self.train),
            "train_hwu64_extra": sum(s.source == "hwu64" for s in self.train),
            "intents": {name: len(v) for name, v in intents.items()} | {"all": len(set().union(*intents.values()))},
            "scenarios": len({s.scenario for s in self.all()}),
            "test_intents_without_train": len(unseen),
            "test_intents_without_train_names": unseen,
        }
        if self.join is not None:
            out["join"] = asdict(self.join)
        return out

    def splits(self) -> dict[str, tuple[Sentence, ...]]:
        return {"train": self.train, "dev": self.dev, "test": self.test}

    def all(self) -> Iterable[Sentence]:
        for split in (self.train, self.dev, self.test):
            yield from split


def samples_dir() -> Path:
    """The small hand-written corpus that ships with PASU, in the shared data's file formats."""
    return Path(__file__).resolve().parent / "samples"


# ---------------------------------------------------------------------------------------------- normalization

_SPOKEN_SYMBOLS = {"&": " and ", "@": " at ", "#": " hashtag ", "%": " percent ", "+": " plus "}
_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'", "\u00b4": "'"})
_TLD = r"(?:com|org|net|edu|gov|io|co|uk|de)\b"
_DOT_WEB = re.compile(rf"(?<=[a-z0-9])\.(?={_TLD})|(?<=\bwww)\.(?=[a-z0-9])")
_POINT = re.compile(r"(?<=\d)\.(?=\d)")
_NOT_WORD = re.compile(r"[^a-z0-9']+")
_LOOSE_APOSTROPHE = re.compile(r"(?<![a-z0-9])'|'(?![a-z0-9])")


def normalize_text(text: str) -> str:
    """The spoken word form of a sentence or slot value (rules in the module docstring)."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower().translate(_QUOTES)
    for symbol, word in _SPOKEN_SYMBOLS.items():
        text = text.replace(symbol, word)
    text = _POINT.sub(" point ", _DOT_WEB.sub(" dot ", text))
    text = _LOOSE_APOSTROPHE.sub(" ", _NOT_WORD.sub(" ", text))
    return " ".join(text.split())


def is_damaged(raw: str) -> bool:
    """Spreadsheet export damage or unknown-word markers, not sentences anyone said."""
    return raw.strip().upper() == "#NAME?" or "<unk>" in raw.lower()


def _normalize_slots(slots: Iterable[Slot]) -> tuple[Slot, ...]:
    normalized = (Slot(s.type.strip(), normalize_text(s.value)) for s in slots)
    return tuple(s for s in normalized if s.value)


# ---------------------------------------------------------------------------------------------- reading files

def _path(data_dir: Path, name: str) -> Path:
    path = data_dir / name
    if not path.is_file():
        raise CorpusDataError(
            f"missing corpus file {path}. PASU reads it from the shared data folder ({data_dir}; set "
            f"${SHARED_DATA_ENV} to point elsewhere) and never copies it into the repository. "
            f"The public original: {ORIGINS[name]}")
    return path


def slurp_sentence(row: dict, split: str) -> Sentence:
    """One row of a SLURP jsonl file (devel, test, train or train_synthetic) as a Sentence; KeyError if malformed.

    `split` is "devel", "test" or "train" (also for train_synthetic): it names the id and the source.
    """
    scenario, action = row["scenario"], row["action"]
    # intent is rebuilt from scenario and action: SLURP's own `intent` field sometimes holds the
    # action alone ("query", "music"), which would make spurious extra intents.
    return Sentence(
        id=f"slurp-{split}-{row['slurp_id']}", text=normalize_text(row["sentence"]), scenario=scenario,
        action=action, intent=f"{scenario}_{action}",
        slots=_normalize_slots(parse_annotation(row["sentence_annotation"])[1]), source=f"slurp_{split}")


def _read_slurp_split(data_dir: Path, name: str, split: str) -> tuple[Sentence, ...]:
    """SLURP devel or test, every row kept (rows are distinct recordings even where texts repeat)."""
    path = _path(data_dir, name)
    out = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(slurp_sentence(json.loads(line), split))
            except (json.JSONDecodeError, KeyError) as e:
                raise CorpusDataError(f"{path}:{lineno}: not a SLURP row ({e})") from e
    return tuple(out)


def _read_lm(data_dir: Path) -> list[str]:
    """The unique normalized lm.txt sentences, in order of first appearance."""
    with _path(data_dir, LM).open(encoding="utf-8") as f:
        texts = (normalize_text(line) for line in f if not is_damaged(line))
        return list(dict.fromkeys(t for t in texts if t))


def _read_slurpfood(data_dir: Path) -> dict[str, str]:
    """Normalized sentence -> label as given (usually scenario_action, sometimes the action alone)."""
    path = _path(data_dir, SLURPFOOD)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise CorpusDataError(f"{path}: not JSON ({e})") from e
    if not isinstance(raw, dict):
        raise CorpusDataError(f"{path}: expected a JSON object sentence -> intent")
    labels: dict[str, set[str]] = defaultdict(set)
    for sentence, label in raw.items():
        if not is_damaged(sentence) and normalize_text(sentence):
            labels[normalize_text(sentence)].add(str(label).strip())
    # a text that normalizes from two differently labelled sentences has no trustworthy label
    return {text: next(iter(ls)) for text, ls in labels.items() if len(ls) == 1}


@dataclass(frozen=True)
class _HwuRow:
    answerid: str
    text: str
    scenario: str
    action: str
    slots: tuple[Slot, ...]

    @property
    def intent(self) -> str:
        return f"{self.scenario}_{self.action}"


_HWU_COLUMNS = ("answerid", "scenario", "intent", "answer_annotation")


def _read_hwu(data_dir: Path) -> list[_HwuRow]:
    path = _path(data_dir, HWU64)
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f, delimiter=";")
        missing = [c for c in _HWU_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise CorpusDataError(f"{path}: missing columns {missing} (is it ';'-separated?)")
        rows = []
        for r in reader:
            annotation = r["answer_annotation"] or ""
            if is_damaged(annotation):
                continue
            # the text comes from the annotation so that text and slot values can never disagree
            plain, slots = parse_annotation(annotation)
            text = normalize_text(plain)
            if text:
                rows.append(_HwuRow(r["answerid"].strip(), text, r["scenario"].strip(), r["intent"].strip(),
                                    _normalize_slots(slots)))
    return rows


# ---------------------------------------------------------------------------------------------- joining labels

@dataclass(frozen=True)
class _Label:
    scenario: str
    action: str
    slots: tuple[Slot, ...] | None

    @property
    def intent(self) -> str:
        return f"{self.scenario}_{self.action}"


def _hwu_index(rows: Sequence[_HwuRow]) -> tuple[dict[str, _HwuRow], int, int]:
    """Normalized text -> its HWU64 row; also how many texts carry a dropped intent or several intents."""
    by_text: dict[str, list[_HwuRow]] = defaultdict(list)
    hwu_only: set[str] = set()
    for r in rows:
        # a dropped intent is no label, so "shut up" (audio_volume_mute and general_commandstop) stays usable
        if r.intent in HWU_ONLY_INTENTS:
            hwu_only.add(r.text)
        else:
            by_text[r.text].append(r)
    index, ambiguous = {}, 0
    for text, rs in by_text.items():
        if len({r.intent for r in rs}) > 1:
            ambiguous += 1
        else:
            index[text] = rs[0]  # same text and intent: the first annotation stands for all
    return index, len(hwu_only - by_text.keys()), ambiguous


def _scenarios_by_action(labels: Iterable[tuple[str, str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for scenario, action in labels:
        out[action].add(scenario)
    return out


def _resolve_slurpfood(label: str, scenarios: set[str], by_action: dict[str, set[str]],
                       hwu: _HwuRow | None) -> _Label | None:
    """slurpfood's label as (scenario, action); some labels lack the scenario and it is completed here."""
    scenario, _, action = label.partition("_")
    if scenario in scenarios and action:
        return _Label(scenario, action, None)
    # the label is an action alone ("hue_lightoff", "query"): take HWU64's scenario for the same action,
    # else the only scenario that has this action; an action several scenarios share stays unresolved
    if hwu is not None and hwu.action == label:
        return _Label(hwu.scenario, label, None)
    owners = by_action.get(label, set())
    return _Label(next(iter(owners)), label, None) if len(owners) == 1 else None


def _lm_id(text: str) -> str:
    return "lm-" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def load_corpus_text(data_dir: str | os.PathLike | None = None) -> CorpusText:
    """Read SLURP, slurpfood and HWU64 text from `data_dir` (default: the shared data folder) and join labels."""
    data_dir = shared_data_dir(data_dir)
    dev = _read_slurp_split(data_dir, DEVEL, "devel")
    test = _read_slurp_split(data_dir, TEST, "test")
    lm = _read_lm(data_dir)
    slurpfood = _read_slurpfood(data_dir)
    hwu_rows = _read_hwu(data_dir)

    hwu, hwu_only, ambiguous = _hwu_index(hwu_rows)
    eval_texts = {s.text for s in dev + test}
    known = [(s.scenario, s.action) for s in dev + test] + [(r.scenario, r.action) for r in hwu.values()]
    scenarios = SCENARIOS | {sc for sc, _ in known}
    by_action = _scenarios_by_action(known)

    train: list[Sentence] = []
    stats: Counter[str] = Counter()
    for text in lm:
        label = _join(text, slurpfood, hwu, scenarios, by_action, stats)
        if label is None:
            continue
        if text in eval_texts:
            stats["removed_eval_overlap"] += 1
            continue
        train.append(Sentence(_lm_id(text), text, label.scenario, label.action, label.intent, label.slots,
                              "slurp_train"))

    lm_texts = set(lm)
    hwu_texts = {r.text for r in hwu_rows}
    for text, r in hwu.items():  # insertion order: the file's order
        if text not in lm_texts and text not in eval_texts:
            train.append(Sentence(f"hwu-{r.answerid}", text, r.scenario, r.action, r.intent, r.slots, "hwu64"))

    report = JoinReport(
        lm_sentences=len(lm),
        lm_labelled_by_slurpfood=sum(t in slurpfood for t in lm),
        lm_labelled_by_hwu64=len(lm_texts & hwu_texts),
        lm_labelled=sum(t in slurpfood or t in hwu_texts for t in lm),
        lm_labelled_by_both=stats["both"],
        both_agree_as_given=stats["agree_as_given"],
        both_agree_after_repair=stats["both"] - stats["disagree"],
        both_disagree=stats["disagree"],
        slurpfood_unresolved=stats["slurpfood_unresolved"],
        hwu64_sentences=len(hwu_texts),
        hwu64_only_intent=hwu_only,
        hwu64_ambiguous=ambiguous,
        hwu64_in_eval=len(hwu_texts & eval_texts),
        hwu64_not_in_lm=len(hwu_texts - lm_texts),
        removed_eval_overlap=stats["removed_eval_overlap"],
    )
    text = CorpusText(tuple(train), dev, test, report)
    check_no_leakage(text)
    return text


def _join(text: str, slurpfood: dict[str, str], hwu: dict[str, _HwuRow], scenarios: set[str],
          by_action: dict[str, set[str]], stats: Counter[str]) -> _Label | None:
    """The label of one lm.txt sentence: HWU64's (it has slots) unless slurpfood says another intent."""
    h = hwu.get(text)
    f = None
    if text in slurpfood:
        f = _resolve_slurpfood(slurpfood[text], scenarios, by_action, h)
        stats["slurpfood_unresolved"] += f is None
    if h is None:
        return f
    if f is None:
        return _Label(h.scenario, h.action, h.slots)
    stats["both"] += 1
    stats["agree_as_given"] += slurpfood[text] == h.intent
    if f.intent == h.intent:
        return _Label(h.scenario, h.action, h.slots)
    # SLURP relabelled the HWU64 text it took over and slurpfood carries SLURP's own training label, the
    # label space of the test set; HWU64's slots were marked for another intent, so they are not kept.
    stats["disagree"] += 1
    return f


def unlabelled_training_text(data_dir: str | os.PathLike | None = None, text: CorpusText | None = None) -> list[str]:
    """The lm.txt sentences that got no label from the join (about 5,300 of 11,500), devel/test ones removed;
    `text`: `load_corpus_text(data_dir)` when the caller has it already."""
    data_dir = shared_data_dir(data_dir)
    text = text if text is not None else load_corpus_text(data_dir)
    taken = {s.text for s in text.all()}
    return [t for t in _read_lm(data_dir) if t not in taken]


def sentence_fields(s: Sentence) -> dict:
    """The manifest fields that come from the labelled sentence (every corpus writes them the same way)."""
    return {
        "text": s.text,
        "scenario": s.scenario,
        "action": s.action,
        "intent": s.intent,
        "slots": None if s.slots is None else [list(slot) for slot in s.slots],
        "sentence_id": s.id,
        "source": s.source,
    }


def fields_sentence(row: dict) -> Sentence:
    """The sentence of a manifest row or `write_sentences` row; KeyError or ValueError if it is not one."""
    slots = row["slots"]
    return Sentence(row["sentence_id"], row["text"], row["scenario"], row["action"], row["intent"],
                    None if slots is None else tuple(Slot(t, v) for t, v in slots), row["source"])


def write_sentences(path: str | os.PathLike, sentences: Iterable[Sentence]) -> None:
    """One JSON row per sentence (`sentence_fields`), written whole then renamed."""
    write_text_atomic(path, "".join(json.dumps(sentence_fields(s)) + "\n" for s in sentences))


def read_sentences(path: str | os.PathLike) -> tuple[Sentence, ...]:
    """The sentences of a `write_sentences` file; CorpusDataError names the first bad line."""
    out = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(fields_sentence(json.loads(line)))
                except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                    raise CorpusDataError(f"{path}:{lineno}: not a sentence row ({e})") from e
    return tuple(out)


def check_no_leakage(text: CorpusText) -> None:
    """Raise LeakageError if any SLURP devel/test sentence's normalized text is a training sentence."""
    train = {s.text for s in text.train}
    leaked = sorted({s.text for s in text.dev + text.test if s.text in train})
    if leaked:
        shown = "; ".join(repr(t) for t in leaked[:5])
        raise LeakageError(f"{len(leaked)} devel/test sentences are also in train, e.g. {shown}")
