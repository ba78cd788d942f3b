"""Fixtures for the cloud server tests: real servers on 127.0.0.1 with free ports, in this process."""

from __future__ import annotations


import grpc
import pytest


@pytest.fixture(scope="session")
def support(cloud_support):
    return cloud_support


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
