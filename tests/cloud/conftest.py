"""Fixtures for the cloud server tests: real servers on 127.0.0.1 with free ports, in this process."""

from __future__ import annotations


import grpc
import pytest


@pytest.fixture(scope="session")
def support(cloud_support):
    return cloud_support


@pytest.fixture
def start_server(support):
    """start_server(recognizer=None, **ServerConfig fields) -> a started ServerThread, stopped at teardown."""
    from pasu.cloud.config import ServerConfig
    from pasu.cloud.server import ServerThread

    started = []

    def start(recognizer=None, **config):
        # text_intent: the recognizer's own answers, whether or not a classifier ships (tests opt in)
        config = {"host": "127.0.0.1", "port": 0, "metrics_port": None, "shutdown_grace_s": 0.0, "text_intent": None,
                  **config}
        server = ServerThread(recognizer or support.tiny_recognizer(), ServerConfig(**config)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop(grace=0)


@pytest.fixture
def stub_for():
    """stub_for(server) -> a SpeechUnderstanding stub on a fresh plaintext channel, closed at teardown."""
    from pasu.protos import slu_pb2_grpc

    channels = []

    def make(server):
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        channels.append(channel)
        return slu_pb2_grpc.SpeechUnderstandingStub(channel)

    yield make
    for channel in channels:
        channel.close()
