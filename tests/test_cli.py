"""Process-wide settings of the `pasu` command."""

from __future__ import annotations

import logging

import pytest

from pasu.cli import configure_logging


@pytest.fixture
def espnet_level():
    logger = logging.getLogger("espnet")
    before = logger.level
    yield
    logger.setLevel(before)


def test_decoded_hypotheses_stay_out_of_info_logs(espnet_level):
    beam_search = logging.getLogger("espnet.nets.beam_search")  # logs "best hypo: <transcript>" at INFO
    configure_logging(verbose=False)
    assert not beam_search.isEnabledFor(logging.INFO)
    configure_logging(verbose=True)
    assert beam_search.isEnabledFor(logging.INFO)
