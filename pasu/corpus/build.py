"""`pasu corpus build`: render the plan in parallel into FLAC files and JSONL manifests, resumably.

Layout of a built corpus folder:
    build.json              preset, seed, voices and text counts (a resumed build must match it)
    wav/<split>/<id>.flac   16 kHz mono audio
    shards/<shard>.jsonl    finished shards' manifest rows (written whole, then renamed: never partial)
    shards/<shard>.errors.jsonl  sentences a voice could not render, with the reason
    <split>.jsonl           the manifests, assembled from finished shards once all are done (only for splits
                            that have rendered shards: a `--splits train` build has no dev.jsonl)
    report.json, report.md, snr_hist.png
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import soundfile as sf
from tqdm import tqdm

from pasu.corpus import augment, tts
from pasu.corpus.plan import SPLITS, Job, Plan, Preset, engine_of, make_plan
from pasu.corpus.text import check_no_leakage, load_corpus_text, read_sentences, sentence_fields
from pasu.files import write_text_atomic

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
# a shard is one voice's jobs of one split, at most this many, so engines that batch (festival) start once
SHARD_SIZE = 150


@dataclass(frozen=True)
class BuildOptions:
    preset: Preset
    # folder with slurp/, slurpfood/, hwu64/ (and optionally noise/) in the shared data's layout
    data_dir: Path
    out_dir: Path
    seed: int = 0
    # worker processes (default: one per core)
    workers: int = max(1, os.cpu_count() or 1)
    # voices to plan with; None: the screened, installed voices. An explicit list may name voices that are not
    # installed here: their shards are skipped (and rendered by a later run where they are), so a machine
    # with fewer engines builds a subset of the same corpus, with the same held-out voices.
    voices: tuple[str, ...] | None = None
    # splits to render (the plan always covers all of them, so a subset is part of the same corpus)
    splits: tuple[str, ...] = SPLITS
    # > 0: another rendering of the training split, same held-out voices and evaluation splits (plan.make_plan);
    # a training run reads it beside the first with `data.extra_corpora`
    train_variant: int = 0
    # a `write_sentences` file whose sentences replace the training text (e.g. `pasu text-intent pseudo-label`'s
    # unlabelled SLURP sentences); None: the labelled training text of `data_dir`
    train_text: Path | None = None


@dataclass(frozen=True)
class Shard:
    name: str
    jobs: tuple[Job, ...]


def build_corpus(opts: BuildOptions) -> dict:
    """Build (or resume) a corpus; returns the report."""
    started = time.perf_counter()
    text = load_corpus_text(opts.data_dir)
    if opts.train_text is not None:
        text = replace(text, train=read_sentences(opts.train_text))
        check_no_leakage(text)
    voices = list(opts.voices) if opts.voices is not None else tts.usable_voice_ids()
    if not voices:
        raise RuntimeError("no usable TTS voice is installed: run scripts/install_tts.sh")
    plan = make_plan(text, voices, opts.preset, opts.seed, opts.train_variant)
    out = opts.out_dir
    _check_or_write_build_info(out, opts, plan, text.summary())
    (out / "shards").mkdir(parents=True, exist_ok=True)

    _render_babble(out, plan, opts.seed)
    planned = _shards(plan)
    shards, skipped = _renderable([s for s in planned if s.jobs[0].split in opts.splits])
    todo = [s for s in shards if not _shard_done(out, s)]
    log.info("%d shards, %d to render (%d utterances)", len(shards), len(todo), sum(len(s.jobs) for s in todo))
    _run_shards(todo, out, opts)
    # every finished shard, also those of splits or voices an earlier run rendered
    _assemble_manifests(out, [s for s in planned if _shard_done(out, s)])

    from pasu.corpus.report import write_report  # matplotlib is heavy: import only at the end

    return write_report(out, plan, build_seconds=time.perf_counter() - started, skipped_voices=skipped)


def _check_or_write_build_info(out: Path, opts: BuildOptions, plan: Plan, text_summary: dict) -> None:
    info = {
        "preset": asdict(opts.preset),
        "seed": opts.seed,
        "train_variant": opts.train_variant,
        "train_text": None if opts.train_text is None else str(opts.train_text),
        "data_dir": str(opts.data_dir),
        "seen_voices": list(plan.seen_voices),
        "unseen_voices": list(plan.unseen_voices),
        "text": text_summary,
    }
    path = out / "build.json"
    if path.exists():
        old = json.loads(path.read_text())
        keys = ("preset", "seed", "train_variant", "train_text", "seen_voices", "unseen_voices")
        old.setdefault("train_variant", 0)  # builds from before variants existed
        old.setdefault("train_text", None)
        if any(old.get(k) != json.loads(json.dumps(info[k])) for k in keys):
            raise RuntimeError(
                f"{out} holds a build with another preset, seed, variant, training text or voice set; choose another --out or delete it")
        return
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(info, indent=2))


def _shards(plan: Plan) -> list[Shard]:
    by_key: dict[tuple[str, str], list[Job]] = {}
    for job in plan.jobs:
        by_key.setdefault((job.split, job.voice_id), []).append(job)
    shards = []
    for (split, voice), jobs in sorted(by_key.items()):
        for k in range(0, len(jobs), SHARD_SIZE):
            name = f"{split}--{_safe(voice)}--{k // SHARD_SIZE:03d}"
            shards.append(Shard(name, tuple(jobs[k:k + SHARD_SIZE])))
    return shards


def _safe(voice_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in voice_id)


def _renderable(shards: Sequence[Shard]) -> tuple[list[Shard], list[str]]:
    """(shards whose voice is installed, voices that are not); the others are named once and left for
    another run."""
    missing = sorted({s.jobs[0].voice_id for s in shards if not tts.is_installed(tts.voice_by_id(s.jobs[0].voice_id))})
    if missing:
        skipped = sum(len(s.jobs) for s in shards if s.jobs[0].voice_id in missing)
        log.warning("%d planned voices are not installed here; their %d utterances are skipped: %s",
                    len(missing), skipped, ", ".join(missing))
    return [s for s in shards if s.jobs[0].voice_id not in missing], missing


def _shard_done(out: Path, shard: Shard) -> bool:
    return (out / "shards" / f"{shard.name}.jsonl").exists()


def _run_shards(shards: Sequence[Shard], out: Path, opts: BuildOptions) -> None:
    if not shards:
        return
    total = sum(len(s.jobs) for s in shards)
    args = [(s, str(out), str(opts.data_dir)) for s in _interleaved(shards)]
    with tqdm(total=total, unit="utt", desc="rendering", dynamic_ncols=True) as bar:
        if opts.workers <= 1:
            for a in args:
                bar.update(_render_shard(*a))
            return
        ctx = mp.get_context("spawn")  # no fork: engine subprocesses and torch threads don't survive it
        with ctx.Pool(opts.workers, initializer=_quiet_worker) as pool:
            for n in pool.imap_unordered(_render_shard_star, args):
                bar.update(n)


def _interleaved(shards: Sequence[Shard]) -> list[Shard]:
    """Shards dealt round-robin over voices, so what is finished early (read during the build by
    pasu.models.fresh_feed) holds every voice; within a round the largest come first, which keeps every
    worker busy until the end."""
    by_voice: dict[str, list[Shard]] = {}
    for shard in shards:
        by_voice.setdefault(shard.jobs[0].voice_id, []).append(shard)
    rounds = [[queue[k] for queue in by_voice.values() if k < len(queue)]
              for k in range(max(map(len, by_voice.values()), default=0))]
    return [shard for r in rounds for shard in sorted(r, key=lambda s: -len(s.jobs))]


def _quiet_worker() -> None:
    logging.basicConfig(level=logging.WARNING)


def _render_shard_star(args: tuple) -> int:
    return _render_shard(*args)


_BANKS: dict[str, augment.AugmentBanks] = {}


def _banks(data_dir: str, out: str) -> augment.AugmentBanks:
    """Noise and RIR banks, loaded once per worker process."""
    key = f"{data_dir}|{out}"
    if key not in _BANKS:
        babble = [sf.read(p, dtype="float32")[0] for p in sorted((Path(out) / "babble").glob("*.flac"))]
        _BANKS[key] = augment.load_banks(Path(data_dir) / "noise", babble_clips=babble)
    return _BANKS[key]


def _render_shard(shard: Shard, out: str, data_dir: str) -> int:
    """Render one shard; its manifest rows appear only when the whole shard is on disk."""
    out_dir = Path(out)
    banks = _banks(data_dir, out)
    voice = tts.voice_by_id(shard.jobs[0].voice_id)
    renders = tts.Renderer(voice).render_many([(j.sentence.text, j.rate, j.pitch) for j in shard.jobs])
    rows, errors = [], []
    for job, audio in zip(shard.jobs, renders):
        if isinstance(audio, Exception):
            errors.append({"id": job.utt_id, "voice": job.voice_id, "text": job.sentence.text, "error": str(audio)})
            continue
        rows.append(_write_utterance(out_dir, job, audio, banks))
    shard_dir = out_dir / "shards"
    if errors:
        write_text_atomic(shard_dir / f"{shard.name}.errors.jsonl", _jsonl(errors))
    write_text_atomic(shard_dir / f"{shard.name}.jsonl", _jsonl(rows))
    return len(shard.jobs)


def _write_utterance(out: Path, job: Job, audio: np.ndarray, banks: augment.AugmentBanks) -> dict:
    rng = np.random.default_rng(job.seed)
    spec = augment.sample_augmentation(rng, banks)
    audio = augment.apply_augmentation(audio, spec, banks, rng)
    rel = Path("wav") / job.split / f"{job.utt_id}.flac"
    path = out / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.flac")
    sf.write(tmp, audio, SAMPLE_RATE, subtype="PCM_16")
    tmp.replace(path)
    s = job.sentence
    return {
        "id": job.utt_id,
        "audio": str(rel),
        "duration": round(len(audio) / SAMPLE_RATE, 3),
        "engine": engine_of(job.voice_id),
        "voice": job.voice_id,
        "rate": job.rate,
        "pitch": job.pitch,
        "augmentation": asdict(spec),
        **sentence_fields(s),
    }


def _render_babble(out: Path, plan: Plan, seed: int) -> None:
    """Render the clips babble noise is mixed from: training sentences in several training voices."""
    folder = out / "babble"
    n = plan.preset.babble_clips
    if folder.exists() and len(list(folder.glob("*.flac"))) >= n:
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed + 2)
    train = plan.jobs_in("train")
    for k in range(n):
        job = train[int(rng.integers(len(train)))]
        voice = plan.seen_voices[int(rng.integers(len(plan.seen_voices)))]
        try:
            audio = tts.render(tts.voice_by_id(voice), job.sentence.text)
        except tts.TTSError as e:
            log.warning("babble clip %d skipped: %s", k, e)
            continue
        sf.write(folder / f"babble-{k:03d}.flac", audio, SAMPLE_RATE, subtype="PCM_16")


def _assemble_manifests(out: Path, shards: Sequence[Shard]) -> None:
    rows: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for shard in shards:
        rows[shard.jobs[0].split].extend(_read_jsonl(out / "shards" / f"{shard.name}.jsonl"))
    for split, split_rows in rows.items():
        if not split_rows:  # a split no build has rendered yet has no manifest, not an empty one
            continue
        split_rows.sort(key=lambda r: r["id"])
        write_manifest(out / f"{split}.jsonl", split_rows)


def write_manifest(path: Path, rows: Sequence[dict]) -> None:
    """Write a `<split>.jsonl` manifest whole (readers never see a partial one)."""
    write_text_atomic(path, _jsonl(rows))


def read_manifest(path: Path) -> list[dict]:
    """Rows of a `<split>.jsonl` manifest."""
    return list(_read_jsonl(path))


def _read_jsonl(path: Path) -> Iterator[dict]:
    with open(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _jsonl(rows: Sequence[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)

