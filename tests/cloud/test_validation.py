"""Request parsing and audio decoding on their own, with property-based fuzzing (a bounded number of cases).

The properties: whatever bytes arrive, parsing never raises (it yields a message or Malformed), and decoding
either returns a finite float32 waveform in [-1, 1] of the right length or fails with INVALID_ARGUMENT or
OUT_OF_RANGE and a message; never another exception.
"""

from __future__ import annotations

import io

import grpc
import numpy as np
import pytest
import soundfile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pasu.cloud.validation import (
    MAX_ID_CHARS,
    AudioLimits,
    Malformed,
    RpcFailure,
    check_metadata,
    decode_audio,
    lenient_parser,
    parsed,
)
from pasu.protos import slu_pb2

LIMITS = AudioLimits(sample_rate=16000, min_seconds=0.1, max_seconds=2.0)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REJECTIONS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE}


def _failure(call) -> RpcFailure:
    with pytest.raises(RpcFailure) as info:
        call()
    return info.value


# --- Parsing ----------------------------------------------------------------------------------------------


def test_lenient_parser_returns_malformed_for_corrupt_bytes():
    parse = lenient_parser(slu_pb2.UnderstandRequest)
    assert isinstance(parse(b"\xff\xff\xff"), Malformed)
    failure = _failure(lambda: parsed(parse(b"\xff\xff\xff")))
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT
    assert failure.message == "request is not a valid pasu.v1.UnderstandRequest message"
    request = slu_pb2.UnderstandRequest(audio=slu_pb2.Audio(sample_rate=16000, data=b"ab"))
    assert parsed(parse(request.SerializeToString())) == request


def test_invalid_utf8_in_a_string_field_is_malformed():
    # field 2 (metadata), length 3, holding field 1 (utterance_id) = one byte 0xff: not UTF-8.
    data = b"\x12\x03\x0a\x01\xff"
    assert isinstance(lenient_parser(slu_pb2.UnderstandRequest)(data), Malformed)


def test_ids_are_bounded():
    check_metadata(slu_pb2.UtteranceMetadata(utterance_id="u" * MAX_ID_CHARS))
    failure = _failure(lambda: check_metadata(slu_pb2.UtteranceMetadata(client_id="c" * (MAX_ID_CHARS + 1))))
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT and "client_id is longer" in failure.message


@FUZZ
@given(st.binary(max_size=512))
def test_fuzz_parsing_never_raises(data):
    for message_type in (slu_pb2.UnderstandRequest, slu_pb2.StreamRequest):
        result = lenient_parser(message_type)(data)
        assert isinstance(result, Malformed | message_type)


# --- Audio ------------------------------------------------------------------------------------------------


def test_float32_peaks_are_clipped_or_refused():
    slightly_hot = np.full(4000, 1.2, "<f4").tobytes()
    waveform = decode_audio(slu_pb2.FLOAT32, 16000, slightly_hot, LIMITS)
    assert waveform.max() == 1.0  # clipped, as a saturating converter would
    int_scaled = np.full(4000, 32767.0, "<f4").tobytes()
    failure = _failure(lambda: decode_audio(slu_pb2.FLOAT32, 16000, int_scaled, LIMITS))
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT and "peaks at 3.277e+04" in failure.message


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_non_finite_float32_is_refused(value):
    data = np.array([0.1] * 3999 + [value], "<f4").tobytes()
    failure = _failure(lambda: decode_audio(slu_pb2.FLOAT32, 16000, data, LIMITS))
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT and "NaN or infinite" in failure.message


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000, 0, -16000])
def test_other_sample_rates_are_refused_with_the_expected_one(rate):
    failure = _failure(lambda: decode_audio(slu_pb2.LINEAR16, rate, b"\x00\x00" * 4000, LIMITS))
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"sample_rate {rate} Hz is not supported: the model expects 16000 Hz" in failure.message


def _file(samples: np.ndarray, rate: int = 16000, container: str = "FLAC", codec: str = "PCM_16") -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=container, subtype=codec)
    return buffer.getvalue()


def test_flac_decodes_to_its_samples_and_opus_to_about_them():
    tone = np.round(np.sin(np.arange(8000) * 0.05) * 0.3 * 32768).astype(np.int16)
    flac = decode_audio(slu_pb2.FLAC, 16000, _file(tone), LIMITS)
    assert np.array_equal(flac, tone / np.float32(32768.0))
    opus = decode_audio(slu_pb2.OGG_OPUS, 16000, _file(tone, container="OGG", codec="OPUS"), LIMITS)
    assert opus.dtype == np.float32 and len(opus) == len(tone) and np.abs(opus - tone / 32768.0).max() < 0.1


@pytest.mark.parametrize("encoding, data, message", [
    (slu_pb2.FLAC, b"fLaC" + bytes(200), "not a valid FLAC file"),
    (slu_pb2.OGG_OPUS, bytes(range(256)) * 4, "not a valid OGG_OPUS file"),
    (slu_pb2.FLAC, _file(np.zeros(8000, np.int16), container="OGG", codec="OPUS"), "is OGG/OPUS, not FLAC"),
    (slu_pb2.FLAC, _file(np.zeros((8000, 2), np.int16)), "2 channels; send mono"),
    (slu_pb2.FLAC, _file(np.zeros(4000, np.int16), rate=8000), "the FLAC file is at 8000 Hz"),
])
def test_compressed_audio_that_is_not_what_it_claims_is_refused(encoding, data, message):
    failure = _failure(lambda: decode_audio(encoding, 16000, data, LIMITS))
    assert failure.code == grpc.StatusCode.INVALID_ARGUMENT and message in failure.message


def test_compressed_audio_length_is_checked_from_its_header():
    long = _file(np.zeros(int(16000 * 2.5), np.int16))  # silence: a few hundred bytes for 2.5 s
    assert len(long) < 2000
    failure = _failure(lambda: decode_audio(slu_pb2.FLAC, 16000, long, LIMITS))
    assert failure.code == grpc.StatusCode.OUT_OF_RANGE and "2.5 s or more, longer than the 2 s limit" in failure.message
    failure = _failure(lambda: decode_audio(slu_pb2.FLAC, 16000, _file(np.zeros(800, np.int16)), LIMITS))
    assert failure.code == grpc.StatusCode.OUT_OF_RANGE and "shorter than 0.1 s" in failure.message


@FUZZ
@given(encoding=st.sampled_from([0, 1, 2, 3, 4, -1, 99]), rate=st.sampled_from([16000, 16000, 8000, 0, -1]),
       data=st.one_of(st.binary(max_size=80_000),
                      st.builds(lambda n, v: np.full(n, v, "<f4").tobytes(), st.integers(0, 40_000),
                                st.floats(width=32, allow_nan=True, allow_infinity=True))))
def test_fuzz_decoding_returns_clean_audio_or_a_clear_rejection(encoding, rate, data):
    try:
        waveform = decode_audio(encoding, rate, data, LIMITS)
    except RpcFailure as failure:
        assert failure.code in REJECTIONS and failure.message
        return
    assert rate == 16000 and waveform.dtype == np.float32
    if encoding in (slu_pb2.LINEAR16, slu_pb2.FLOAT32):
        assert len(waveform) == len(data) // {slu_pb2.LINEAR16: 2, slu_pb2.FLOAT32: 4}[encoding]
    assert LIMITS.min_seconds <= len(waveform) / rate <= LIMITS.max_seconds
    assert np.all(np.isfinite(waveform)) and np.abs(waveform).max() <= 1.0
