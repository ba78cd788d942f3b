"""What the scripts that run on a lent GPU share: importing the checkout as `pasu`, and `--set FIELD=VALUE`
overrides of a frozen options dataclass."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import sys
import tomllib
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def map_checkout() -> None:
    """Make `pasu` importable from the checkout where the project is not installed (the GPU machine has PyTorch
    but not this project): each folder mapped to the package pyproject.toml's package-dir installs it as."""
    if importlib.util.find_spec("pasu") is not None:
        return
    package_dir = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name, folder in sorted(package_dir.items()):  # parents first
        module = types.ModuleType(name)
        module.__path__ = [str(REPO / folder)]
        sys.modules[name] = module


def add_set_argument(parser: argparse.ArgumentParser, options_name: str, module: str) -> None:
    parser.set_defaults(options=options_name)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help=f"override a field of {options_name} ({module})")


def options_from_sets(parser: argparse.ArgumentParser, cls: type, sets: list[str]) -> object:
    """`cls` with the `--set FIELD=VALUE` items applied (each value cast to the field default's type)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    overrides = {}
    for item in sets:
        key, _, value = item.partition("=")
        if key not in fields:
            parser.error(f"--set {item}: {cls.__name__} has no field {key!r} (it has {', '.join(sorted(fields))})")
        default = getattr(cls(), key)
        overrides[key] = value.lower() in ("1", "true", "yes") if isinstance(default, bool) else type(default)(value)
    return cls(**overrides)
