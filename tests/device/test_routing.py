"""Routing options: the policy they name and the token they read."""

from __future__ import annotations

import pytest

from pasu.device.routing import AllOffload, OfframpPolicy, OnDevice, RoutingOptions


def test_policy_names():
    assert isinstance(RoutingOptions(policy="on-device").make_policy(), OnDevice)
    assert isinstance(RoutingOptions(policy="all").make_policy(), AllOffload)
    ppl = RoutingOptions(policy="ppl", threshold=2.5).make_policy()
    assert isinstance(ppl, OfframpPolicy) and ppl.threshold == 2.5


def test_token_comes_from_the_token_file(tmp_path):
    assert RoutingOptions().token() is None
    (tmp_path / "token").write_text("# this device's token\n\n  s3cret  \nignored\n")
    assert RoutingOptions(token_file=str(tmp_path / "token")).token() == "s3cret"
    with pytest.raises(FileNotFoundError):
        RoutingOptions(token_file=str(tmp_path / "missing")).token()
