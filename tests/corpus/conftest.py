"""Fixtures the corpus command tests share."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from pasu.corpus.cli import register


@pytest.fixture
def pasu_corpus(capsys) -> Callable[..., tuple[int, str]]:
    """pasu_corpus("import-slurp", *args) -> (exit code, what it printed to stdout and stderr)."""
    def run(*args: str) -> tuple[int, str]:
        parser = argparse.ArgumentParser()
        register(parser.add_subparsers(dest="command", required=True))
        parsed = parser.parse_args(["corpus", *args])
        rc = parsed.run(parsed)
        captured = capsys.readouterr()
        return rc, captured.out + captured.err

    return run
