"""The `llmb-synth-model` command: options, the dry-run description, writing with progress."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from gguf.constants import Keys
from tqdm import tqdm

from exporter import versioned_parser
from tools.synth_model.gguf_file import file_bytes, save_tokenizer, write_model
from tools.synth_model.metadata import read_metadata, read_tokenizer, synthetic_tokenizer
from tools.synth_model.plan import Model, build_model, weight_split, weights_step_bytes
from tools.synth_model.shapes import EXPERT_TYPES, SPECS, WEIGHT_TYPES, SynthError


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.2f} GiB"


def describe(model: Model, total: int) -> str:
    """Tensor list and totals, as `--dry-run` prints them."""
    lines = [f"{'tensor':<32} {'type':<5} {'shape (ne0, ne1, ...)':<20} bytes"]
    for t in model.tensors:
        lines.append(f"{t.name:<32} {t.qtype.name:<5} {t.ne!s:<20} {t.nbytes}")
    s = model.spec
    lines += [
        f"architecture: {s.arch} ({model.like}), {s.n_layer} layers, n_embd {s.n_embd}, "
        f"{s.n_head} heads / {s.n_head_kv} KV heads x {s.head_dim}, FFN {s.n_ff}, "
        f"vocab {s.n_vocab}, sliding window {s.sliding_window or 'none'}",
        f"tensors: {len(model.tensors)}",
        f"n_params: {model.n_params}",
        f"tensor data bytes: {model.data_bytes} ({_human(model.data_bytes)})",
        f"file bytes: {total} ({_human(total)})",
    ]
    return "\n".join(lines + _describe_reads(model))


def _describe_reads(model: Model) -> list[str]:
    split, s = weight_split(model), model.spec
    lines = []
    if s.is_moe:
        lines.append(
            f"experts: {s.n_expert}, {s.n_expert_used} used per token, FFN {s.n_ff_exp} each, "
            f"{s.expert_type}"
        )
    lines += [
        f"routed expert bytes: {split.routed_expert_bytes} ({_human(split.routed_expert_bytes)})",
        f"always-read bytes: {split.always_read_bytes} ({_human(split.always_read_bytes)})",
        f"token embedding row bytes: {split.token_embedding_row_bytes}",
    ]
    for batch in (1, 4, 16):
        active = round(weights_step_bytes(model, batch))
        label = (
            "active bytes per token" if batch == 1 else f"weight bytes per step at batch {batch}"
        )
        lines.append(f"{label}: {active} ({_human(active)})")
    return lines


def _source_arch(path: Path) -> str:
    arch = read_metadata(path).get(Keys.General.ARCHITECTURE)
    return bytes(arch.value).decode() if arch is not None else "llama"


def _parser() -> argparse.ArgumentParser:
    p = versioned_parser(
        "llmb-synth-model",
        "Write a GGUF with the exact tensor shapes of a real model and random weights "
        "(nonsense text; the real model's compute, bandwidth and memory).",
    )
    p.add_argument("--like", choices=list(SPECS), help="architecture to copy")
    p.add_argument("--type", dest="wtype", default="q4_0", choices=list(WEIGHT_TYPES))
    p.add_argument(
        "--expert-type",
        choices=list(EXPERT_TYPES),
        help="weight type of the routed experts of an MoE shape (default: the shape's own, "
        "mxfp4 for gpt-oss, else --type)",
    )
    p.add_argument(
        "--tokenizer-from",
        type=Path,
        help="GGUF of the same family whose tokenizer.* metadata to copy (e.g. Gemma 3 270M)",
    )
    p.add_argument("--out", type=Path, help="GGUF file to write")
    p.add_argument("--layers", type=int, help="number of blocks (shrink the depth for tests)")
    p.add_argument("--ctx-train", type=int, help="override the training context length")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same bytes)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument(
        "--dry-run", action="store_true", help="print tensors, bytes and n_params; write nothing"
    )
    tokenizer_only = "write only the tokenizer of --tokenizer-from to --out (small enough to carry)"
    p.add_argument("--save-tokenizer", action="store_true", help=tokenizer_only)
    return p


def _check_out(parser: argparse.ArgumentParser, out: Path | None, force: bool) -> Path:
    if out is None:
        parser.error("--out is required (or use --dry-run)")
    if out.exists() and not force:
        parser.error(f"{out} exists; pass --force to overwrite it")
    if not out.parent.is_dir():
        parser.error(f"folder {out.parent} does not exist")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `llmb-synth-model`; exit 2 on a bad request."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.tokenizer_from is not None and not args.tokenizer_from.is_file():
        parser.error(f"--tokenizer-from {args.tokenizer_from}: no such file")
    if args.save_tokenizer:
        if args.tokenizer_from is None:
            parser.error("--save-tokenizer needs --tokenizer-from")
        out = _check_out(parser, args.out, args.force)
        try:
            source = read_tokenizer(args.tokenizer_from)
        except SynthError as exc:
            parser.error(str(exc))
        size = save_tokenizer(source, _source_arch(args.tokenizer_from), out)
        print(f"wrote {out}: tokenizer only, {len(source)} keys, {size} bytes")
        return 0
    if args.like is None:
        parser.error("--like is required")
    if not args.dry_run:
        _check_out(parser, args.out, args.force)
    try:
        if args.tokenizer_from is not None:
            tok = read_tokenizer(args.tokenizer_from)
            tok_note = f"tokenizer: from {args.tokenizer_from}"
        else:
            tok = synthetic_tokenizer(SPECS[args.like].n_vocab)
            tok_note = "tokenizer: synthetic (no --tokenizer-from; prompt token counts will differ)"
        model = build_model(
            args.like, args.wtype, tok, args.layers, args.ctx_train, args.expert_type
        )
        total = file_bytes(model)
        if args.dry_run:
            print(describe(model, total))
            print(tok_note)
            return 0
        print(tok_note, file=sys.stderr)
        free = shutil.disk_usage(args.out.parent).free
        if free < total:
            raise SynthError(
                f"{args.out.parent} has {_human(free)} free, the model needs {_human(total)}"
            )
    except SynthError as exc:
        parser.error(str(exc))
    # Write beside the target and rename at the end: an interrupted run leaves no half model
    # that llama-server would later fail to load with a confusing error.
    partial = args.out.with_name(args.out.name + ".partial")
    bar = tqdm(
        total=model.data_bytes,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not sys.stderr.isatty(),
    )
    try:
        with bar:
            size = write_model(model, partial, args.seed, bar.update)
        os.replace(partial, args.out)
    finally:
        partial.unlink(missing_ok=True)
    print(
        f"wrote {args.out}: {size} bytes, {len(model.tensors)} tensors, n_params {model.n_params}"
    )
    return 0
