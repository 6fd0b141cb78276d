"""transformers' PyTorch `deepseek_v4` model loaded with a GGUF's weights: the independent oracle.

Weights are dequantised with `gguf.quants.dequantize` (not our MLX code), and mapped by name:
GGUF dims are the reversed HF dims (docs/model.md §2.2), except that HF stacks each layer's
experts and concatenates gate ‖ up into one `gate_up_proj`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf.quants import dequantize

from ds4agent.modelfile.config import ModelConfig, config_from_gguf
from ds4agent.modelfile.gguf import GGUFFile


def hf_config(c: ModelConfig):
    from transformers import DeepseekV4Config

    kinds = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    return DeepseekV4Config(
        vocab_size=c.n_vocab, hidden_size=c.n_embd, num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head, num_key_value_heads=1, head_dim=c.head_dim,
        partial_rotary_factor=c.n_rot / c.head_dim, q_lora_rank=c.q_lora_rank,
        o_lora_rank=c.o_lora_rank, o_groups=c.n_out_group, sliding_window=c.sliding_window,
        index_n_heads=c.indexer_n_head, index_head_dim=c.indexer_head_dim, index_topk=c.indexer_top_k,
        layer_types=[kinds[r] for r in c.compress_ratios],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        mlp_layer_types=["hash_moe" if c.is_hash_layer(i) else "moe" for i in range(c.n_layer)],
        n_routed_experts=c.n_expert, num_experts_per_tok=c.n_expert_used, moe_intermediate_size=c.expert_ff,
        n_shared_experts=1, scoring_func="sqrtsoftplus", norm_topk_prob=True,
        routed_scaling_factor=c.expert_weights_scale, swiglu_limit=c.swiglu_clamp[0],
        hc_mult=c.hc_count, hc_sinkhorn_iters=c.hc_sinkhorn_iters, hc_eps=c.hc_eps, rms_norm_eps=c.rms_eps,
        rope_theta=c.rope_base, compress_rope_theta=c.compress_rope_base,
        # Without this dict the compressed layers would get plain RoPE instead of YaRN.
        rope_parameters={"rope_type": "yarn", "factor": c.rope_scaling_factor,
                         "original_max_position_embeddings": c.rope_orig_ctx,
                         "beta_fast": c.yarn_beta_fast, "beta_slow": c.yarn_beta_slow},
        max_position_embeddings=1048576, tie_word_embeddings=False, attn_implementation="eager",
    )


_LAYER_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "hc_attn_fn.weight": "attn_hc.fn", "hc_attn_base.weight": "attn_hc.base", "hc_attn_scale.weight": "attn_hc.scale",
    "hc_ffn_fn.weight": "ffn_hc.fn", "hc_ffn_base.weight": "ffn_hc.base", "hc_ffn_scale.weight": "ffn_hc.scale",
    "attn_q_a.weight": "self_attn.q_a_proj.weight", "attn_q_a_norm.weight": "self_attn.q_a_norm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight", "attn_kv.weight": "self_attn.kv_proj.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_norm.weight", "attn_sinks.weight": "self_attn.sinks",
    "attn_output_a.weight": "self_attn.o_a_proj.weight", "attn_output_b.weight": "self_attn.o_b_proj.weight",
    "attn_compressor_ape.weight": "self_attn.compressor.position_bias",
    "attn_compressor_kv.weight": "self_attn.compressor.kv_proj.weight",
    "attn_compressor_gate.weight": "self_attn.compressor.gate_proj.weight",
    "attn_compressor_norm.weight": "self_attn.compressor.kv_norm.weight",
    "indexer_compressor_ape.weight": "self_attn.compressor.indexer.position_bias",
    "indexer_compressor_kv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "indexer_compressor_gate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "indexer_compressor_norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "indexer.attn_q_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "indexer.proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight", "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_tid2eid.weight": "mlp.gate.tid2eid",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
}
_GLOBAL_MAP = {
    "token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight", "output_hc_fn.weight": "model.hc_head.hc_fn",
    "output_hc_base.weight": "model.hc_head.hc_base", "output_hc_scale.weight": "model.hc_head.hc_scale",
}


def _dense(f: GGUFFile, name: str) -> np.ndarray:
    t = f.tensors[name]
    a = f.array(name)
    if t.type in (0, 1, 26):
        return np.array(a, dtype=np.int64 if t.type == 26 else np.float32)
    return dequantize(np.ascontiguousarray(a), t.type).reshape(t.shape).astype(np.float32)


def load_hf(path: str | Path):
    """(torch model in float32 eval mode, our ModelConfig) for a GGUF file."""
    import torch
    from transformers import DeepseekV4ForCausalLM

    with GGUFFile(path) as f:
        c = config_from_gguf(f)
        torch.manual_seed(0)
        model = DeepseekV4ForCausalLM(hf_config(c)).float().eval()
        state = {}
        for name in f.tensors:
            if name in _GLOBAL_MAP:
                state[_GLOBAL_MAP[name]] = _dense(f, name)
                continue
            _, layer, short = name.split(".", 2)
            prefix = f"model.layers.{layer}."
            if short in ("ffn_gate_exps.weight", "ffn_up_exps.weight"):
                continue
            if short == "exp_probs_b.bias" and int(layer) < c.n_hash_layer:
                continue  # unused on hash layers; HF has no slot for it
            state[prefix + _LAYER_MAP[short]] = _dense(f, name)
        for i in range(c.n_layer):
            g = _dense(f, f"blk.{i}.ffn_gate_exps.weight")
            u = _dense(f, f"blk.{i}.ffn_up_exps.weight")
            state[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.concatenate([g, u], axis=1)
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}
    own = model.state_dict()
    missing = set(own) - set(tensors)
    assert not missing, f"oracle tensors not filled: {sorted(missing)[:5]}"
    for k, v in tensors.items():
        assert own[k].shape == v.shape, (k, tuple(own[k].shape), tuple(v.shape))
    model.load_state_dict(tensors, strict=True)
    return model, c
