"""PASU's wire contract (installed as pasu.protos): the .proto files and their generated gRPC code.

The generated modules are not committed; they are built from the .proto by `pasu.protos.build` the first
time they are imported (and again whenever the .proto changes):

    from pasu.protos import slu_pb2, slu_pb2_grpc
"""

from __future__ import annotations

import importlib
from types import ModuleType

# Short name -> module under this package. Importing the `pasu.v1` package regenerates its code if stale.
_GENERATED = {
    "slu_pb2": "pasu.v1.slu_pb2",
    "slu_pb2_grpc": "pasu.v1.slu_pb2_grpc",
}

__all__ = list(_GENERATED)


def __getattr__(name: str) -> ModuleType:
    # Lazy (PEP 562) so that `import pasu.protos` alone never runs protoc.
    if name not in _GENERATED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_GENERATED[name]}")
    globals()[name] = module
    return module
