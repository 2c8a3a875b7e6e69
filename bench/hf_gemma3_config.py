"""Write an HF model folder (config.json + tokenizer, no weights) of the Gemma-3-27B text shape.

usage: python bench/hf_gemma3_config.py OUT_DIR TOKENIZER_DIR [--layers N]

SGLang serves it with `--load-format dummy` (random weights drawn on the GPU, in the config's
bf16); llama-server gets the same shape from `llmb-synth-model --like gemma3-27b --type f16`
with the same tokenizer, so both engines run the identical geometry at 2 bytes per parameter
and count the same prompt tokens. The numbers are Gemma 3 27B's text model (62 layers, 5376
wide, 32 query / 16 KV heads of 128, sliding window 1024 on 5 of 6 layers) with the
vocabulary of llmb-synth-model's shape (262144 rows).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def config(layers: int) -> dict[str, object]:
    """The Gemma3ForCausalLM text config of the 27B shape."""
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "vocab_size": 262144,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_hidden_layers": layers,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "query_pre_attn_scalar": 168,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "layer_types": [
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)
        ],
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "use_cache": True,
    }


def main(argv: list[str] | None = None) -> None:
    """Write config.json and copy the tokenizer files into OUT_DIR."""
    ap = argparse.ArgumentParser(prog="hf_gemma3_config.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="model folder to write")
    ap.add_argument("tokenizer", type=Path, help="HF tokenizer folder to copy in")
    ap.add_argument("--layers", type=int, default=62, help="blocks (62 in Gemma 3 27B)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    for f in a.tokenizer.iterdir():
        if f.is_file():
            shutil.copy(f, a.out / f.name)
    (a.out / "config.json").write_text(json.dumps(config(a.layers), indent=2) + "\n")
    print(f"wrote {a.out}/config.json: Gemma-3-27B text shape, {a.layers} layers")


if __name__ == "__main__":
    main()
