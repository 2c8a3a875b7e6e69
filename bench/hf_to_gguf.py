"""Convert an HF model folder to GGUF with llama.cpp's own convert_hf_to_gguf.py.

usage: python bench/hf_to_gguf.py LLAMA_CPP_DIR [--pre gpt-2] -- MODEL_DIR --outtype bf16 \
           --outfile X.gguf

llama.cpp's converter refuses a BPE tokenizer whose hash it does not know ("BPE pre-tokenizer
was not recognized"). The SGLang bench tokenizer (a byte-level BPE trained for the tests, GPT-2
pre-tokenizer regex) is such a one, so this wrapper names its pre-tokenizer when llama.cpp
cannot recognize it and leaves every other step of the conversion to llama.cpp. Nothing is
rewritten: the tensors, the config mapping and the vocabulary are llama.cpp's.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    """Run convert_hf_to_gguf.py with a named pre-tokenizer as the fallback."""
    args = sys.argv[1:] if argv is None else argv
    if "--" not in args:
        raise SystemExit("usage: hf_to_gguf.py LLAMA_CPP_DIR --pre NAME -- CONVERTER_ARGS...")
    split = args.index("--")
    ap = argparse.ArgumentParser(prog="hf_to_gguf.py")
    ap.add_argument(
        "llama_cpp", type=Path, help="llama.cpp source folder (holds convert_hf_to_gguf.py)"
    )
    ap.add_argument(
        "--pre", default="gpt-2", help="pre-tokenizer when llama.cpp does not know the hash"
    )
    ns = ap.parse_args(args[:split])
    script = ns.llama_cpp / "convert_hf_to_gguf.py"
    if not script.is_file():
        raise SystemExit(f"hf_to_gguf.py: no convert_hf_to_gguf.py in {ns.llama_cpp}")
    sys.path[:0] = [str(ns.llama_cpp), str(ns.llama_cpp / "gguf-py")]
    from conversion import base  # llama.cpp's conversion package, from the folder above

    original = base.TextModel.get_vocab_base_pre

    def vocab_pre(self: object, tokenizer: object) -> str:
        try:
            return str(original(self, tokenizer))
        except NotImplementedError:
            print(f"hf_to_gguf.py: pre-tokenizer not recognized by llama.cpp; using {ns.pre!r}")
            return str(ns.pre)

    base.TextModel.get_vocab_base_pre = vocab_pre
    sys.argv = [str(script), *args[split + 1 :]]
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
