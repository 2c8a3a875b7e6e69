"""Safetensors headers: parameter counts, bytes and tensor infos of an HF checkpoint.

Only the JSON headers are read, never the tensor data.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from model import weights

# Safetensors headers are small JSON; refuse absurd lengths instead of reading a huge file.
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class SafetensorsTotals:
    """What the headers of one checkpoint's safetensors files add up to."""

    params: int
    size: int
    tensors: tuple[weights.TensorInfo, ...]


def safetensors_totals(directory: Path) -> SafetensorsTotals | None:
    """Parameters, bytes and tensor infos of all `*.safetensors` in `directory` (headers only)."""
    params = size = 0
    infos: list[weights.TensorInfo] = []
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    for file in files:
        with file.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) != 8:
                return None
            (length,) = struct.unpack("<Q", raw)
            if length > _MAX_SAFETENSORS_HEADER:
                return None
            header = json.loads(fh.read(length))
        for name, info in header.items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            shape = [int(dim) for dim in info.get("shape", [])]
            params += math.prod(shape)
            start, end = info.get("data_offsets", (0, 0))
            nbytes = int(end) - int(start)
            size += nbytes
            # HF tables are [n_vocab, hidden].
            infos.append(weights.TensorInfo(name, nbytes, shape[0] if len(shape) >= 2 else 1))
    return SafetensorsTotals(params, size, tuple(infos))
