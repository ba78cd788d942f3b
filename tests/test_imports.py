"""Every `from pasu... import name` in the project resolves, the lazy ones inside functions included.

Commands import their heavy modules inside the function that needs them, so a renamed function can break a path
no other test happens to run (a benchmark's option, a script in scripts/). This reads every import statement of
the package and the scripts and checks that the module exists and holds each name.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pasu", "device", "cloud", "models", "scripts")


def project_imports() -> dict[tuple[str, str], list[str]]:
    """(module, name) -> the files:lines importing it, for every `from pasu.x import name` below SOURCES."""
    found: dict[tuple[str, str], list[str]] = {}
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("pasu"):
                    for alias in node.names:
                        where = f"{path.relative_to(ROOT)}:{node.lineno}"
                        found.setdefault((node.module, alias.name), []).append(where)
    return found


IMPORTS = project_imports()


def test_the_reader_finds_the_lazy_imports():
    assert len(IMPORTS) > 200
    assert ("pasu.device.offramp_train", "model_policy") in IMPORTS  # inside a function of device/cli.py


def holds(module, name: str) -> bool:
    """Whether `from module import name` works: an attribute, or a submodule of a package."""
    if hasattr(module, name):
        return True
    try:
        return importlib.util.find_spec(f"{module.__name__}.{name}") is not None
    except ModuleNotFoundError:  # `module` is no package
        return False


@pytest.mark.parametrize("module", sorted({module for module, _ in IMPORTS}))
def test_each_imported_name_exists(module):
    loaded = importlib.import_module(module)
    missing = {name: IMPORTS[(module, name)] for m, name in IMPORTS
               if m == module and name != "*" and not holds(loaded, name)}
    assert not missing, f"{module} has none of: {missing}"
