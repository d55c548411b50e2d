"""LLaDA2.x's decoder (BailingMoeV2 / Ling 2.0 with a diffusion head), written here in torch on transformers'
public building blocks (``PreTrainedModel``, ``PretrainedConfig``, ``ACT2FN``, ``GradientCheckpointingLayer``,
its SDPA attention function ``ALL_ATTENTION_FUNCTIONS["sdpa"]``, the ``Cache`` API); issue 52 item 1.

Why our own module: transformers 5.25 ships no BailingMoeV2 class. Its ``bailing_hybrid`` (Ling 2.5) has
the same router (sigmoid scores, grouped top-k over ``n_group`` / ``topk_group``, an expert-score bias,
``routed_scaling_factor``, a shared expert) but not the attention (multi-head latent attention with an
output gate, or linear attention, where BailingMoeV2 has one fused grouped-query ``query_key_value``
projection with QK-norm and partial RoPE), stores its experts fused (``gate_up_proj [E, 2I, H]``) and
names the bias ``e_score_correction_bias``; so it cannot run a LLaDA2 checkpoint (docs/models.md).

The forward follows the family's own ``modeling_llada2_moe.py`` (inclusionAI/LLaDA2.0-mini on the Hub; read
in the copy ZHZisZZ/dllm ``dllm/pipelines/llada2/models/``, commit ca17675), tested against it on a tiny
checkpoint (``benchmarks/references/llada2_reference.py``, ``tests/test_llada2.py``):

* pre-norm decoder layers (RMSNorm with float32 statistics); attention: ``query_key_value`` → heads
  ``[Hq | Hkv | Hkv]`` of ``head_dim``, RMSNorm of each query and key head (``use_qk_norm``), rotate-half
  RoPE on the first ``head_dim · partial_rotary_factor`` dims of each head (θ ``rope_theta``), scaled
  dot-product attention under the caller's additive 4-D mask (no mask: every token attends every token),
  output ``dense`` (bias ``use_bias``);
* MLP: SiLU-gated; layers ``< first_k_dense_replace`` dense (``intermediate_size``), the others MoE: router
  logits ``x·Wᵀ`` in float32, scores ``σ(logits)``; experts chosen on ``σ + expert_bias`` by grouped top-k
  (per group the sum of its two best, the ``topk_group`` best groups kept, then the top
  ``num_experts_per_tok``); weights the chosen *unbiased* scores normalised to sum 1 (when more than one
  is chosen) times ``routed_scaling_factor``; the weighted sum in float32, plus the shared expert
  (``moe_intermediate_size · num_shared_experts``);
* ``expert_bias`` is a buffer, as in the family's code: the auxiliary-free balancing bias stays as the
  checkpoint has it and no optimiser sees it.

Tensor names are the checkpoint's (``model.word_embeddings``, ``model.layers.{l}.attention.query_key_value``,
``...mlp.experts.{e}.gate_proj``, ``...mlp.gate.expert_bias``, ``lm_head``), so a checkpoint loads as is.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


class LLaDA2MoeConfig(PretrainedConfig):
    """The ``llada2_moe`` config with the family's own defaults (``configuration_llada2_moe.py``: QK-norm on,
    attention output bias on, partial rotary 0.5, no shared expert, no dense layer) where a key is absent."""

    model_type = "llada2_moe"

    def __init__(self, vocab_size=30592, hidden_size=1024, intermediate_size=None, num_hidden_layers=24,
                 num_attention_heads=16, num_key_value_heads=0, hidden_act="silu", use_qkv_bias=False,
                 use_qk_norm=True, use_bias=True, rms_norm_eps=1e-05, tie_word_embeddings=False,
                 max_position_embeddings=16384, rope_theta=10000.0, pad_token_id=126081, num_experts=16,
                 num_shared_experts=0, num_experts_per_tok=2, n_group=8, topk_group=4, routed_scaling_factor=2.5,
                 moe_intermediate_size=None, first_k_dense_replace=0, head_dim=None, partial_rotary_factor=0.5,
                 **kwargs):
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_hidden_layers, self.num_attention_heads = num_hidden_layers, num_attention_heads
        self.num_key_value_heads, self.hidden_act = num_key_value_heads, hidden_act
        self.use_qkv_bias, self.use_qk_norm, self.use_bias = use_qkv_bias, use_qk_norm, use_bias
        self.rms_norm_eps, self.max_position_embeddings, self.rope_theta = rms_norm_eps, max_position_embeddings, rope_theta
        self.num_experts, self.num_shared_experts, self.num_experts_per_tok = num_experts, num_shared_experts, num_experts_per_tok
        self.n_group, self.topk_group, self.routed_scaling_factor = n_group, topk_group, routed_scaling_factor
        self.moe_intermediate_size, self.first_k_dense_replace = moe_intermediate_size, first_k_dense_replace
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.partial_rotary_factor = partial_rotary_factor
        super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)


class RMSNorm(nn.Module):
    """``w · (x / sqrt(mean(x²) + eps))`` with float32 statistics, cast back before the weight (the family's)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(size)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first ``cos.shape[-1]`` dims of ``x [N, H, T, D]`` (``cos``/``sin`` ``[N, 1, T, R]``)."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half = torch.cat([-rot[..., r // 2:], rot[..., : r // 2]], dim=-1)
    return torch.cat([rot * cos + half * sin, rest], dim=-1)


class GatedMLP(nn.Module):
    """``down(act(gate(x)) · up(x))``: a dense layer's MLP, each expert and the shared expert."""

    def __init__(self, config: LLaDA2MoeConfig, inner: int) -> None:
        super().__init__()
        h = config.hidden_size
        self.gate_proj, self.up_proj = nn.Linear(h, inner, bias=False), nn.Linear(h, inner, bias=False)
        self.down_proj, self.act = nn.Linear(inner, h, bias=False), ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """Sigmoid router with grouped top-k and the expert-score bias (module docstring)."""

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__()
        self.top_k, self.n_group, self.topk_group = config.num_experts_per_tok, config.n_group, config.topk_group
        self.scale = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(config.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [M, H]`` → ``(experts [M, k] long, weights [M, k] float32)``."""
        scores = torch.sigmoid(F.linear(x.float(), self.weight.float()))  # [M, E]
        biased = scores + self.expert_bias
        groups = biased.view(x.shape[0], self.n_group, -1)
        best = groups.topk(2, dim=-1).values.sum(-1).topk(self.topk_group, dim=-1).indices  # [M, topk_group]
        keep = torch.zeros_like(groups[..., 0], dtype=torch.bool).scatter_(1, best, True)  # [M, n_group]
        biased = biased.masked_fill(~keep[..., None].expand_as(groups).reshape_as(biased), float("-inf"))
        experts = biased.topk(self.top_k, dim=-1).indices
        w = scores.gather(1, experts)
        if self.top_k > 1:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return experts, w * self.scale


class SparseMoE(nn.Module):
    """Routed experts (float32 weighted sum over the chosen ones) plus the shared expert."""

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__()
        self.gate = Router(config)
        self.experts = nn.ModuleList(GatedMLP(config, config.moe_intermediate_size) for _ in range(config.num_experts))
        shared = config.num_shared_experts or 0
        self.shared_experts = GatedMLP(config, config.moe_intermediate_size * shared) if shared > 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        experts, weights = self.gate(flat)
        out = torch.zeros(flat.shape, dtype=torch.float32, device=x.device)
        for e in torch.unique(experts).tolist():
            rows, slot = torch.where(experts == e)
            y = self.experts[e](flat[rows]).float() * weights[rows, slot, None]
            out = out.index_add(0, rows, y)
        out = out.to(x.dtype).view_as(x)
        return out if self.shared_experts is None else out + self.shared_experts(x)


class Attention(nn.Module):
    """Grouped-query attention with fused ``query_key_value``, QK-norm and partial RoPE."""

    def __init__(self, config: LLaDA2MoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, d = layer_idx, config.head_dim
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.num_key_value_groups, self.is_causal = self.heads // self.kv_heads, False  # read by transformers' SDPA
        self.query_key_value = nn.Linear(config.hidden_size, (self.heads + 2 * self.kv_heads) * d, bias=config.use_qkv_bias)
        if config.use_qk_norm:
            self.query_layernorm, self.key_layernorm = RMSNorm(d, config.rms_norm_eps), RMSNorm(d, config.rms_norm_eps)
        self.qk_norm = bool(config.use_qk_norm)
        self.dense = nn.Linear(self.heads * d, config.hidden_size, bias=config.use_bias)

    def forward(self, x, mask, cos, sin, cache=None) -> torch.Tensor:
        n, t, _ = x.shape
        qkv = self.query_key_value(x).view(n, t, self.heads + 2 * self.kv_heads, -1).transpose(1, 2)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=1)
        if self.qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        out, _ = ALL_ATTENTION_FUNCTIONS["sdpa"](self, q, k, v, mask, dropout=0.0, scaling=self.head_dim ** -0.5)
        return self.dense(out.reshape(n, t, -1))


class DecoderLayer(GradientCheckpointingLayer):
    """Pre-norm attention and MLP (dense before ``first_k_dense_replace``, else MoE), with residuals."""

    def __init__(self, config: LLaDA2MoeConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention = Attention(config, layer_idx)
        dense = config.num_experts is None or layer_idx < config.first_k_dense_replace
        self.mlp = GatedMLP(config, config.intermediate_size) if dense else SparseMoE(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, mask, cos, sin, cache=None) -> torch.Tensor:
        x = x + self.attention(self.input_layernorm(x), mask, cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LLaDA2MoePreTrainedModel(PreTrainedModel):
    config_class = LLaDA2MoeConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DecoderLayer"]

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding, Router)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)


class LLaDA2MoeModel(LLaDA2MoePreTrainedModel):
    """Embedding, decoder layers, final norm; RoPE tables computed per call in float32."""

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__(config)
        # no padding_idx (the family's code sets pad = eos 156892 there, which would freeze the eos row's
        # gradient): the pad id lives on the adapter, as for every family (docs/models.md, "Pad id")
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        rot = int(config.head_dim * config.partial_rotary_factor)
        inv = 1.0 / (config.rope_theta ** (torch.arange(0, rot, 2, dtype=torch.int64).float() / rot))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.word_embeddings

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=False,
                inputs_embeds=None, past_key_values=None, **_) -> BaseModelOutputWithPast:
        """``input_ids [N, T]``; ``attention_mask``: additive ``[N, 1, T, K]`` or ``None`` (all attend);
        ``position_ids [N, T]`` (default ``0 .. T-1`` after the cached length); ``cache``: a transformers
        ``Cache`` updated in place."""
        cache = cache if cache is not None else past_key_values
        h = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if position_ids is None:
            start = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(start, start + h.shape[1], device=h.device)[None].expand(h.shape[0], -1)
        freqs = position_ids[..., None].float() * self.inv_freq.float().to(h.device)  # [N, T, R/2]
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]
        cos, sin = emb.cos().to(h.dtype), emb.sin().to(h.dtype)
        mask = None if attention_mask is None else attention_mask.to(h.dtype)
        for layer in self.layers:
            h = layer(h, mask, cos, sin, cache)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(h), past_key_values=cache)


class LLaDA2MoeModelLM(LLaDA2MoePreTrainedModel):
    """:class:`LLaDA2MoeModel` plus the output layer ``lm_head`` (logits ``[N, T, V]``, no shift)."""

    _tied_weights_keys = {"lm_head.weight": "model.word_embeddings.weight"}

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__(config)
        self.model = LLaDA2MoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.word_embeddings

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def get_decoder(self) -> LLaDA2MoeModel:
        return self.model

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, **kwargs) -> CausalLMOutputWithPast:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        return CausalLMOutputWithPast(logits=self.lm_head(out.last_hidden_state), past_key_values=out.past_key_values)


def parameter_counts(config: LLaDA2MoeConfig) -> dict[str, int]:
    """Resident and per-token active parameters of a :class:`LLaDA2MoeModelLM` of ``config``, from its shape
    (what a planner needs; checked against the module's own count in ``tests/test_llada2.py``).

    Returns:
        ``{total, routed_experts, active_per_token, router}``: every parameter; those of the routed experts
        (``num_experts`` per MoE layer); those one token runs through (everything but the routed experts, plus
        ``num_experts_per_tok`` experts per MoE layer); the router weights (``num_experts × hidden`` per MoE
        layer). The expert bias is a buffer and counts in none of them.
    """
    c = config
    h, d, layers = c.hidden_size, c.head_dim, c.num_hidden_layers
    attn = h * (c.num_attention_heads + 2 * c.num_key_value_heads) * d + c.num_attention_heads * d * h
    attn += (c.num_attention_heads + 2 * c.num_key_value_heads) * d * bool(c.use_qkv_bias) + h * bool(c.use_bias)
    attn += 2 * d * bool(c.use_qk_norm) + 2 * h  # QK-norm weights, the layer's two RMSNorms
    moe_layers = 0 if c.num_experts is None else max(layers - c.first_k_dense_replace, 0)
    expert = 3 * h * c.moe_intermediate_size
    router = moe_layers * c.num_experts * h if moe_layers else 0
    shared = moe_layers * expert * (c.num_shared_experts or 0)
    dense = (layers - moe_layers) * 3 * h * c.intermediate_size
    routed = moe_layers * c.num_experts * expert if moe_layers else 0
    head = 0 if c.tie_word_embeddings else c.vocab_size * h
    total = c.vocab_size * h + head + h + layers * attn + dense + shared + router + routed
    active = total - routed + (moe_layers * c.num_experts_per_tok * expert if moe_layers else 0)
    return {"total": total, "routed_experts": routed, "active_per_token": active, "router": router}
