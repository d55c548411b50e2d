"""Mixture-of-Experts shapes in the planner (LLaDA2.x, ``llada2_moe``): the family's config at any width,
and the routed experts' forward on the ``meta`` device, where no routing can be computed.

FLOPs of the routed experts do not depend on the routing: the family's forward
(:class:`maskrl.models.llada2_moe.SparseMoE`) runs each chosen expert once on the tokens routed to it, so its
three matmuls cost ``2 · n_e · H · I`` FLOPs each for the ``n_e`` tokens expert ``e`` receives, and
``Σ_e n_e = M · k`` for any routing of ``M`` tokens to ``k`` distinct experts each; the backward is the same
sum. On the meta device the router runs (its logits, sigmoid scores, grouped top-k and weights are shapes
only) but which expert a token goes to is unknown, so :func:`meta_routing` hands the experts a fixed,
balanced routing (token ``t``'s ``j``-th slot to expert ``(t · k + j) mod E``: ``k`` distinct experts per
token when ``k ≤ E``) and runs the family's own expert, weighting and shared-expert code on it. The count is
that of any real routing (``tests/test_plan_moe.py`` checks it against ``FlopCounterMode`` on a real CPU
forward with the model's own routing)."""
from __future__ import annotations

import types

import torch

#: ModelShape fields of an MoE model (0 / None on a dense one)
MOE_FIELDS = ("num_experts", "num_experts_per_tok", "num_shared_experts", "moe_intermediate_size",
              "first_dense_layers", "n_group", "topk_group")


def llada2_config(shape, hidden_size: int, num_layers: int, head_dim: int, intermediate_size: int):
    """The :class:`~maskrl.models.llada2_moe.LLaDA2MoeConfig` of ``shape`` at ``hidden_size`` / ``num_layers``
    (the expert width scaled with the model's width, as the dense MLP's is)."""
    from maskrl.models.llada2_moe import LLaDA2MoeConfig

    moe = shape.moe_intermediate_size * hidden_size // shape.hidden_size
    return LLaDA2MoeConfig(vocab_size=shape.vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                           num_hidden_layers=num_layers, num_attention_heads=shape.num_heads,
                           num_key_value_heads=shape.num_kv_heads, head_dim=head_dim, use_bias=False,
                           tie_word_embeddings=shape.tie, rope_theta=shape.rope_theta or 600000.0,
                           num_experts=shape.num_experts, num_shared_experts=shape.num_shared_experts,
                           num_experts_per_tok=shape.num_experts_per_tok, n_group=shape.n_group,
                           topk_group=shape.topk_group, moe_intermediate_size=moe,
                           first_k_dense_replace=shape.first_dense_layers, pad_token_id=None, use_cache=False)


def balanced_routing(tokens: int, top_k: int, experts: int) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """``[(expert, rows, slots)]``: token ``t``'s slot ``j`` goes to expert ``(t · top_k + j) mod experts``
    (CPU long tensors; experts that get no token are left out)."""
    assign = (torch.arange(tokens * top_k) % experts).view(tokens, top_k)
    out = []
    for e in range(experts):
        rows, slots = torch.where(assign == e)
        if rows.numel():
            out.append((e, rows, slots))
    return out


def _meta_moe_forward(self, x: torch.Tensor) -> torch.Tensor:
    """:meth:`SparseMoE.forward <maskrl.models.llada2_moe.SparseMoE.forward>` with the routing of
    :func:`balanced_routing` in place of the router's chosen experts (the router still runs, and its
    weights still scale each expert's output)."""
    flat = x.reshape(-1, x.shape[-1])
    _, weights = self.gate(flat)
    out = torch.zeros(flat.shape, dtype=torch.float32, device=x.device)
    for e, rows, slots in balanced_routing(flat.shape[0], self.gate.top_k, len(self.experts)):
        rows, slots = rows.to(x.device), slots.to(x.device)
        y = self.experts[e](flat[rows]).float() * weights[rows, slots, None]
        out = out.index_add(0, rows, y)
    out = out.to(x.dtype).view_as(x)
    return out if self.shared_experts is None else out + self.shared_experts(x)


def meta_routing(model: torch.nn.Module) -> torch.nn.Module:
    """Give every :class:`~maskrl.models.llada2_moe.SparseMoE` of a ``meta`` model the balanced routing
    (module docstring), as an instance attribute ``forward``; other models are returned as they are."""
    from maskrl.models.llada2_moe import SparseMoE

    for m in model.modules():
        if isinstance(m, SparseMoE) and m.gate.weight.device.type == "meta":
            m.forward = types.MethodType(_meta_moe_forward, m)
    return model


def active_params(shape) -> dict | None:
    """``{total, routed_experts, active_per_token, router}`` of an MoE shape
    (:func:`maskrl.models.llada2_moe.parameter_counts`), ``None`` for a dense one."""
    if not getattr(shape, "num_experts", None):
        return None
    from maskrl.models.llada2_moe import parameter_counts

    return parameter_counts(shape.hf_config())
