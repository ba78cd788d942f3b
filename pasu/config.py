"""Component settings from YAML: the one loader behind `pasu device run --config` and `pasu cloud serve --config`.

A component's settings are a tree of frozen dataclasses, one comment per field; its YAML file is the same tree
as nested mappings. Loading lays the file over the defaults, so a file names only what it changes (a nested
section keeps the defaults of its enclosing field, not those of its class). Unknown keys, values outside a
Literal and values of the wrong type are errors that name the key's full path: a typo fails at start.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

T = TypeVar("T")

_SCALARS = (bool, int, float, str)


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """A YAML file's top-level mapping ({} for an empty file)."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return raw


def given(**flags: Any) -> dict[str, Any]:
    """The command-line flags that were given (argparse leaves the others None), to lay over the YAML's values."""
    return {name: value for name, value in flags.items() if value is not None}


def from_dict(cls: type[T], raw: Mapping[str, Any], source: str, base: T | None = None) -> T:
    """`base` with the values of `raw` (a new `cls` when `base` is None).

    Errors read `SOURCE: KEY.PATH: what is wrong`, `source` naming where `raw` came from (a file, ...)."""
    try:
        return _dataclass(cls, raw, "", base)
    except ValueError as error:
        raise ValueError(f"{source}: {error}") from None


def _dataclass(cls: type[T], raw: Any, where: str, base: T | None) -> T:
    if not isinstance(raw, Mapping):
        raise _invalid(where, f"expected a mapping, got {raw!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise _invalid(where, f"unknown keys {unknown}; known: {names}")
    hints = typing.get_type_hints(cls)
    values = {key: _value(hints[key], value, f"{where}.{key}" if where else key, getattr(base, key, None))
              for key, value in raw.items()}
    try:
        return dataclasses.replace(base, **values) if base is not None else cls(**values)
    except (TypeError, ValueError) as error:  # a required field is missing, or the class refuses the values
        raise _invalid(where, str(error)) from None


def _value(kind: Any, value: Any, where: str, current: Any) -> Any:
    """`value` checked against the annotation `kind`; mappings become dataclasses laid over `current`."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (kind,) = [a for a in args if a is not type(None)]  # the settings use only `X | None` unions
        origin, args = typing.get_origin(kind), typing.get_args(kind)
    if dataclasses.is_dataclass(kind):
        return _dataclass(kind, value, where, current if isinstance(current, kind) else None)
    if origin is Literal:
        if value not in args:
            raise _invalid(where, f"{value!r} is not one of {list(args)}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _invalid(where, f"expected a list, got {value!r}")
        return tuple(_value(args[0], item, f"{where}[{i}]", None) for i, item in enumerate(value))
    if kind in _SCALARS:
        return _scalar(kind, value, where)
    return value


def _scalar(kind: type, value: Any, where: str) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise _invalid(where, f"expected {kind.__name__}, got {value!r}")
    return value


def _invalid(where: str, problem: str) -> ValueError:
    return ValueError(f"{where}: {problem}" if where else problem)
