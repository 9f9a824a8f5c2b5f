"""Build a tiny Kimi-K2.5: Kimi-K2.5's own architecture at a size that runs on two CPU cores.

The target this project exists for is ``KimiK25ForConditionalGeneration``: a multimodal wrapper
(``model_type: kimi_k25``) whose ``text_config`` is a DeepSeek-V3 model (``model_type: kimi_k2``,
which transformers and vLLM read as ``deepseek_v3``) with MLA attention and MoE layers, weights
under ``language_model.`` in sharded safetensors with an index, and a MoonViT vision tower. This
writes the same structure, random-init and small:

* ``config.json`` with the published field names (Kimi-K2.5's config.json): MLA (``q_lora_rank``,
  ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``), MoE
  (``n_routed_experts``, ``num_experts_per_tok``, ``n_shared_experts``, ``first_k_dense_replace``,
  ``moe_layer_freq``, ``topk_method: noaux_tc``, ``scoring_func: sigmoid``, ``n_group``,
  ``topk_group``, ``routed_scaling_factor``, ``norm_topk_prob``), and the published vision config.
  The MLA sizes are Kimi-K2.5's own (``kv_lora_rank`` 512, rope 64, nope 128, v 128): vLLM's CPU
  MLA decode kernel only exists for that latent size (576). Hidden size, heads, experts and layers
  are small.
* The text model's weights (``language_model.model.layers.N...``, per-expert
  ``mlp.experts.E.gate_proj`` ... as the published checkpoint names them, the router's
  ``e_score_correction_bias``), in two shards and ``model.safetensors.index.json``. No vision
  weights: the pipeline serves the target text-only (vLLM's ``--language-model-only``), which
  builds no vision tower.
* A BPE tokenizer with Kimi's chat tokens (``<|im_user|>``, ``<|im_assistant|>``,
  ``<|im_middle|>``, ``<|im_end|>``, ``<think>``, ``</think>``, media and tool-call tokens) and a
  Kimi-style chat template whose assistant turn opens with ``<think>``, so vLLM's ``kimi_k2``
  reasoning parser splits reasoning from the answer.

    python -m tests.support.tiny_kimi --out /srv/models/tiny-kimi
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from tests.support.tiny_model import LOGIT_SCALE, build_tokenizer

LOG = logging.getLogger("tests.support.tiny_kimi")

# Kimi-K2.5's special tokens (tokenizer_config.json of moonshotai/Kimi-K2.5), beginning the vocab.
SPECIAL_TOKENS = [
    "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
    "<think>", "</think>", "<|media_begin|>", "<|media_content|>", "<|media_end|>", "<|media_pad|>",
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|kimi_k25_video_placeholder|>", "[PAD]",
]  # fmt: skip
TOKEN_ID = {token: i for i, token in enumerate(SPECIAL_TOKENS)}

# Kimi's turn format: <|im_ROLE|>ROLE<|im_middle|>CONTENT<|im_end|>; an assistant turn holds its
# reasoning in <think>...</think> before the answer, and the generation prompt opens <think>.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- set role = message['role'] if message['role'] in ['system', 'user'] else 'assistant' -%}"
    "{{ '<|im_' + role + '|>' + role + '<|im_middle|>' }}"
    "{%- if role == 'assistant' -%}"
    "{{ '<think>' + (message.get('reasoning_content') or '') + '</think>' }}"
    "{%- endif -%}"
    "{{ message['content'] + '<|im_end|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_assistant|>assistant<|im_middle|><think>' }}{%- endif -%}"
)

# The published vision config of Kimi-K2.5 (MoonViT); no vision weights are written.
VISION_CONFIG = {
    "patch_size": 14, "init_pos_emb_height": 64, "init_pos_emb_width": 64, "init_pos_emb_time": 4,
    "pos_emb_type": "divided_fixed", "vt_num_attention_heads": 16, "vt_num_hidden_layers": 27,
    "vt_hidden_size": 1152, "vt_intermediate_size": 4304, "merge_kernel_size": [2, 2],
    "video_attn_type": "spatial_temporal", "merge_type": "sd2_tpool", "mm_projector_type": "patchmerger",
    "mm_hidden_size": 1152, "projector_hidden_act": "gelu", "projector_ln_eps": 1e-05,
}  # fmt: skip

# Kimi-K2.5's preprocessor_config.json (its media_proc_cfg): vLLM builds the image processor from
# it even for a text-only server. The published file's auto_map names remote code; vLLM's own
# processor (KimiK25FusedVisionProcessor) reads only media_proc_cfg.
MEDIA_PROC_CFG = {
    "in_patch_limit": 16384, "patch_size": 14, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "merge_kernel_size": 2, "fixed_output_tokens": None, "patch_limit_on_one_side": 512,
    "in_patch_limit_each_frame": 4096, "in_patch_limit_video": None, "sample_fps": 2.0,
    "max_num_frames_each_video": None, "temporal_merge_kernel_size": 4, "timestamp_mode": "hh:mm:ss.fff",
}  # fmt: skip


def text_config(vocab_size: int, layers: int, experts: int) -> dict[str, Any]:
    """The DeepSeek-V3 text config, with Kimi-K2.5's field names and MLA sizes."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "vocab_size": vocab_size,
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        # MLA: Kimi-K2.5's own latent sizes (q_lora_rank is 1536 there).
        "q_lora_rank": 64,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        # MoE: the first layer dense, the others routed + one shared expert, as in Kimi-K2.5.
        "n_routed_experts": experts,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 2.827,
        "norm_topk_prob": True,
        "num_nextn_predict_layers": 0,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-05,
        "rope_theta": 50000.0,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": TOKEN_ID["[BOS]"],
        "eos_token_id": TOKEN_ID["[EOS]"],
        "pad_token_id": TOKEN_ID["[PAD]"],
        "torch_dtype": "bfloat16",
    }


def config(vocab_size: int, layers: int, experts: int) -> dict[str, Any]:
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text_config(vocab_size, layers, experts),
        "vision_config": VISION_CONFIG,
        "media_placeholder_token_id": TOKEN_ID["<|media_pad|>"],
        "image_token_id": TOKEN_ID["<|media_pad|>"],
        "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "bos_token_id": TOKEN_ID["[BOS]"],
        "eos_token_id": TOKEN_ID["[EOS]"],
        "pad_token_id": TOKEN_ID["[PAD]"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def text_weights(text: dict[str, Any], seed: int) -> dict[str, Any]:
    """Random-init DeepSeek-V3 weights (transformers' own init), named as Kimi-K2.5's checkpoint
    names them: ``language_model.`` first, and one tensor per expert and projection (transformers
    keeps experts fused in memory)."""
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    fields = {k: v for k, v in text.items() if k not in ("architectures", "model_type", "torch_dtype")}
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**fields))
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
    inter = text["moe_intermediate_size"]
    out: dict[str, Any] = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.to(torch.bfloat16).contiguous()
        prefix = "language_model." + name
        if name.endswith("mlp.experts.gate_up_proj"):  # (experts, 2 * inter, hidden)
            base = prefix.removesuffix("gate_up_proj")
            for e in range(tensor.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = tensor[e, :inter].clone()
                out[f"{base}{e}.up_proj.weight"] = tensor[e, inter:].clone()
        elif name.endswith("mlp.experts.down_proj"):  # (experts, hidden, inter)
            base = prefix.removesuffix("down_proj")
            for e in range(tensor.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = tensor[e].clone()
        else:
            out[prefix] = tensor
    return out


def load_text_model(model_dir: Path, dtype: Any = None) -> Any:
    """The text model of a Kimi-K2.5 checkpoint directory as transformers' DeepseekV3ForCausalLM,
    read from its shards (``language_model.`` stripped, per-expert tensors fused as transformers
    holds them): an independent reference for what vLLM computes from the same files."""
    import torch
    from safetensors.torch import load_file
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = json.loads((model_dir / "config.json").read_text())["text_config"]
    fields = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")}
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    tensors: dict[str, Any] = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors |= load_file(str(model_dir / shard))
    state: dict[str, Any] = {}
    experts: dict[str, dict[int, dict[str, Any]]] = {}
    for name, tensor in tensors.items():
        name = name.removeprefix("language_model.")
        head, sep, tail = name.partition(".mlp.experts.")
        if sep:
            e, proj, _ = tail.split(".")
            experts.setdefault(head, {}).setdefault(int(e), {})[proj] = tensor
        else:
            state[name] = tensor
    for head, per_expert in experts.items():
        order = [per_expert[e] for e in sorted(per_expert)]
        state[f"{head}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([x["gate_proj"], x["up_proj"]]) for x in order]
        )
        state[f"{head}.mlp.experts.down_proj"] = torch.stack([x["down_proj"] for x in order])
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**fields))
    model.load_state_dict(state, strict=True)
    return model.to(dtype or torch.float32).eval()


def save_sharded(weights: dict[str, Any], out: Path, shards: int = 2) -> None:
    """Safetensors shards and the index naming every tensor's shard, as published checkpoints are."""
    from safetensors.torch import save_file

    names = sorted(weights)
    per_shard = -(-len(names) // shards)
    weight_map, total = {}, 0
    for i in range(shards):
        part = names[i * per_shard : (i + 1) * per_shard]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: weights[n] for n in part}, str(out / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(part, file)
        total += sum(weights[n].numel() * weights[n].element_size() for n in part)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def build(out: Path, vocab_size: int = 2048, layers: int = 4, experts: int = 8, seed: int = 0) -> Path:
    """Write the tiny Kimi-K2.5 into ``out`` (skipped when a complete one is already there)."""
    marker = out / ".tiny-kimi.json"
    recipe = {"vocab_size": vocab_size, "layers": layers, "experts": experts, "seed": seed, "version": 2}
    if marker.exists() and json.loads(marker.read_text()) == recipe:
        LOG.info("tiny Kimi-K2.5 already at %s", out)
        return out
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(
        out, vocab_size, seed, special_tokens=SPECIAL_TOKENS, chat_template=CHAT_TEMPLATE,
        bos="[BOS]", eos="<|im_end|>", pad="[PAD]",
    )  # fmt: skip
    cfg = config(vocab_size, layers, experts)
    save_sharded(text_weights(cfg["text_config"], seed), out)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "preprocessor_config.json").write_text(json.dumps({"media_proc_cfg": MEDIA_PROC_CFG}, indent=2) + "\n")
    # Kimi ends an assistant turn with <|im_end|>.
    generation = {
        "bos_token_id": TOKEN_ID["[BOS]"],
        "eos_token_id": TOKEN_ID["<|im_end|>"],
        "pad_token_id": TOKEN_ID["[PAD]"],
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    marker.write_text(json.dumps(recipe) + "\n")
    for path in out.iterdir():
        path.chmod(0o644)  # save_pretrained writes 0600; the server runs as another user
    LOG.info("tiny Kimi-K2.5 written to %s", out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory to write the model into")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (the first is dense, the rest MoE)")
    parser.add_argument("--experts", type=int, default=8, help="routed experts per MoE layer")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    build(args.out, args.vocab_size, args.layers, args.experts, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
