"""Bad input against a real server on 127.0.0.1: each gets a clear status and message, and the server keeps serving.

Complements test_server.py (empty, unknown encoding, 8 kHz, odd bytes, NaN, too long, too short, message size)
with malformed files, degenerate audio, corrupt protobuf, streams that stall or never end, and a fuzz run.
"""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pasu.device.audio import AudioError, check_length, load_audio
from pasu.device.cloud_client import CloudClient, FallbackReason
from pasu.protos import slu_pb2, slu_pb2_grpc

from pasu.settings import shared_data_dir

BAD_AUDIO = shared_data_dir() / "bad_audio"
UNDERSTAND = "/pasu.v1.SpeechUnderstanding/Understand"
STREAM = "/pasu.v1.SpeechUnderstanding/StreamingUnderstand"
CLEAR_REJECTIONS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE,
                    grpc.StatusCode.RESOURCE_EXHAUSTED}


def _fails(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def _still_serving(support, stub) -> None:
    assert stub.Understand(support.request(0.5, utterance_id="next"), timeout=20).utterance_id == "next"


def _config(**fields) -> slu_pb2.StreamRequest:
    fields = {"encoding": slu_pb2.LINEAR16, "sample_rate": 16000, **fields}
    return slu_pb2.StreamRequest(config=slu_pb2.StreamConfig(**fields))


# --- Degenerate audio -------------------------------------------------------------------------------------


def test_silence_gets_a_result_with_a_valid_confidence(support, start_server, stub_for):
    stub = stub_for(start_server())
    silence = slu_pb2.UnderstandRequest(audio=slu_pb2.Audio(encoding=slu_pb2.LINEAR16, sample_rate=16000,
                                                            data=bytes(32000)))
    response = stub.Understand(silence, timeout=20)
    assert 0.0 <= response.confidence <= 1.0 and response.model_id


@pytest.mark.parametrize("samples, code, message", [
    (np.full(16000, 40000.0), grpc.StatusCode.INVALID_ARGUMENT, "must lie in [-1, 1]"),
    (np.r_[np.zeros(8000), np.inf], grpc.StatusCode.INVALID_ARGUMENT, "NaN or infinite"),
    (np.zeros(0), grpc.StatusCode.INVALID_ARGUMENT, "empty audio"),
], ids=["int-scaled-float", "inf", "zero-length"])
def test_degenerate_float_audio(support, start_server, stub_for, samples, code, message):
    stub = stub_for(start_server())
    request = slu_pb2.UnderstandRequest(audio=slu_pb2.Audio(
        encoding=slu_pb2.FLOAT32, sample_rate=16000, data=samples.astype("<f4").tobytes()))
    got, details = _fails(lambda: stub.Understand(request, timeout=10))
    assert got == code and message in details
    _still_serving(support, stub)


@pytest.mark.parametrize("rate", [44100, 48000])
def test_other_rates_are_refused_in_streams_before_any_audio(support, start_server, stub_for, rate):
    stub = stub_for(start_server())
    got, details = _fails(lambda: list(stub.StreamingUnderstand(iter([_config(sample_rate=rate)]), timeout=10)))
    assert got == grpc.StatusCode.INVALID_ARGUMENT and "expects 16000 Hz" in details
    _still_serving(support, stub)


# --- Files: the device decodes, the server never sees what cannot be decoded ------------------------------


def _bad_files(support, tmp_path) -> dict[str, bytes]:
    """Malformed WAV files made here (the shared bad_audio set is added when present)."""
    good = tmp_path / "good.wav"
    sf.write(good, support.waveform(1.0), 16000, subtype="PCM_16")
    data = good.read_bytes()
    files = {
        "truncated-data": data[: 44 + 16000],  # header says 1 s of samples, 0.5 s are there
        "header-only": data[:44],
        "wrong-magic": b"RIFX" + data[4:],
        "not-wave": data[:8] + b"AVI " + data[12:],
        "garbage": bytes(range(256)) * 4,
        "empty": b"",
    }
    if BAD_AUDIO.is_dir():
        files.update({p.name: p.read_bytes() for p in sorted(BAD_AUDIO.glob("*.wav"))})
    return files


def test_malformed_files_get_a_clear_error_or_a_result(support, start_server, tmp_path):
    server = start_server()
    outcomes = {}
    with CloudClient(f"127.0.0.1:{server.port}", deadline_s=20) as client:
        for name, data in _bad_files(support, tmp_path).items():
            path = tmp_path / f"in-{name}"
            path.write_bytes(data)
            try:
                waveform = load_audio(path)
                check_length(len(waveform))
            except AudioError as error:
                outcomes[name] = str(error)  # says what is wrong with the file
                continue

            outcome = client.understand(waveform, 16000, utterance_id=name)
            assert outcome.ok or outcome.fallback is FallbackReason.REJECTED, outcome.detail
            outcomes[name] = outcome
        assert client.understand(support.waveform(0.5), 16000).ok  # and the server still serves
    assert "not a readable audio file" in outcomes["garbage"] and "not a readable" in outcomes["wrong-magic"]
    assert "zero samples" in outcomes["header-only"]
    truncated = outcomes["truncated-data"]  # what is there is decoded and understood
    assert truncated.ok and truncated.cloud.model_id == "tiny-untrained"
    if BAD_AUDIO.is_dir():
        assert "zero samples" in outcomes["null.wav"] and "not a readable" in outcomes["evil.wav"]
        assert "too short" in outcomes["awful.wav"]  # 441 samples claimed at 1,092,676 Hz


def test_unsendable_waveforms_fall_back_without_a_call(start_server):
    server = start_server()
    with CloudClient(f"127.0.0.1:{server.port}", deadline_s=5) as client:
        stereo = client.understand(np.zeros((16000, 2), np.float32), 16000)
        nan = client.understand(np.full(16000, np.nan, np.float32), 16000)
    assert stereo.fallback is FallbackReason.REJECTED and "mono" in stereo.detail and stereo.attempts == 0
    assert nan.fallback is FallbackReason.REJECTED and "NaN" in nan.detail and nan.attempts == 0
    assert server.metrics.value("pasu_cloud_requests_total", {"method": "Understand", "code": "OK"}) == 0


# --- Protobuf --------------------------------------------------------------------------------------------


def test_corrupt_protobuf_is_invalid_argument_not_unknown(support, start_server):
    server = start_server()
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        raw = channel.unary_unary(UNDERSTAND)  # bytes in, bytes out: no client-side serialization
        got, details = _fails(lambda: raw(b"\xff\xff\xff", timeout=10))
        assert got == grpc.StatusCode.INVALID_ARGUMENT
        assert details == "request is not a valid pasu.v1.UnderstandRequest message"
        stream = channel.stream_stream(STREAM)
        got, details = _fails(lambda: list(stream(iter([_config().SerializeToString(), b"\x12\xff"]), timeout=10)))
        assert got == grpc.StatusCode.INVALID_ARGUMENT and "pasu.v1.StreamRequest" in details
        _still_serving(support, slu_pb2_grpc.SpeechUnderstandingStub(channel))
    assert support.eventually(lambda: server.metrics.value(
        "pasu_cloud_requests_total", {"method": "Understand", "code": "INVALID_ARGUMENT"}) == 1)


def test_missing_and_invalid_fields(support, start_server, stub_for):
    stub = stub_for(start_server())
    cases = [
        (lambda: stub.Understand(slu_pb2.UnderstandRequest(metadata=slu_pb2.UtteranceMetadata(utterance_id="u")),
                                 timeout=10), "encoding must be LINEAR16, FLOAT32, FLAC or OGG_OPUS"),
        (lambda: stub.Understand(slu_pb2.UnderstandRequest(
            audio=slu_pb2.Audio(encoding=slu_pb2.LINEAR16, data=support.pcm16(0.5))), timeout=10),
         "sample_rate 0 Hz"),
        (lambda: stub.Understand(slu_pb2.UnderstandRequest(
            audio=slu_pb2.Audio(encoding=7, sample_rate=16000, data=support.pcm16(0.5))), timeout=10),
         "encoding must be"),
        (lambda: stub.Understand(support.request(0.5, utterance_id="x" * 10_000), timeout=10),
         "utterance_id is longer than 256"),
        (lambda: list(stub.StreamingUnderstand(iter([slu_pb2.StreamRequest()]), timeout=10)),
         "first message must be a StreamConfig"),
        (lambda: list(stub.StreamingUnderstand(iter([_config(), _config()]), timeout=10)), "StreamConfig sent twice"),
        (lambda: list(stub.StreamingUnderstand(iter([_config(), slu_pb2.StreamRequest(end=slu_pb2.EndOfAudio())]),
                                               timeout=10)), "empty audio"),
        (lambda: list(stub.StreamingUnderstand(iter([]), timeout=10)), "no StreamConfig"),
    ]
    for call, message in cases:
        got, details = _fails(call)
        assert got == grpc.StatusCode.INVALID_ARGUMENT and message in details, (got, details)
    _still_serving(support, stub)


def test_stream_chunk_over_the_message_size_limit(support, start_server, stub_for):
    stub = stub_for(start_server(max_message_bytes=64 * 1024))
    messages = [_config(), slu_pb2.StreamRequest(audio=support.pcm16(3.0))]  # 96 kB in one chunk
    got, _ = _fails(lambda: list(stub.StreamingUnderstand(iter(messages), timeout=10)))
    assert got == grpc.StatusCode.RESOURCE_EXHAUSTED
    _still_serving(support, stub)


# --- Streams that stall or never end ---------------------------------------------------------------------


def _stalled_stream(first: list[slu_pb2.StreamRequest], release: threading.Event, dribble_s: float | None = None):
    """Send `first`, then nothing until `release` (or, with `dribble_s`, one tiny chunk that often, forever)."""
    yield from first
    while not release.wait(dribble_s):
        yield slu_pb2.StreamRequest(audio=b"\x00\x00")


@pytest.mark.parametrize("first, dribble_s, message", [
    ([], None, "no stream message for 0.5 s"),
    ([_config(), slu_pb2.StreamRequest(audio=bytes(3200))], None, "no stream message for 0.5 s"),
    ([_config()], 0.1, "stream open longer than the 1.5 s limit"),
], ids=["never-sends-config", "never-ends", "dribbles-forever"])
def test_stalled_streams_are_ended_by_the_server(support, start_server, stub_for, first, dribble_s, message):
    server = start_server(stream_idle_timeout_s=0.5, max_stream_seconds=1.5)
    stub = stub_for(server)
    release = threading.Event()
    started = time.monotonic()
    try:  # the client deadline is far away: the server must end these calls itself, soon
        got, details = _fails(lambda: list(stub.StreamingUnderstand(_stalled_stream(first, release, dribble_s),
                                                                    timeout=60)))
    finally:
        release.set()
    assert got == grpc.StatusCode.OUT_OF_RANGE and message in details
    assert time.monotonic() - started < 30
    _still_serving(support, stub)
    assert support.eventually(lambda: server.metrics.value("pasu_cloud_in_flight") == 0)  # its slot is free


# --- Fuzz -------------------------------------------------------------------------------------------------


def _request_bytes(encoding: int, rate: int, data: bytes, utterance_id: str) -> bytes:
    audio = slu_pb2.Audio(encoding=encoding, sample_rate=rate, data=data)
    return slu_pb2.UnderstandRequest(audio=audio, metadata=slu_pb2.UtteranceMetadata(
        utterance_id=utterance_id)).SerializeToString()


REQUESTS = st.one_of(
    st.binary(max_size=2048),  # anything at all
    st.builds(_request_bytes, st.sampled_from([0, 1, 2, 5]), st.sampled_from([16000, 16000, 8000, -1]),
              st.binary(min_size=0, max_size=12_000), st.text(max_size=300)),
    st.builds(lambda data, cut: data[:cut], st.builds(_request_bytes, st.just(1), st.just(16000),
                                                      st.binary(min_size=3200, max_size=6400), st.just("t")),
              st.integers(0, 6400)),  # truncated messages
)


def test_fuzz_requests_get_a_result_or_a_clear_error(support, start_server):
    server = start_server()  # one server for every example: it must survive them all
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        understand = channel.unary_unary(UNDERSTAND)  # raw bytes: the fuzzer writes the wire format

        @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(payload=REQUESTS)
        def one_request(payload: bytes) -> None:
            try:
                reply = slu_pb2.UnderstandResponse.FromString(understand(payload, timeout=20))
                assert 0.0 <= reply.confidence <= 1.0
            except grpc.RpcError as error:
                assert error.code() in CLEAR_REJECTIONS and error.details(), (error.code(), error.details())

        one_request()
        _still_serving(support, slu_pb2_grpc.SpeechUnderstandingStub(channel))
