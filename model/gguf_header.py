"""The GGUF header: metadata and tensor infos, read from a memory map without the tensor data.

One reader for the format: the model geometry (model.geometry) and
`llmb-synth-model` (tools/synth_model/) both read GGUF files through it.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model import ggml_types

# GGUF scalar value types: type id -> struct format.
_GGUF_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9
# Arrays longer than this (tokenizer vocabularies) are skipped, not decoded.
_GGUF_MAX_KEPT_ARRAY = 65536


@dataclass(frozen=True)
class GGUFField:
    """One GGUF metadata value with its GGUF type ids (`sub_type` for arrays)."""

    value: Any
    vtype: int
    sub_type: int | None = None


class _GGUFHeader:
    """Walks a GGUF header (v2/v3) in a memory map without touching tensor data.

    The `gguf` package's reader builds a numpy view per array item, which takes minutes
    for a 262k-token vocabulary; this walker skips such arrays in well under a second.
    With `keep_arrays` it decodes them too (one `struct` call per numeric array), and with
    `raw_strings` strings stay bytes, so a tokenizer can be copied byte for byte
    (`llmb-synth-model`).
    """

    def __init__(self, buf: Any, endian: str, keep_arrays: bool = False, raw_strings: bool = False):
        self.buf = buf
        self.pos = 0
        self.endian = endian
        self.keep_arrays = keep_arrays
        self.raw_strings = raw_strings

    def scalar(self, fmt: str) -> Any:
        value = struct.unpack_from(self.endian + fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def raw_string(self) -> bytes:
        length = self.scalar("Q")
        if self.pos + length > len(self.buf):
            raise ValueError("string runs past the end of the file")
        raw = bytes(self.buf[self.pos : self.pos + length])
        self.pos += length
        return raw

    def string(self) -> str:
        return self.raw_string().decode("utf-8", "replace")

    def field(self, vtype: int) -> GGUFField:
        if vtype != _GGUF_ARRAY:
            return GGUFField(self.value(vtype), vtype)
        itype, count = self.scalar("I"), self.scalar("Q")
        return GGUFField(self._array(itype, count), vtype, itype)

    def value(self, vtype: int) -> Any:
        if vtype in _GGUF_SCALARS:
            return self.scalar(_GGUF_SCALARS[vtype])
        if vtype == _GGUF_STRING:
            return self.raw_string() if self.raw_strings else self.string()
        if vtype == _GGUF_ARRAY:
            itype, count = self.scalar("I"), self.scalar("Q")
            return self._array(itype, count)
        raise ValueError(f"unknown GGUF value type {vtype}")

    def _array(self, itype: int, count: int) -> Any:
        keep = self.keep_arrays or count <= _GGUF_MAX_KEPT_ARRAY
        if itype in _GGUF_SCALARS:
            size = count * struct.calcsize(_GGUF_SCALARS[itype])
            if self.pos + size > len(self.buf):
                raise ValueError("array runs past the end of the file")
            values = None
            if keep:
                fmt = f"{self.endian}{count}{_GGUF_SCALARS[itype]}"
                values = list(struct.unpack_from(fmt, self.buf, self.pos))
            self.pos += size
            return values
        if itype == _GGUF_STRING and not keep:
            length = struct.Struct(self.endian + "Q").unpack_from
            buf, pos = self.buf, self.pos
            for _ in range(count):
                pos += 8 + length(buf, pos)[0]
            self.pos = pos
            return None
        return [self.value(itype) for _ in range(count)]


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor info of a GGUF header: name, dimensions (ne0 first) and ggml type id."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int

    @property
    def n_elements(self) -> int:
        """Elements of the tensor."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data (ValueError for an unknown ggml type)."""
        return ggml_types.tensor_bytes(self.n_elements, self.ggml_type)


def _walk_gguf(
    path: str | Path, keep_arrays: bool = False, raw_strings: bool = False
) -> tuple[dict[str, GGUFField], list[GGUFTensor]]:
    import mmap

    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        # A big-endian file shows its version byte-swapped when read little-endian.
        version = struct.unpack_from("<I", buf, 4)[0]
        endian = "<" if version < 65536 else ">"
        hdr = _GGUFHeader(buf, endian, keep_arrays, raw_strings)
        hdr.pos = 4
        version = hdr.scalar("I")
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported")
        n_tensors, n_kv = hdr.scalar("Q"), hdr.scalar("Q")
        meta: dict[str, GGUFField] = {}
        for _ in range(n_kv):
            key = hdr.string()
            meta[key] = hdr.field(hdr.scalar("I"))
        tensors = []
        for _ in range(n_tensors):
            name = hdr.string()
            n_dims = hdr.scalar("I")
            if n_dims > 8:  # GGML_MAX_DIMS is 4; a corrupt header, not a tensor
                raise ValueError(f"{path}: tensor {name!r} has {n_dims} dimensions")
            shape = tuple(hdr.scalar("Q") for _ in range(n_dims))
            ggml_type = hdr.scalar("I")
            hdr.pos += 8  # data offset
            tensors.append(GGUFTensor(name, shape, ggml_type))
    return meta, tensors


def read_gguf_header(path: str | Path) -> tuple[dict[str, Any], list[tuple[str, int, int]]]:
    """Metadata and `(name, n_elements, ggml_type)` of every tensor, from the header only.

    Arrays longer than 65536 items (tokenizer vocabularies) are skipped, as `None`.
    """
    meta, tensors = _walk_gguf(path)
    return (
        {key: f.value for key, f in meta.items()},
        [(t.name, t.n_elements, t.ggml_type) for t in tensors],
    )


def read_gguf_tensors(path: str | Path) -> tuple[dict[str, Any], list[GGUFTensor]]:
    """Metadata and the tensor infos (name, shape, type) of a GGUF, from the header only."""
    meta, tensors = _walk_gguf(path)
    return {key: f.value for key, f in meta.items()}, tensors


def read_gguf_fields(path: str | Path) -> dict[str, GGUFField]:
    """Every metadata value of a GGUF with its type, arrays included and strings as bytes.

    For tools that write GGUF metadata back (`llmb-synth-model` copies a tokenizer).
    """
    return _walk_gguf(path, keep_arrays=True, raw_strings=True)[0]
