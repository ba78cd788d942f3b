"""The wire contract's generated code: built from scratch on first import, rebuilt when stale, relocatable."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pasu.protos import build

PROTO = "pasu/v1/slu.proto"
PROTOS_DIR = Path(build.__file__).resolve().parent


def _copy_sources(dest: Path) -> Path:
    """The protos package's sources only (no generated code) as a package named `dest.name`."""
    for source in [PROTOS_DIR / "__init__.py", PROTOS_DIR / "build.py", *PROTOS_DIR.glob("pasu/**/*.proto"),
                   *PROTOS_DIR.glob("pasu/**/__init__.py")]:
        target = dest / source.relative_to(PROTOS_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return dest


def test_first_import_generates_from_scratch(tmp_path):
    package = _copy_sources(tmp_path / "protocopy")
    assert not list(package.rglob("*_pb2*.py"))
    script = textwrap.dedent("""
        import sys
        from protocopy import slu_pb2, slu_pb2_grpc
        # protoc ran in a process of its own: in-process, it corrupted the heap of a process with torch loaded
        assert "grpc_tools._protoc_compiler" not in sys.modules
        assert slu_pb2_grpc.pasu_dot_v1_dot_slu__pb2 is slu_pb2  # the fixed import resolved in-package
        request = slu_pb2.UnderstandRequest(audio=slu_pb2.Audio(encoding=slu_pb2.LINEAR16, sample_rate=16000))
        assert slu_pb2.UnderstandRequest.FromString(request.SerializeToString()) == request
        assert hasattr(slu_pb2_grpc, "SpeechUnderstandingStub")
        print(slu_pb2.DESCRIPTOR.services_by_name["SpeechUnderstanding"].full_name, slu_pb2.__name__)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["pasu.v1.SpeechUnderstanding", "protocopy.pasu.v1.slu_pb2"]
    generated = sorted(p.name for p in (package / "pasu" / "v1").glob("*_pb2*.py"))
    assert generated == ["slu_pb2.py", "slu_pb2_grpc.py"]
    grpc_code = (package / "pasu" / "v1" / "slu_pb2_grpc.py").read_text()
    assert "from . import slu_pb2 as" in grpc_code and "from pasu.v1 import" not in grpc_code
    assert not list((package / "pasu" / "v1").glob(".protoc-*"))  # scratch folder cleaned up


def test_a_broken_proto_fails_with_protocs_message(tmp_path):
    root = _copy_sources(tmp_path / "p")
    (root / PROTO).write_text((root / PROTO).read_text() + "\nmessage Broken { int32 }\n")
    with pytest.raises(RuntimeError, match=r"protoc failed for .*slu\.proto: .*slu\.proto:\d+:\d+"):
        build.generate(PROTO, root)
    assert not list((root / "pasu" / "v1").glob("*_pb2*.py"))


def test_staleness_by_mtime_and_by_content(tmp_path):
    root = _copy_sources(tmp_path / "p")
    proto = root / PROTO
    assert build.is_stale(PROTO, root)  # nothing generated yet
    build.generate(PROTO, root)
    assert not build.is_stale(PROTO, root)

    later = max(p.stat().st_mtime for p in build.generated_paths(PROTO, root)) + 100
    os.utime(proto, (later, later))  # .proto edited after generation
    assert build.is_stale(PROTO, root)
    build.generate(PROTO, root)
    assert not build.is_stale(PROTO, root)

    proto.write_text(proto.read_text() + "\n// a comment changes the content, not the contract\n")
    for path in build.generated_paths(PROTO, root):  # generated files look newer (e.g. after a checkout)
        os.utime(path, (later + 100, later + 100))
    assert build.is_stale(PROTO, root)  # the stamp catches what mtime misses


def test_read_only_package_generates_into_a_cache(tmp_path, monkeypatch):
    root = _copy_sources(tmp_path / "p")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(build.os, "access", lambda path, mode: False)  # root ignores chmod: pretend instead
    folder = build.ensure_generated(PROTO, root)
    assert folder.is_relative_to(tmp_path / "cache") and (folder / "slu_pb2.py").exists()
    assert not list((root / "pasu" / "v1").glob("*_pb2*.py"))
    assert build.ensure_generated(PROTO, root) == folder  # reused, not regenerated


def test_installed_package_code_is_current():
    from pasu.protos import slu_pb2

    assert not build.is_stale(PROTO)
    assert Path(slu_pb2.__file__).parent == PROTOS_DIR / "pasu" / "v1"


@pytest.mark.parametrize("line, expected", [
    ("from pasu.v1 import slu_pb2 as x\n", "from . import slu_pb2 as x\n"),
    ("from google.protobuf import descriptor as d\n", "from google.protobuf import descriptor as d\n"),
])
def test_import_rewriting(line, expected):
    assert build._fix_imports(line, "pasu.v1", "pasu.protos") == expected
