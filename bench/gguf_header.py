"""Copy a GGUF file's header (metadata + tensor infos) without its tensor data.

usage: python bench/gguf_header.py MODEL.gguf OUT.gguf

The copy ends at the tensor-data offset: a few MB for a 30 GB model, and everything the exporter
reads (model/gguf_header.py reads the header only), so a GPU run's model can be re-read
in CI.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf


def header_bytes(path: Path) -> int:
    """Offset of the tensor data: the length of the header, alignment padding included."""
    return int(gguf.GGUFReader(path).data_offset)


def main(argv: list[str] | None = None) -> None:
    """Write the first header_bytes(MODEL) bytes of MODEL to OUT."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        raise SystemExit("usage: gguf_header.py MODEL.gguf OUT.gguf")
    src, dst = Path(args[0]), Path(args[1])
    size = header_bytes(src)
    with src.open("rb") as fin:
        dst.write_bytes(fin.read(size))
    print(f"{dst}: {size} header bytes of {src.stat().st_size}")


if __name__ == "__main__":
    main()
