"""Run SGLang's `bench_serving` (PyPI `sglang` 0.5.23, installed `--no-deps`) without torch.

`import sglang` runs the package `__init__`, which imports torch and triton through
`sglang.srt.utils.common`, and `sglang.benchmark.serving` imports one string constant
(`FAKE_BOOTSTRAP_HOST`) from the torch-only `sglang.srt.disaggregation.utils`. Neither is
used by an HTTP benchmark, so this shim registers empty package modules (pointing at the real
folders, so every other submodule loads unmodified) and that one constant, then runs the
unmodified `cli_main()`. Run it with the interpreter of the separate virtualenv:

    VENV/bin/python bench/loadgen_sglang_shim.py --backend sglang-oai-chat --base-url ... \
        --tokenizer DIR ...
    VENV/bin/python bench/loadgen_sglang_shim.py --make-tokenizer DIR

`--make-tokenizer` writes a small word-level Hugging Face tokenizer (bench_serving needs one
to build its random prompts; nothing can be downloaded here).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path


def make_tokenizer(folder: Path) -> None:
    """Save a word-level fast tokenizer with 4096 words plus specials to `folder`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for i in range(4096):
        vocab[f"w{i}"] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    # bench_serving applies a chat template for chat backends.
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(str(folder))


def run_bench_serving(argv: list[str]) -> None:
    """Register the shims and run SGLang's unmodified bench_serving CLI."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sglang is not installed in this interpreter")
    root = Path(next(iter(spec.submodule_search_locations)))

    def package(name: str, folder: Path) -> None:
        module = types.ModuleType(name)
        module.__path__ = [str(folder)]
        sys.modules[name] = module

    package("sglang", root)
    package("sglang.srt", root / "srt")
    package("sglang.srt.utils", root / "srt" / "utils")
    package("sglang.srt.disaggregation", root / "srt" / "disaggregation")
    constants = types.ModuleType("sglang.srt.disaggregation.utils")
    constants.FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # type: ignore[attr-defined]
    sys.modules[constants.__name__] = constants
    from sglang.benchmark.serving import cli_main

    sys.argv = ["bench_serving", *argv]
    cli_main()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--make-tokenizer"]:
        make_tokenizer(Path(sys.argv[2]))
    else:
        run_bench_serving(sys.argv[1:])
