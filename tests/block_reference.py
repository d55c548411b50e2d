"""A slow, obvious re-statement of the Qwen2 / Qwen3 decoder forward under block-causal attention, written
from the families' equations (not from transformers): the reference for Fast-dLLM v2, whose own modelling
code could not be run here (docs/models.md), and a second check of the SDAR data recorded with SDAR's code.

Per layer, in float64: ``h += o_proj(attn(rms(h)))``, ``h += down(silu(gate(rms(h))) * up(rms(h)))``;
attention of query ``i`` over the keys ``j`` with ``j // B <= i // B`` (``B`` the block size, positions
from 0), scores ``q·k / sqrt(d)``, rotate-half RoPE with frequencies ``θ^(-2m/d)``, key/value head
``h // (H / H_kv)``; Qwen3 normalises each head's q and k (RMSNorm) before RoPE, Qwen2 adds q/k/v biases;
Qwen3-MoE layers (a ``mlp.gate`` router) mix their top-k experts' MLPs.
"""
from __future__ import annotations

import math

import torch


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _rope(x: torch.Tensor, pos: int, theta: float) -> torch.Tensor:
    """Rotate-half RoPE of one head vector ``x [d]`` at position ``pos``."""
    d = x.shape[-1]
    out = torch.empty_like(x)
    for m in range(d // 2):
        angle = pos * theta ** (-2 * m / d)
        c, s = math.cos(angle), math.sin(angle)
        a, b = x[m], x[m + d // 2]
        out[m], out[m + d // 2] = a * c - b * s, b * c + a * s
    return out


def _linear(w: dict, name: str, x: torch.Tensor) -> torch.Tensor:
    out = x @ w[f"{name}.weight"].T
    return out + w[f"{name}.bias"] if f"{name}.bias" in w else out


def _mlp(w: dict, p: str, x: torch.Tensor) -> torch.Tensor:
    gate, up = _linear(w, f"{p}.gate_proj", x), _linear(w, f"{p}.up_proj", x)
    return _linear(w, f"{p}.down_proj", torch.nn.functional.silu(gate) * up)


def _moe(w: dict, p: str, x: torch.Tensor, cfg: dict) -> torch.Tensor:
    """Qwen3-MoE's sparse block, token by token: router softmax, the top ``num_experts_per_tok`` experts
    (their probabilities renormalised to sum 1 when ``norm_topk_prob``), the weighted sum of their MLPs."""
    out = torch.zeros_like(x)
    for i in range(x.shape[0]):
        probs = torch.softmax(x[i] @ w[f"{p}.gate.weight"].T, 0)
        top = sorted(range(probs.shape[0]), key=lambda e: -float(probs[e]))[: cfg["num_experts_per_tok"]]
        total = sum(float(probs[e]) for e in top) if cfg.get("norm_topk_prob") else 1.0
        for e in top:
            out[i] += probs[e] / total * _mlp(w, f"{p}.experts.{e}", x[i:i + 1])[0]
    return out


def block_lm_logits(weights: dict[str, torch.Tensor], cfg: dict, ids: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[N, T, V]`` float64 raw logits (no re-alignment) of a Qwen2/Qwen3-named checkpoint ``weights``
    (``config.json`` dict ``cfg``) on unpadded rows ``ids [N, T]``, block-causal with ``block_size``."""
    w = {k: v.double() for k, v in weights.items()}
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // heads
    eps, theta = cfg["rms_norm_eps"], float(cfg.get("rope_theta", 10000.0))
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    rows = []
    for row in ids:
        t = row.shape[0]
        h = w["model.embed_tokens.weight"][row]  # [T, hidden]
        for layer in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{layer}"
            x = _rms(h, w[f"{p}.input_layernorm.weight"], eps)
            q = _linear(w, f"{p}.self_attn.q_proj", x).view(t, heads, d)
            k = _linear(w, f"{p}.self_attn.k_proj", x).view(t, kv, d)
            v = _linear(w, f"{p}.self_attn.v_proj", x).view(t, kv, d)
            if f"{p}.self_attn.q_norm.weight" in w:
                q = _rms(q, w[f"{p}.self_attn.q_norm.weight"], eps)
                k = _rms(k, w[f"{p}.self_attn.k_norm.weight"], eps)
            q = torch.stack([torch.stack([_rope(q[i, a], i, theta) for a in range(heads)]) for i in range(t)])
            k = torch.stack([torch.stack([_rope(k[i, a], i, theta) for a in range(kv)]) for i in range(t)])
            att = torch.zeros(t, heads, d, dtype=torch.float64)
            for i in range(t):
                keys = [j for j in range(t) if j // block_size <= i // block_size]
                for a in range(heads):
                    g = a // (heads // kv)
                    scores = torch.stack([q[i, a] @ k[j, g] for j in keys]) / math.sqrt(d)
                    probs = torch.softmax(scores, 0)
                    att[i, a] = sum(pr * v[j, g] for pr, j in zip(probs, keys))
            h = h + _linear(w, f"{p}.self_attn.o_proj", att.reshape(t, heads * d))
            x = _rms(h, w[f"{p}.post_attention_layernorm.weight"], eps)
            h = h + (_moe(w, f"{p}.mlp", x, cfg) if f"{p}.mlp.gate.weight" in w else _mlp(w, f"{p}.mlp", x))
        rows.append(_rms(h, w["model.norm.weight"], eps) @ head.T)
    return torch.stack(rows)
