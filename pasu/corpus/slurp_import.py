"""`pasu corpus import-slurp`: a PASU corpus folder over real SLURP audio, without copying the audio.

Input, the official release (github.com/pswietojanski/slurp; audio from its scripts/download_audio.sh, unpacked):
    SLURP/dataset/slurp/{train,train_synthetic,devel,test}.jsonl   one labelled sentence per line, with the
                                                                   recordings of it: [{file, wer, ...}, ...]
    SLURP/dataset/slurp/metadata.json                              optional: speaker (usrid) of each recording
    SLURP/audio/slurp_real/*.flac, SLURP/audio/slurp_synth/*.flac  (train_synthetic's audio is SLURP's TTS)

Output: train.jsonl (SLURP train, plus train_synthetic on request), dev.jsonl (devel), test.jsonl (test), one row
per recording in the row format of `pasu corpus build` with the absolute audio path, and import.json (options and
summary). Recordings whose file is missing or unusable are counted and left out; a file listed twice is imported
once. There is no test_unseen split: pass `--splits test` to `pasu eval` and `pasu bench local`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal

import soundfile as sf

from pasu.corpus.build import SAMPLE_RATE, write_manifest
from pasu.corpus.text import CorpusDataError, Sentence, is_damaged, sentence_fields, slurp_sentence

# our split -> the SLURP files it is made of
SPLIT_FILES = {"train": ("train",), "dev": ("devel",), "test": ("test",)}
SPLITS = tuple(SPLIT_FILES)
SYNTHETIC = "train_synthetic"
EXAMPLES = 5  # missing files named in the summary, per split

Recordings = Literal["all", "best"]


@dataclass(frozen=True)
class ImportOptions:
    slurp_dir: Path  # the SLURP clone (dataset/slurp/*.jsonl), or the folder holding the jsonl files itself
    out_dir: Path
    audio_dir: Path | None = None  # folder with slurp_real/ and slurp_synth/ (default: slurp_dir/audio)
    recordings: Recordings = "all"  # best: per sentence only the recording with the lowest SLURP wer
    synthetic: bool = False  # add train_synthetic (SLURP's TTS audio) to train
    splits: tuple[str, ...] = SPLITS


@dataclass
class ImportStats:
    """What an import of one split brought in and left out (also `pasu corpus import-labels`'s)."""

    utterances: int = 0
    seconds: float = 0.0
    sentences: int = 0  # distinct labelled sentences with at least one imported recording
    missing: int = 0  # recording files listed but not found
    missing_examples: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count, besides missing files

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def add_missing(self, path: Path) -> None:
        self.missing += 1
        if len(self.missing_examples) < EXAMPLES:
            self.missing_examples.append(str(path))


@dataclass
class SplitStats(ImportStats):
    sentences_without_audio: int = 0  # SLURP rows none of whose recordings could be imported


def import_slurp(opts: ImportOptions) -> dict:
    """Write `<split>.jsonl` manifests and import.json into opts.out_dir; returns the summary."""
    text_dir = _text_dir(opts.slurp_dir)
    audio_dir = (opts.audio_dir or opts.slurp_dir / "audio").resolve()
    sources = {split: _sources(split, opts.synthetic) for split in opts.splits}
    for name in (n for names in sources.values() for n in names):
        if not (text_dir / f"{name}.jsonl").is_file():
            raise CorpusDataError(f"{text_dir / name}.jsonl not found: is {opts.slurp_dir} a SLURP release?")
    if (opts.out_dir / "build.json").exists():
        raise CorpusDataError(f"{opts.out_dir} holds a `pasu corpus build` corpus: import into another folder")

    speakers = _speakers(text_dir)
    seen: set[str] = set()
    manifests: dict[str, list[dict]] = {}
    stats: dict[str, SplitStats] = {}
    for split, names in sources.items():
        stats[split] = SplitStats()
        manifests[split] = [row for name in names for row in _import_file(
            text_dir, name, audio_dir, opts.recordings, speakers, seen, stats[split])]
    if not any(manifests.values()):
        raise CorpusDataError(f"no usable audio found under {audio_dir} (expected slurp_real/*.flac): download "
                              "it with SLURP's scripts/download_audio.sh, unpack it, or pass --audio-dir")

    opts.out_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in manifests.items():
        write_manifest(opts.out_dir / f"{split}.jsonl", rows)
    summary = {
        "slurp_dir": str(opts.slurp_dir.resolve()), "audio_dir": str(audio_dir), "recordings": opts.recordings,
        "synthetic": opts.synthetic, "speakers_known": bool(speakers),
        "splits": {split: asdict(s) | {"hours": round(s.seconds / 3600, 3)} for split, s in stats.items()},
    }
    (opts.out_dir / "import.json").write_text(json.dumps(summary, indent=2))
    return summary


def _text_dir(slurp_dir: Path) -> Path:
    """Where the jsonl files are: dataset/slurp/ in a clone, or the folder itself."""
    for candidate in (slurp_dir / "dataset" / "slurp", slurp_dir):
        if (candidate / "devel.jsonl").is_file() or (candidate / "train.jsonl").is_file():
            return candidate
    raise CorpusDataError(f"{slurp_dir}: no dataset/slurp/*.jsonl; pass a clone of github.com/pswietojanski/slurp")


def _sources(split: str, synthetic: bool) -> tuple[str, ...]:
    if split not in SPLIT_FILES:
        raise CorpusDataError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    return SPLIT_FILES[split] + ((SYNTHETIC,) if synthetic and split == "train" else ())


def _speakers(text_dir: Path) -> dict[str, str]:
    """Recording file name -> SLURP user id, from metadata.json where the release has it (else empty)."""
    path = text_dir / "metadata.json"
    if not path.is_file():
        return {}
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
        return {name: str(rec["usrid"]) for record in records.values()
                for name, rec in record.get("recordings", {}).items() if "usrid" in rec}
    except (ValueError, AttributeError, TypeError) as e:
        raise CorpusDataError(f"{path}: not SLURP's metadata.json ({e}); move it away to import without "
                              "speakers") from e


def _import_file(text_dir: Path, name: str, audio_dir: Path, mode: Recordings, speakers: dict[str, str],
                 seen: set[str], stats: SplitStats) -> Iterator[dict]:
    """Manifest rows of one SLURP jsonl file; `seen` holds the ids imported so far (a file counts once)."""
    synthetic = name == SYNTHETIC
    folder = audio_dir / ("slurp_synth" if synthetic else "slurp_real")
    path = text_dir / f"{name}.jsonl"
    for lineno, row in _read_jsonl(path):
        try:
            sentence = slurp_sentence(row, "train" if synthetic else name)
            recordings = list(row["recordings"])
            if any("file" not in rec for rec in recordings):
                raise KeyError("recordings[].file")
        except KeyError as e:
            raise CorpusDataError(f"{path}:{lineno}: not a SLURP row (no {e})") from e
        # SLURP marks what it could not transcribe with <unk>: no target to train or score on
        if is_damaged(row["sentence"]) or not sentence.text:
            stats.skip("sentence with <unk> or empty")
            continue
        imported = 0
        for rec, audio, duration in _usable(recordings, folder, name, mode, seen, stats):
            yield _row(_utt_id(name, rec["file"]), audio, duration, sentence, rec, synthetic, speakers)
            imported += 1
            stats.seconds += duration
        stats.utterances += imported
        if imported:
            stats.sentences += 1
        else:
            stats.sentences_without_audio += 1


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield lineno, json.loads(line)
                except json.JSONDecodeError as e:
                    raise CorpusDataError(f"{path}:{lineno}: not JSON ({e})") from e


def _utt_id(name: str, file: str) -> str:
    return f"slurp-{name}-{Path(file).stem}"


def _usable(recordings: list[dict], folder: Path, name: str, mode: Recordings, seen: set[str],
            stats: SplitStats) -> Iterator[tuple[dict, Path, float]]:
    """(recording, path, duration) of each recording to import; with mode best, only the best usable one."""
    if mode == "best":
        # SLURP's wer is its ASR's error on the recording: the lowest is the clearest take
        recordings = sorted(recordings, key=_wer)
    for rec in recordings:
        utt_id = _utt_id(name, rec["file"])
        if utt_id in seen:
            stats.skip("recording listed twice")
            continue
        path = folder / rec["file"]
        duration, problem = _probe(path)
        if problem == "missing":
            stats.add_missing(path)
        elif problem:
            stats.skip(problem)
        else:
            seen.add(utt_id)
            yield rec, path, duration
            if mode == "best":
                return


def _wer(recording: dict) -> float:
    wer = recording.get("wer")
    return math.inf if wer is None else float(wer)


def probe_audio(path: Path) -> tuple[Any, str | None]:
    """The file header (soundfile's info: rate, duration), or None and why the file cannot be used."""
    if not path.is_file():
        return None, "missing"
    try:
        return sf.info(str(path)), None
    except RuntimeError:  # soundfile's LibsndfileError: not an audio file it can read
        return None, "unreadable audio"


def _probe(path: Path) -> tuple[float, str | None]:
    """Duration in seconds from the file header, or why the file cannot be used."""
    info, problem = probe_audio(path)
    if info is None:
        return 0.0, problem
    if info.samplerate != SAMPLE_RATE:
        return 0.0, f"not {SAMPLE_RATE // 1000} kHz"  # training and the agent read 16 kHz only
    return info.duration, None


def _row(utt_id: str, audio: Path, duration: float, s: Sentence, rec: dict, synthetic: bool,
         speakers: dict[str, str]) -> dict:
    """A manifest row with the fields `pasu corpus build` writes (no TTS rate/pitch, no augmentation)."""
    if synthetic:
        voice = "slurp_synth"
    else:
        voice = f"slurp:{speakers[rec['file']]}" if rec["file"] in speakers else "slurp"
    return {
        "id": utt_id,
        "audio": str(audio),  # absolute: load_split joins it to the corpus folder, which keeps it as it is
        "duration": round(duration, 3),
        "engine": "slurp_synth" if synthetic else "real",
        "voice": voice,
        **sentence_fields(s),
        "slurp_wer": rec.get("wer"),
    }


def to_text(summary: dict) -> str:
    """The summary as a table plus a line per split with missing files."""
    lines = [f"SLURP import ({summary['recordings']} recordings, audio from {summary['audio_dir']})", "",
             "| split | utterances | hours | sentences | sentences without audio | missing files | other skipped |",
             "|---|---|---|---|---|---|---|"]
    for split, s in summary["splits"].items():
        skipped = ", ".join(f"{reason} {n}" for reason, n in sorted(s["skipped"].items())) or "0"
        lines.append(f"| {split} | {s['utterances']} | {s['hours']:.2f} | {s['sentences']} | "
                     f"{s['sentences_without_audio']} | {s['missing']} | {skipped} |")
    lines.append("")
    for split, s in summary["splits"].items():
        if s["missing"]:
            lines.append(f"{split}: {s['missing']} audio files missing, e.g. {', '.join(s['missing_examples'])}")
    if not summary["speakers_known"]:
        lines.append("no dataset/slurp/metadata.json: speakers unknown (voice 'slurp')")
    return "\n".join(lines)
