"""Write a Qwen2-architecture HF model folder with random bf16 safetensors (the same weights
for SGLang and, converted by llama.cpp's own converter, for llama-server).

usage: python bench/hf_qwen2_model.py OUT_DIR TOKENIZER_DIR [--size 0.5b] [--max-position N]
                                    [--config-only]

The tokenizer folder (tokenizer.json, tokenizer_config.json, chat template) is copied in. The
weights are drawn with a fixed seed, so the same command writes the same bytes. Needs torch and
transformers (the GPU machine has both). With --config-only no weights are written (SGLang
draws them with `--load-format dummy`): the 7B shape then costs nothing on disk or in torch.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

# hidden, layers, attention heads, KV heads, FFN: Qwen2-0.5B's geometry (0.39 B with 32k vocab).
SIZES = {
    "tiny": (256, 4, 4, 2, 1024),
    "0.5b": (896, 24, 14, 2, 4864),
    "1.5b": (1536, 28, 12, 2, 8960),
    "7b": (3584, 28, 28, 4, 18944),
}
# Qwen2-7B has its own output head; the small ones share the embedding.
UNTIED = {"7b"}


def main(argv: list[str] | None = None) -> None:
    """Write config.json, model.safetensors and the tokenizer into OUT_DIR."""
    ap = argparse.ArgumentParser(prog="hf_qwen2_model.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="model folder to write")
    ap.add_argument("tokenizer", type=Path, help="HF tokenizer folder to copy in")
    ap.add_argument("--size", default="0.5b", choices=sorted(SIZES), help="geometry")
    ap.add_argument("--vocab", type=int, default=32000, help="vocabulary size (the tokenizer's)")
    ap.add_argument("--max-position", type=int, default=131072, help="trained context")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    ap.add_argument("--config-only", action="store_true", help="write no weights (dummy load)")
    a = ap.parse_args(argv)
    from transformers import Qwen2Config

    hidden, layers, heads, kv_heads, ffn = SIZES[a.size]
    a.out.mkdir(parents=True, exist_ok=True)
    for f in a.tokenizer.iterdir():
        if f.is_file():
            shutil.copy(f, a.out / f.name)
    cfg = Qwen2Config(
        vocab_size=a.vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=ffn,
        max_position_embeddings=a.max_position,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=a.size not in UNTIED,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=0,
        hidden_act="silu",
    )
    cfg.architectures = ["Qwen2ForCausalLM"]
    if a.config_only:
        cfg.save_pretrained(a.out)
        # bf16, as the weights written below; both keys, for transformers 4 and 5.
        path = a.out / "config.json"
        data = json.loads(path.read_text())
        data.update(torch_dtype="bfloat16", dtype="bfloat16")
        path.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {a.out}: config only ({a.size}), max position {a.max_position}")
        return
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(a.seed)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(a.out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {a.out}: {params} parameters, bf16, max position {a.max_position}")


if __name__ == "__main__":
    main()
