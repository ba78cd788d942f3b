"""`pasu corpus import-labels`: a PASU corpus folder over your own recordings and a label file, no audio copied.

Input, one JSON object per line:
    {"audio": "wav/0001.wav", "text": "Wake me up at five AM", "intent": "alarm_set",
     "slots": [["time", "five AM"]], "split": "train", "speaker": "spk03"}
`audio` is relative to the label file's folder, or absolute; any rate and channel count libsndfile reads (the
readers mix to mono and resample to 16 kHz). `intent` is `scenario_action`; `slots` are [type, value] pairs whose
values occur in the text (absent or null: not annotated, [] none); `split` one of train, dev, test, test_unseen;
`speaker` and `id` are optional. Text and slot values are normalized as every PASU corpus's are (`normalize_text`).

Output: `<split>.jsonl` manifests (the row format of `pasu corpus build`, absolute audio paths) and import.json
(options and summary). Recordings whose file is missing or unreadable, or listed twice, are counted and left out;
a line that is not a labelled recording stops the import with its line number, before anything is written.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from pasu.corpus.build import SAMPLE_RATE, write_manifest
from pasu.corpus.slurp_import import EXAMPLES, ImportStats, probe_audio
from pasu.corpus.text import USER_SOURCE, CorpusDataError, Sentence, normalize_text, sentence_fields
from pasu.models.targets import locate_slots
from pasu.slu import Slot

SPLITS = ("train", "dev", "test", "test_unseen")


@dataclass(frozen=True)
class LabelsImportOptions:
    labels: Path  # the JSONL label file; relative audio paths start from its folder
    out_dir: Path  # the corpus folder to write (manifests and import.json)


def import_labels(opts: LabelsImportOptions) -> dict:
    """Write `<split>.jsonl` manifests and import.json into opts.out_dir; returns the summary."""
    if not opts.labels.is_file():
        raise CorpusDataError(f"{opts.labels}: no such label file")
    if (opts.out_dir / "build.json").exists():
        raise CorpusDataError(f"{opts.out_dir} holds a `pasu corpus build` corpus: import into another folder")
    manifests: dict[str, list[dict]] = {}
    stats: dict[str, ImportStats] = {}
    other_rates: dict[int, int] = {}
    slots_not_in_text: list[str] = []
    seen: set[Path] = set()
    for lineno, row in _label_rows(opts.labels):
        where = f"{opts.labels}:{lineno}"
        split, sentence, audio = _labelled_recording(row, opts.labels.parent, where)
        split_stats = stats.setdefault(split, ImportStats())
        if audio in seen:
            split_stats.skip("listed twice")
            continue
        seen.add(audio)
        info, why_not = probe_audio(audio)
        if why_not == "missing":
            split_stats.add_missing(audio)
            continue
        if info is None:
            split_stats.skip(why_not)
            continue
        if info.samplerate != SAMPLE_RATE:
            other_rates[info.samplerate] = other_rates.get(info.samplerate, 0) + 1
        slots_not_in_text += [f"{where} ({slot.value!r})" for slot in _unmarked_slots(sentence)]
        manifests.setdefault(split, []).append(_row(row, sentence, audio, info.duration))
        split_stats.utterances += 1
        split_stats.seconds += info.duration
    if not any(manifests.values()):
        raise CorpusDataError(f"{opts.labels}: no recording could be imported (missing or unreadable audio)")
    for split, rows in manifests.items():
        _check_unique_ids(rows, split)
        stats[split].sentences = len({r["text"] for r in rows})

    opts.out_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in manifests.items():
        write_manifest(opts.out_dir / f"{split}.jsonl", rows)
    summary = {
        "labels": str(opts.labels.resolve()),
        "other_sample_rates": {str(rate): n for rate, n in sorted(other_rates.items())},
        # training leaves these values unmarked (models/targets.py): the rows' slots say what the words do not
        "slots_not_in_text": len(slots_not_in_text), "slots_not_in_text_examples": slots_not_in_text[:EXAMPLES],
        "splits": {split: asdict(s) | {"hours": round(s.seconds / 3600, 3)} for split, s in stats.items()},
    }
    (opts.out_dir / "import.json").write_text(json.dumps(summary, indent=2))
    return summary


def _label_rows(path: Path) -> Iterator[tuple[int, dict]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusDataError(f"{path}:{lineno}: not JSON ({e})") from e
            if not isinstance(row, dict):
                raise CorpusDataError(f"{path}:{lineno}: not a JSON object")
            yield lineno, row


def _labelled_recording(row: dict, base: Path, where: str) -> tuple[str, Sentence, Path]:
    """(split, sentence, absolute audio path) of one label row; CorpusDataError names what is wrong."""
    missing = [k for k in ("audio", "text", "intent", "split") if not row.get(k)]
    if missing:
        raise CorpusDataError(f"{where}: no {', '.join(missing)}")
    if row["split"] not in SPLITS:
        raise CorpusDataError(f"{where}: split {row['split']!r} is not one of {', '.join(SPLITS)}")
    scenario, _, action = str(row["intent"]).partition("_")
    if not (scenario and action):
        raise CorpusDataError(f"{where}: intent {row['intent']!r} is not scenario_action (e.g. alarm_set)")
    text = normalize_text(str(row["text"]))
    if not text:
        raise CorpusDataError(f"{where}: text {row['text']!r} has no words")
    slots = row.get("slots")
    try:
        pairs = None if slots is None else [Slot(str(t).strip(), normalize_text(str(v))) for t, v in slots]
        normalized = None if pairs is None else tuple(slot for slot in pairs if slot.value and slot.type)
    except (TypeError, ValueError) as e:
        raise CorpusDataError(f"{where}: slots must be [type, value] pairs ({e})") from e
    audio = Path(row["audio"])
    sentence = Sentence(id=str(row.get("id") or audio.with_suffix("").as_posix()), text=text, scenario=scenario,
                        action=action, intent=f"{scenario}_{action}", slots=normalized, source=USER_SOURCE)
    return row["split"], sentence, (audio if audio.is_absolute() else base / audio).resolve()


def _row(label: dict, sentence: Sentence, audio: Path, duration: float) -> dict:
    """A manifest row with the fields `pasu corpus build` writes (no TTS or augmentation fields)."""
    return {
        "id": sentence.id.strip("/").replace("/", "-"),  # wav/spk1/0001.wav -> wav-spk1-0001
        "audio": str(audio),  # absolute: load_split joins it to the corpus folder, which keeps it as it is
        "duration": round(duration, 3),
        "engine": "real",
        "voice": str(label.get("speaker") or "unknown"),
        **sentence_fields(sentence),
    }


def _unmarked_slots(sentence: Sentence) -> list[Slot]:
    """The slots whose values training cannot find in the words (`locate_slots`, as `encode_target` looks)."""
    found = {slot for _, _, slot in locate_slots(sentence.text.split(), sentence.slots or ())}
    return [slot for slot in sentence.slots or () if slot not in found]


def _check_unique_ids(rows: list[dict], split: str) -> None:
    twice = sorted(i for i, n in Counter(r["id"] for r in rows).items() if n > 1)
    if twice:
        raise CorpusDataError(f"{split}: ids {', '.join(twice[:5])} name more than one recording: give each "
                              "row an `id` of its own")


def to_text(summary: dict) -> str:
    """The summary as a table, with the missing files and the rates the readers resample."""
    lines = [f"Label import from {summary['labels']}", "",
             "| split | utterances | hours | sentences | missing files | other skipped |", "|---|---|---|---|---|---|"]
    for split, s in summary["splits"].items():
        skipped = ", ".join(f"{reason} {n}" for reason, n in sorted(s["skipped"].items())) or "0"
        lines.append(f"| {split} | {s['utterances']} | {s['hours']:.2f} | {s['sentences']} | {s['missing']} | "
                     f"{skipped} |")
    lines.append("")
    for split, s in summary["splits"].items():
        if s["missing"]:
            lines.append(f"{split}: {s['missing']} audio files missing, e.g. {', '.join(s['missing_examples'])}")
    if summary["slots_not_in_text"]:
        lines.append(f"{summary['slots_not_in_text']} slot values not in their text (left unmarked in training), "
                     f"e.g. {', '.join(summary['slots_not_in_text_examples'])}")
    if summary["other_sample_rates"]:
        rates = ", ".join(f"{n} at {rate} Hz" for rate, n in summary["other_sample_rates"].items())
        lines.append(f"not 16 kHz: {rates}; resampled on every read (for a long training resample once up front: "
                     "sox in.wav -r 16000 -c 1 out.flac)")
    return "\n".join(lines)
