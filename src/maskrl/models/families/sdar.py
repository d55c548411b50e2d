"""SDAR / TraDo (``model_type: "sdar"``, ``SDARForCausalLM``; JetAstra/SDAR, Gen-Verse TraDo): block
diffusion on Qwen3, loaded into transformers' own :class:`~transformers.Qwen3ForCausalLM` without remote
code (docs/spec.md §1.1; issue 48).

Facts relied on (JetAstra/SDAR ``training/model/SDAR-{4B,8B}-Chat/{config.json, configuration_sdar.py,
modeling_sdar.py}`` and ``generate.py``, commit c2041a8):

* **Qwen3 with Qwen3's parameter names**: q/k/v/o projections (bias = ``attention_bias``), RMSNorm of each
  head's query and key (``q_norm`` / ``k_norm``, eps ``rms_norm_eps``) before RoPE, rotate-half RoPE with
  θ ``rope_theta``, SiLU-gated MLP (``gate_proj`` / ``up_proj`` / ``down_proj``), untied ``lm_head``
  (``tie_word_embeddings: false``); the config keys are Qwen3's.
* **Attention** (``generate.py``): ``tril(ones(nb, nb))`` repeated to the block size -- bidirectional
  inside a block, causal across blocks, blocks counted from position 0 -- given to
  ``F.scaled_dot_product_attention`` as a boolean mask with ``is_causal=False``; positions ``0 .. T-1``.
  maskrl's :func:`~maskrl.models.adapter.block_causal_mask` is that mask (positions from each row's
  first real token).
* ``block_size`` from ``config.json`` (4 in SDAR-4B/8B-Chat; a config without one: 4),
  ``mask_token_id`` 151669, eos 151643 in ``config.json`` and ``[151645, 151643]`` in
  ``generation_config.json`` (all declared end ids end a completion; eos 151643 and stop 151645 only
  when the checkpoint declares none), **no logit shift** (``logits[i]`` predicts token i).

Refused (``NotImplementedError`` naming the key): sliding-window attention, a scaled RoPE, a non-SiLU
activation. Keys that only steer SDAR's training kernels and parallelism (``attn_implementation``,
``fuse_cross_entropy``, ``ep_size``, ``use_deepep``, ``micro_forward``, ``skip_checkpoint``, ``debug``)
do not change the forward and are not read. ``sdar_moe`` (``SDARMoeForCausalLM``, SDAR-30B-A3B) is
Qwen3-MoE with Qwen3-MoE's names into :class:`~transformers.Qwen3MoeForCausalLM` (:class:`SDARMoe`).

Exports (:func:`maskrl.models.save_model`): Qwen3 tensor names, Qwen3 config keys with ``model_type:
"sdar"``, ``block_size`` and ``mask_token_id``; ``architectures`` and ``auto_map`` as the source
checkpoint had them (kept on the model config as ``maskrl_source_architectures`` /
``maskrl_source_auto_map``), else ``["SDARForCausalLM"]`` and no ``auto_map``; a ``generation_config.json``
listing every end id. SDAR's published ``auto_map`` names modelling files in the same folder
(``modeling_sdar.SDARForCausalLM``): to run SDAR's own code on an export, copy those files beside it.
"""
from __future__ import annotations

from maskrl.models.families.base import FAMILIES
from maskrl.models.families.native import NativeFamily, check, default_rope, is_tied, rope_theta

#: block size of an SDAR config without ``block_size`` (that of every published SDAR-*-Chat)
SDAR_BLOCK_SIZE = 4

#: Qwen3 config keys read from (and written to) an SDAR ``config.json``
QWEN3_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
              "attention_bias", "attention_dropout", "bos_token_id", "eos_token_id")  # no pad: _NO_PADDING_IDX


def qwen_keys(cfg: dict, family: str, keys: tuple[str, ...]) -> dict:
    """The ``keys`` of a Qwen-style ``config.json`` dict (absent / null ones left out), after refusing
    what Qwen's transformers classes cannot express here: sliding-window attention, a non-SiLU activation.

    Raises:
        NotImplementedError: naming the key and value.
    """
    if cfg.get("use_sliding_window"):
        raise NotImplementedError(f"{family} config use_sliding_window=True is not supported (block attention only)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"{family} config hidden_act={cfg['hidden_act']!r}: only 'silu' is supported")
    return {k: cfg[k] for k in keys if cfg.get(k) is not None}


def block_size_of(cfg: dict, key: str, default: int, family: str) -> int:
    """``cfg[key]`` as a positive block size, ``default`` when absent.

    Raises:
        ValueError: not a positive integer (the key and value named).
    """
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{family} config.json {key}={value!r}: expected a positive integer block size")
    return value


def source_facts(cfg: dict) -> dict:
    """The source checkpoint's ``architectures`` / ``auto_map``, kept on the native config for exports."""
    return {"maskrl_source_architectures": cfg.get("architectures"), "maskrl_source_auto_map": cfg.get("auto_map")}


def kept_or(c, default_arch: str) -> dict:
    """``architectures`` (and ``auto_map`` when the source had one) of an export: the source's, else
    ``[default_arch]``."""
    out = {"architectures": list(getattr(c, "maskrl_source_architectures", None) or [default_arch])}
    auto_map = getattr(c, "maskrl_source_auto_map", None)
    return out | ({"auto_map": dict(auto_map)} if auto_map else {})


@FAMILIES.register("sdar")
class SDAR(NativeFamily):
    """SDAR / TraDo: Qwen3, block-causal attention (block_size from config.json), mask 151669, no shift."""

    name = "sdar"
    display_name = "SDAR"
    model_types = ("sdar",)
    architectures = ("SDARForCausalLM",)
    model_class = "Qwen3ForCausalLM"
    mask_id, eos_id, stop_ids = 151669, 151643, (151645,)
    stops_if_undeclared = True
    qwen_tokenizer = True
    keys = QWEN3_KEYS

    def native_config(self, cfg: dict):
        import transformers

        config_cls = getattr(transformers, self.model_class.replace("ForCausalLM", "Config"))
        return config_cls(**qwen_keys(cfg, self.display_name, self.keys), **self.extra_config(cfg),
                          hidden_act="silu", use_sliding_window=False, use_cache=False,
                          rope_parameters=default_rope(cfg, self.display_name),
                          mask_token_id=cfg.get("mask_token_id", self.mask_id), block_size=self.block_size(cfg),
                          **source_facts(cfg))

    def extra_config(self, cfg: dict) -> dict:
        """Further native config arguments (the MoE keys of :class:`SDARMoe`)."""
        return {}

    def block_size(self, cfg: dict) -> int:
        return block_size_of(cfg, "block_size", SDAR_BLOCK_SIZE, self.display_name)

    def export_config(self, model, adapter) -> dict:
        """SDAR ``config.json`` of a native Qwen3 model: Qwen3 keys, ``model_type``, ``block_size``, ids.

        Raises:
            NotImplementedError: sliding-window attention, a scaled RoPE, a non-SiLU activation, or an
                adapter without a block size (full attention is not SDAR).
        """
        c = model.config
        check(not getattr(c, "use_sliding_window", False), self.name, "sliding-window attention")
        check(c.hidden_act == "silu", self.name, f"hidden_act {c.hidden_act!r}")
        check(adapter.block_size is not None, self.name, "full attention (block_size None)")
        out = {k: getattr(c, k) for k in self.keys + self.extra_keys() if getattr(c, k, None) is not None}
        return out | kept_or(c, self.architectures[0]) | {
            "model_type": self.model_types[0], "hidden_act": "silu", "rope_theta": rope_theta(c), "rope_scaling": None,
            "use_sliding_window": False, "sliding_window": None, "tie_word_embeddings": is_tied(c),
            "vocab_size": int(model.get_input_embeddings().weight.shape[0]), "use_cache": False,
            "torch_dtype": str(model.dtype).removeprefix("torch."), "block_size": int(adapter.block_size),
            "mask_token_id": int(adapter.mask_id), "eos_token_id": int(adapter.eos_id),
            "pad_token_id": int(adapter.pad_id)}

    def extra_keys(self) -> tuple[str, ...]:
        """Further config keys an export writes (the MoE keys of :class:`SDARMoe`)."""
        return ()

    def how_to_load(self) -> str | None:
        return (f"`maskrl.models.load(folder)`, {self.display_name}'s own code (its modelling files beside the "
                f"folder, `trust_remote_code=True`), or an engine that registers `{self.architectures[0]}` "
                f"(block size in config.json)")

    def save(self, model, adapter, path, facts: dict) -> dict:
        """The family's layout (:meth:`NativeFamily.save`), plus a ``generation_config.json`` listing every end
        id (``[eos, *stop ids]``, as SDAR's ``[151645, 151643]``), which SDAR's code and the engines read."""
        cfg = super().save(model, adapter, path, facts)
        if cfg.get("model_type") == self.model_types[0]:
            import json

            ends = [int(adapter.eos_id), *(int(i) for i in adapter.stop_ids)]
            gen = {"bos_token_id": cfg.get("bos_token_id", ends[0]), "eos_token_id": ends,
                   "pad_token_id": int(adapter.pad_id)}
            (path / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        return cfg


#: Qwen3-MoE config keys of an ``sdar_moe`` ``config.json`` besides the dense ones
QWEN3_MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                  "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef", "output_router_logits")


@FAMILIES.register("sdar_moe")
class SDARMoe(SDAR):
    """SDAR-MoE (``sdar_moe``, ``SDARMoeForCausalLM``, SDAR-30B-A3B): Qwen3-MoE, block-causal attention."""

    name = "sdar_moe"
    display_name = "SDAR-MoE"
    model_types = ("sdar_moe",)
    architectures = ("SDARMoeForCausalLM",)
    model_class = "Qwen3MoeForCausalLM"

    def extra_config(self, cfg: dict) -> dict:
        return {k: cfg[k] for k in QWEN3_MOE_KEYS if cfg.get(k) is not None}

    def extra_keys(self) -> tuple[str, ...]:
        return QWEN3_MOE_KEYS

    # Qwen3-MoE checkpoints store each expert's ``mlp.experts.{e}.{gate,up,down}_proj.weight``; transformers
    # 5's class holds them fused: ``mlp.experts.gate_up_proj [E, 2I, H]`` (gate rows, then up rows, as its
    # own conversion mapping for qwen3_moe builds it) and ``mlp.experts.down_proj [E, H, I]``.
    def unfused(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        out = {}
        for name, shape in shapes.items():
            if name.endswith(_GATE_UP):
                base, (experts, two_i, hidden) = name[: -len("gate_up_proj")], shape
                for e in range(experts):
                    out[f"{base}{e}.gate_proj.weight"] = out[f"{base}{e}.up_proj.weight"] = (two_i // 2, hidden)
            elif name.endswith(_DOWN):
                base, (experts, hidden, inter) = name[: -len("down_proj")], shape
                out |= {f"{base}{e}.down_proj.weight": (hidden, inter) for e in range(experts)}
            else:
                out[name] = shape
        return out

    def fused(self, state: dict):
        import torch

        out, experts = {}, {}
        for name, t in state.items():
            base, sep, rest = name.partition(".mlp.experts.")
            if not sep:
                out[name] = t
                continue
            e, proj = rest.split(".", 1)
            experts.setdefault(base, {}).setdefault(proj, {})[int(e)] = t
        for base, projs in experts.items():
            stack = {p: torch.stack([ts[e] for e in sorted(ts)]) for p, ts in projs.items()}
            out[f"{base}.mlp.{_GATE_UP}"] = torch.cat([stack["gate_proj.weight"], stack["up_proj.weight"]], dim=1)
            out[f"{base}.mlp.{_DOWN}"] = stack["down_proj.weight"]
        return out

    def split(self, state: dict):
        out = {}  # each expert's slice copied: safetensors refuses tensors that share storage
        for name, t in state.items():
            if name.endswith(_GATE_UP):
                gate, up = t.chunk(2, dim=1)
                base = name[: -len("gate_up_proj")]
                for e in range(t.shape[0]):
                    out[f"{base}{e}.gate_proj.weight"] = gate[e].clone()
                    out[f"{base}{e}.up_proj.weight"] = up[e].clone()
            elif name.endswith(_DOWN):
                base = name[: -len("down_proj")]
                out |= {f"{base}{e}.down_proj.weight": t[e].clone() for e in range(t.shape[0])}
            else:
                out[name] = t
        return out


_GATE_UP, _DOWN = "experts.gate_up_proj", "experts.down_proj"
