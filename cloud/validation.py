"""What the server accepts: request parsing and audio decoding, each failure a status code and a plain message.

Everything here runs before a request costs model time, and nothing here trusts the client: a message that
does not parse, an unknown encoding, a wrong rate, a partial sample, NaN, a peak far outside [-1, 1], a
compressed file that does not decode, audio too short or too long, an oversized id all end the call with
INVALID_ARGUMENT or OUT_OF_RANGE and a message that says what is wrong. Messages go to the client and the
logs, so they never quote audio, transcripts or ids back.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc
import numpy as np
import soundfile
from google.protobuf.message import DecodeError, Message
from pasu.protos import slu_pb2

SAMPLE_WIDTH = {slu_pb2.LINEAR16: 2, slu_pb2.FLOAT32: 4}  # bytes per sample of each raw encoding
# Compressed encodings: (libsndfile container, codec) each must hold. Their size limits are LINEAR16's: a
# compressed file is never larger than its 16-bit samples (FLAC stores incompressible frames verbatim).
COMPRESSED = {slu_pb2.FLAC: ("FLAC", "PCM_16"), slu_pb2.OGG_OPUS: ("OGG", "OPUS")}
COMPRESSED_BOUND_WIDTH = 2
MAX_ID_CHARS = 256  # utterance_id and client_id: echoed and logged, so bounded
# FLOAT32 peaks a little over 1 are normal (resampling overshoot) and are clipped; far beyond means the
# client sent integer-scaled samples as float, which would decode to nonsense (or a NaN confidence).
MAX_FLOAT_PEAK = 2.0

M = TypeVar("M", bound=Message)


class RpcFailure(Exception):
    """Ends an RPC with `code`; the message goes to the client, so it never holds audio or transcripts."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class AudioLimits:
    sample_rate: int  # the model's rate; others are rejected (no resampling on the server)
    min_seconds: float  # shorter audio gives the encoder no frames
    max_seconds: float


# --- Messages -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Malformed:
    """A request message that did not parse: the handler answers INVALID_ARGUMENT for it.

    gRPC's own deserializer would raise inside the server and answer UNKNOWN with a traceback in the log;
    handing the handler this placeholder instead keeps the answer clear and the call counted in the metrics.
    """

    type_name: str  # the message type it should have been


def lenient_parser(message_type: type[M]) -> Callable[[bytes], M | Malformed]:
    """A request deserializer that returns Malformed instead of raising on bytes that are not a `message_type`."""
    name = message_type.DESCRIPTOR.full_name

    def parse(data: bytes) -> M | Malformed:
        try:
            return message_type.FromString(data)
        except (DecodeError, ValueError):  # ValueError: protobuf's other complaint about bad bytes
            return Malformed(name)

    return parse


def parsed(message: M | Malformed) -> M:
    """`message`, or INVALID_ARGUMENT when it did not parse."""
    if isinstance(message, Malformed):
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"request is not a valid {message.type_name} message")
    return message


def check_metadata(metadata: slu_pb2.UtteranceMetadata) -> None:
    """INVALID_ARGUMENT for ids too long to echo and log."""
    for field in ("utterance_id", "client_id"):
        if len(getattr(metadata, field)) > MAX_ID_CHARS:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                             f"metadata.{field} is longer than {MAX_ID_CHARS} characters")


# --- Audio --------------------------------------------------------------------------------------------------


def check_format(encoding: int, sample_rate: int, limits: AudioLimits) -> int:
    """Bytes per sample of `encoding` (for compressed ones, the bound their size is held to); INVALID_ARGUMENT
    for an unknown encoding or the wrong rate."""
    if encoding not in SAMPLE_WIDTH and encoding not in COMPRESSED:
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                         "audio encoding must be LINEAR16, FLOAT32, FLAC or OGG_OPUS")
    if sample_rate != limits.sample_rate:
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                         f"sample_rate {sample_rate} Hz is not supported: the model expects {limits.sample_rate} Hz "
                         "(resample on the device)")
    return SAMPLE_WIDTH.get(encoding, COMPRESSED_BOUND_WIDTH)


def check_duration(num_bytes: int, width: int, limits: AudioLimits) -> None:
    """OUT_OF_RANGE once the audio is longer than allowed (checked as stream chunks arrive, too)."""
    seconds = num_bytes / width / limits.sample_rate
    if seconds > limits.max_seconds:
        raise RpcFailure(grpc.StatusCode.OUT_OF_RANGE,
                         f"audio is {seconds:.1f} s or more, longer than the {limits.max_seconds:g} s limit")


def received_seconds(encoding: int, num_bytes: int, limits: AudioLimits) -> float:
    """Seconds of raw audio in `num_bytes`; 0 for a compressed encoding (known only once decoded)."""
    return num_bytes / SAMPLE_WIDTH[encoding] / limits.sample_rate if encoding in SAMPLE_WIDTH else 0.0


def decode_audio(encoding: int, sample_rate: int, data: bytes, limits: AudioLimits) -> np.ndarray:
    """Validated float32 waveform in [-1, 1] from wire bytes; RpcFailure says what is wrong."""
    width = check_format(encoding, sample_rate, limits)
    if not data:
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "empty audio")
    if encoding in COMPRESSED:
        return _decode_compressed(encoding, data, limits)
    if len(data) % width:
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                         f"audio is {len(data)} bytes, not a whole number of {width}-byte samples")
    check_duration(len(data), width, limits)
    if len(data) / width / sample_rate < limits.min_seconds:
        raise RpcFailure(grpc.StatusCode.OUT_OF_RANGE, f"audio is shorter than {limits.min_seconds:g} s")
    if encoding == slu_pb2.LINEAR16:
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
    waveform = np.frombuffer(data, dtype="<f4").astype(np.float32)
    if not np.all(np.isfinite(waveform)):
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "audio contains NaN or infinite samples")
    peak = float(np.max(np.abs(waveform)))
    if peak > MAX_FLOAT_PEAK:
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                         f"FLOAT32 samples must lie in [-1, 1], this audio peaks at {peak:.4g} "
                         "(integer samples go as LINEAR16)")
    return np.clip(waveform, -1.0, 1.0) if peak > 1.0 else waveform


def _decode_compressed(encoding: int, data: bytes, limits: AudioLimits) -> np.ndarray:
    """The samples of a FLAC or Ogg Opus file, its header checked before anything is decoded."""
    container, codec = COMPRESSED[encoding]
    name = slu_pb2.AudioEncoding.Name(encoding)
    check_duration(len(data), COMPRESSED_BOUND_WIDTH, limits)
    try:
        info = soundfile.info(io.BytesIO(data))
    except (soundfile.LibsndfileError, RuntimeError, TypeError):
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"audio is not a valid {name} file") from None
    if (info.format, info.subtype) != (container, codec):
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                         f"audio is {info.format}/{info.subtype}, not {name} ({container}/{codec})")
    if info.channels != 1:
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"audio has {info.channels} channels; send mono")
    if info.samplerate != limits.sample_rate:
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT,
                         f"the {name} file is at {info.samplerate} Hz, the request says {limits.sample_rate} Hz")
    # the header's length, checked before decoding: a small file must not decode into hours of audio
    check_duration(info.frames * COMPRESSED_BOUND_WIDTH, COMPRESSED_BOUND_WIDTH, limits)
    try:
        waveform, _ = soundfile.read(io.BytesIO(data), dtype="float32", frames=info.frames, always_2d=False)
    except (soundfile.LibsndfileError, RuntimeError):
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"audio is not a valid {name} file") from None
    if len(waveform) / limits.sample_rate < limits.min_seconds:
        raise RpcFailure(grpc.StatusCode.OUT_OF_RANGE, f"audio is shorter than {limits.min_seconds:g} s")
    if not np.all(np.isfinite(waveform)):
        raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "audio contains NaN or infinite samples")
    return np.clip(waveform, -1.0, 1.0)  # lossy codecs overshoot a little on loud audio
