"""pasu.config: YAML mappings laid over frozen dataclasses, strictly."""

from dataclasses import dataclass
from typing import Literal

import pytest

from pasu.config import from_dict, load_yaml


@dataclass(frozen=True)
class Inner:
    a: int = 1
    b: float = 2.0


@dataclass(frozen=True)
class Required:
    path: str
    note: str | None = None


@dataclass(frozen=True)
class Outer:
    inner: Inner = Inner(a=5)  # a field default that differs from the class's own defaults
    optional: Required | None = None
    names: tuple[str, ...] = ()
    mode: Literal["x", "y"] = "x"


def test_values_are_laid_over_the_base():
    outer = from_dict(Outer, {"inner": {"b": 3}, "names": ["p", "q"], "mode": "y"}, "test", Outer())
    assert outer == Outer(inner=Inner(a=5, b=3.0), names=("p", "q"), mode="y")  # a=5: the field's default kept
    assert isinstance(outer.inner.b, float)
    assert from_dict(Outer, {}, "test", Outer()) == Outer()


def test_an_absent_optional_section_is_built_from_its_class():
    assert from_dict(Outer, {"optional": {"path": "p"}}, "test", Outer()).optional == Required(path="p")
    assert from_dict(Outer, {"optional": None}, "test", Outer(optional=Required("p"))).optional is None


@pytest.mark.parametrize("raw, message", [
    ({"inner": {"c": 1}}, r"^test: inner: unknown keys \['c'\]; known: \['a', 'b'\]$"),
    ({"innr": {}}, r"^test: unknown keys \['innr'\]"),
    ({"mode": "z"}, r"^test: mode: 'z' is not one of \['x', 'y'\]$"),
    ({"inner": {"a": "1"}}, r"^test: inner.a: expected int, got '1'$"),
    ({"inner": {"a": True}}, r"^test: inner.a: expected int, got True$"),
    ({"inner": {"b": None}}, r"^test: inner.b: expected float, got None$"),
    ({"inner": 3}, r"^test: inner: expected a mapping, got 3$"),
    ({"names": "pq"}, r"^test: names: expected a list, got 'pq'$"),
    ({"names": ["p", 1]}, r"^test: names\[1\]: expected str, got 1$"),
    ({"optional": {"note": "n"}}, r"^test: optional: .*missing 1 required positional argument: 'path'"),
])
def test_mistakes_fail_naming_the_key(raw, message):
    with pytest.raises(ValueError, match=message):
        from_dict(Outer, raw, "test", Outer())


def test_load_yaml_wants_a_mapping(tmp_path):
    (tmp_path / "empty.yaml").write_text("# nothing set\n")
    assert load_yaml(tmp_path / "empty.yaml") == {}
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ValueError, match="list.yaml: expected a mapping at the top level"):
        load_yaml(tmp_path / "list.yaml")
