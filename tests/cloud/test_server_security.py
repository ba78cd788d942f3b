"""Security beyond test_server.py's TLS/mTLS/token tests: per-client stream limits, wrong credentials on
streams and certificates, and no user content or secrets in the logs of `pasu cloud serve`."""

from __future__ import annotations

import logging
import threading

import grpc
import pytest
from pasu.cloud.config import TlsConfig
from pasu.device.cloud_client import ClientTls, CloudClient, FallbackReason
from pasu.protos import slu_pb2

from pasu.metrics import SluResult


def _fails(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def _open_streams(stub, n: int, metadata=()) -> tuple[list, threading.Event]:
    """`n` streams that sent their config and wait (holding a slot) until the event is set."""
    release = threading.Event()

    def messages():
        yield slu_pb2.StreamRequest(config=slu_pb2.StreamConfig(encoding=slu_pb2.LINEAR16, sample_rate=16000,
                                                                send_acks=True))
        yield slu_pb2.StreamRequest(audio=bytes(3200))
        release.wait(30)
        yield slu_pb2.StreamRequest(end=slu_pb2.EndOfAudio())

    calls = [stub.StreamingUnderstand(messages(), timeout=60, metadata=metadata) for _ in range(n)]
    for call in calls:
        assert next(call).WhichOneof("response") == "ack"  # the server is holding this stream now
    return calls, release


def _bearer(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


# --- Per-client limits ------------------------------------------------------------------------------------


def test_one_client_cannot_hold_more_than_its_streams(support, start_server, stub_for):
    server = start_server(auth_tokens=("device-a", "device-b"), max_streams_per_client=2)
    stub = stub_for(server)
    calls, release = _open_streams(stub, 2, _bearer("device-a"))
    try:
        got, details = _fails(lambda: stub.Understand(support.request(0.5), timeout=10, metadata=_bearer("device-a")))
        assert got == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert details == "too many concurrent calls from this client (limit 2)"
        # Another device is not affected by device-a's streams.
        assert stub.Understand(support.request(0.5), timeout=20, metadata=_bearer("device-b")).model_id
    finally:
        release.set()
    assert all(list(call)[-1].WhichOneof("response") == "result" for call in calls)
    # Slots are given back when streams end.
    assert stub.Understand(support.request(0.5), timeout=20, metadata=_bearer("device-a")).model_id


def test_unverified_tokens_do_not_escape_the_address_limit(support, start_server, stub_for):
    # Without token auth the bucket is the peer address: inventing a token per call gains nothing.
    server = start_server(max_streams_per_client=2)
    stub = stub_for(server)
    calls, release = _open_streams(stub, 2, _bearer("made-up-1"))
    try:
        got, _ = _fails(lambda: stub.Understand(support.request(0.5), timeout=10, metadata=_bearer("made-up-2")))
        assert got == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        release.set()
    for call in calls:
        list(call)


# --- Wrong credentials ------------------------------------------------------------------------------------


def test_wrong_token_on_a_stream_is_unauthenticated_before_any_audio(support, start_server, stub_for):
    server = start_server(auth_tokens=("right",))
    stub = stub_for(server)
    messages = [slu_pb2.StreamRequest(config=slu_pb2.StreamConfig(encoding=slu_pb2.LINEAR16, sample_rate=16000)),
                slu_pb2.StreamRequest(audio=support.pcm16(0.5))]
    for metadata in [(), _bearer("wrong"), _bearer("righ"), _bearer("right-and-more")]:
        got, details = _fails(lambda m=metadata: list(stub.StreamingUnderstand(iter(messages), timeout=10, metadata=m)))
        assert got == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in details
    assert server.metrics.value("pasu_cloud_batch_size_count") == 0


def test_client_certificate_from_another_ca_is_refused(support, start_server, tmp_path):
    (tmp_path / "ours").mkdir()
    (tmp_path / "theirs").mkdir()
    pki = support.make_pki(tmp_path / "ours")
    theirs = support.make_pki(tmp_path / "theirs")  # a valid certificate, signed by a CA we do not trust
    server = start_server(tls=TlsConfig(cert=str(pki.server_cert), key=str(pki.server_key), client_ca=str(pki.ca)))
    target = f"127.0.0.1:{server.port}"
    tls = ClientTls(root_ca=str(pki.ca), cert=str(theirs.client_cert), key=str(theirs.client_key))
    with CloudClient(target, deadline_s=3, tls=tls) as client:
        outcome = client.understand(support.waveform(0.5), 16000)
    # The handshake fails, which gRPC reports as UNAVAILABLE: no call reaches the service.
    assert outcome.fallback is FallbackReason.UNAVAILABLE
    good = ClientTls(root_ca=str(pki.ca), cert=str(pki.client_cert), key=str(pki.client_key))
    with CloudClient(target, deadline_s=20, tls=good) as client:
        assert client.understand(support.waveform(0.5), 16000).ok


# --- Logs -------------------------------------------------------------------------------------------------


def test_server_logs_hold_no_audio_transcripts_or_tokens(support, tmp_path):
    token = "tok-3f9a1c7e5b2d"
    pilot = SluResult("pilotwordsecret set alarm", "alarm_set", ())
    folder = support.write_model_folder(tmp_path / "model")
    (tmp_path / "tokens").write_text(token + "\n")
    with support.CliServer(folder, "--token-file", str(tmp_path / "tokens"), "--grace", "5") as server:
        with CloudClient(server.address, deadline_s=30, token=token) as client:
            outcome = client.understand(support.waveform(1.0), 16000, utterance_id="u-log", pilot=pilot)
        with CloudClient(server.address, deadline_s=10, token=token + "x") as intruder:
            assert intruder.understand(support.waveform(0.5), 16000).fallback is FallbackReason.UNAUTHENTICATED
        assert server.stop() == 0
    assert outcome.ok
    log = "".join(server.lines)
    assert {"rpc", "stopped"} <= {e["msg"] for e in server.log()}  # the log is there, and ...
    assert token not in log and "pilotwordsecret" not in log  # ... holds no token, no pilot hypothesis,
    transcript = outcome.cloud.result.text
    assert not transcript or f'"{transcript}"' not in log  # no transcript,
    assert "transcript" not in log  # and no field that would carry one


def test_log_content_is_opt_in(support, start_server, caplog):
    """The same check can fail: with log_content on, the transcript is in the rpc log line."""
    server = start_server(log_content=True)
    with caplog.at_level(logging.INFO, logger="pasu.cloud"):
        with CloudClient(f"127.0.0.1:{server.port}", deadline_s=20) as client:
            outcome = client.understand(support.waveform(1.0), 16000)
        assert support.eventually(lambda: any(getattr(r, "fields", {}).get("method") == "Understand"
                                              for r in caplog.records))
    [rpc] = [r.fields for r in caplog.records if getattr(r, "fields", {}).get("method") == "Understand"]
    assert rpc["transcript"] == outcome.cloud.result.text
