"""A verifier shaped like Kimi-K2.5 on disk, holding only what drafter training reads.

Kimi-K2.5 is a multimodal wrapper (``model_type: kimi_k25``, its own config class loaded with
``trust_remote_code``) around a DeepSeek-V3 text model in ``text_config``; its weights live under
a ``language_model.`` prefix in sharded safetensors with an index. Drafter training needs only
``embed_tokens``, ``lm_head`` and the final norm from it, so this writes a directory with that config layout
(config class included), those two tensors under the real names, split over two shards, and the
index. Sizes are parameters: tiny for tests, Kimi-K2.5's own (hidden 7168, vocab 163840) for the
GPU benchmark.

    python -m tests.support.verifier_stub --out /tmp/kimi-stub --hidden-size 7168 --vocab-size 163840
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

CONFIG_CLASS = '''"""Config of the Kimi-K2.5-shaped verifier stub: a wrapper whose text model is DeepSeek-V3."""

from transformers import DeepseekV3Config, PretrainedConfig


class KimiK25Config(PretrainedConfig):
    model_type = "kimi_k25"
    sub_configs = {"text_config": DeepseekV3Config}

    def __init__(self, text_config=None, vision_config=None, **kwargs):
        if isinstance(text_config, dict):
            text_config = DeepseekV3Config(**text_config)
        self.text_config = text_config or DeepseekV3Config()
        self.vision_config = vision_config or {}
        super().__init__(**kwargs)
'''

EMBED = "language_model.model.embed_tokens.weight"
LM_HEAD = "language_model.lm_head.weight"
NORM = "language_model.model.norm.weight"


def text_config(hidden_size: int, vocab_size: int, layers: int) -> dict[str, object]:
    """DeepSeek-V3's text config at the given size (Kimi-K2.5's values where size does not matter)."""
    return {
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
        "hidden_size": hidden_size,
        "vocab_size": vocab_size,
        "num_hidden_layers": layers,
        "intermediate_size": hidden_size * 18432 // 7168,
        "moe_intermediate_size": hidden_size * 2048 // 7168,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "n_routed_experts": 384,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0,
        "bos_token_id": min(163584, vocab_size - 2),
        "eos_token_id": min(163585, vocab_size - 1),
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
    }


def build(out: Path, hidden_size: int = 7168, vocab_size: int = 163840, layers: int = 61, seed: int = 0) -> Path:
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"},
        "text_config": text_config(hidden_size, vocab_size, layers),
        "vision_config": {"model_type": "moonvit", "hidden_size": 1152},
        "torch_dtype": "bfloat16",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "configuration_kimi_k25.py").write_text(CONFIG_CLASS)
    gen = torch.Generator().manual_seed(seed)
    shards = {
        "model-00001-of-00002.safetensors": {EMBED: torch.randn(vocab_size, hidden_size, generator=gen) * 0.02},
        "model-00002-of-00002.safetensors": {
            LM_HEAD: torch.randn(vocab_size, hidden_size, generator=gen) * 0.02,
            NORM: 1 + torch.randn(hidden_size, generator=gen) * 0.1,
        },
    }
    weight_map = {}
    total = 0
    for name, tensors in shards.items():
        tensors = {k: v.to(torch.bfloat16) for k, v in tensors.items()}
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(tensors, name)
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.verifier_stub", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--hidden-size", type=int, default=7168)
    parser.add_argument("--vocab-size", type=int, default=163840)
    parser.add_argument("--layers", type=int, default=61)
    args = parser.parse_args(argv)
    print(build(args.out, args.hidden_size, args.vocab_size, args.layers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
