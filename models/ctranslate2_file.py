"""Read and write CTranslate2's `model.bin`: named tensors, so Whisper's weights can be trained in PyTorch.

The format is the one `ctranslate2.specs.ModelSpec._serialize` writes (binary version 6): a header (version,
spec name, revision), then each variable as (name, rank, shape, dtype id, byte count, bytes), then aliases
(name -> variable name; Whisper's output projection is an alias of its token embedding). Reading and writing
are exact inverses, so a file whose variables are untouched is rewritten byte for byte.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BINARY_VERSION = 6  # the only version read and written: CTranslate2 4.x
# dtype ids in the order of CTranslate2's DataType enum (include/ctranslate2/types.h)
DTYPES = (np.float32, np.int8, np.int16, np.int32, np.float16)


@dataclass
class ModelFile:
    """The contents of a model.bin: the spec's name and revision, variables in file order, aliases."""

    spec: str
    revision: int
    variables: dict[str, np.ndarray] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)


def read_model_file(path: str | os.PathLike) -> ModelFile:
    data = Path(path).read_bytes()
    reader = _Reader(data)
    version = reader.unpack("I")
    if version != BINARY_VERSION:
        raise ValueError(f"{path}: CTranslate2 binary version {version}, only {BINARY_VERSION} is read")
    model = ModelFile(spec=reader.string(), revision=reader.unpack("I"))
    for _ in range(reader.unpack("I")):
        name = reader.string()
        shape = tuple(reader.unpack("I") for _ in range(reader.unpack("B")))
        dtype_id = reader.unpack("B")
        if dtype_id >= len(DTYPES):
            raise ValueError(f"{path}: {name} has dtype id {dtype_id}, which is not read (bfloat16?)")
        size = reader.unpack("I")
        model.variables[name] = np.frombuffer(reader.take(size), dtype=DTYPES[dtype_id]).reshape(shape)
    for _ in range(reader.unpack("I")):
        alias = reader.string()
        model.aliases[alias] = reader.string()
    if reader.offset != len(data):
        raise ValueError(f"{path}: {len(data) - reader.offset} bytes after the last alias")
    return model


def write_model_file(model: ModelFile, path: str | os.PathLike) -> None:
    parts = [struct.pack("I", BINARY_VERSION), _string(model.spec), struct.pack("I", model.revision),
             struct.pack("I", len(model.variables))]
    for name, value in model.variables.items():
        dtype_id = DTYPES.index(value.dtype.type)
        parts += [_string(name), struct.pack("B", value.ndim), *(struct.pack("I", d) for d in value.shape),
                  struct.pack("B", dtype_id), struct.pack("I", value.nbytes), np.ascontiguousarray(value).tobytes()]
    parts.append(struct.pack("I", len(model.aliases)))
    for alias, name in model.aliases.items():
        parts += [_string(alias), _string(name)]
    Path(path).write_bytes(b"".join(parts))


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("H", len(raw) + 1) + raw + b"\0"


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.offset = 0

    def take(self, size: int) -> bytes:
        if self.offset + size > len(self.data):
            raise ValueError("model.bin ends in the middle of a record: the file is truncated")
        chunk = self.data[self.offset : self.offset + size]
        self.offset += size
        return chunk

    def unpack(self, fmt: str) -> int:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.unpack("H"))[:-1].decode("utf-8")
