"""The shared path of families loaded into a transformers decoder class (Llama, Qwen2, Qwen3, ...) run
with maskrl's 4-D mask: config mapping, tensor renames and special ids per family, streaming and name
checks shared (:func:`maskrl.models.loading.build_and_load`); exports in the family's own layout."""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import torch

from maskrl.models.families.base import Family, first_id, save_maskrl_layout, without
from maskrl.models.loading import build_and_load, end_ids


class NativeFamily(Family):
    """A family whose checkpoints load into one transformers decoder class.

    Subclasses give :meth:`native_config` (``config.json`` dict -> transformers config), :attr:`model_class`,
    the default ids, and for exports :meth:`export_config`; tensor names default to the native class's
    own (override :meth:`to_native` / :meth:`to_checkpoint`).

    Attributes:
        model_class: name of the transformers class (``"Qwen2ForCausalLM"``).
        mask_id, eos_id: ids used when ``config.json`` (and ``generation_config.json``) declare none.
        stop_ids: further ids that end a completion.
        stops_if_undeclared: use :attr:`stop_ids` only when the checkpoint declares no end id (its
            ``eos_token_id`` lists already name them); ``False`` (LLaDA): always.
    """

    model_class: ClassVar[str] = ""
    mask_id: ClassVar[int | None] = None
    eos_id: ClassVar[int | None] = None
    stop_ids: ClassVar[tuple[int, ...]] = ()
    stops_if_undeclared: ClassVar[bool] = False

    def native_config(self, cfg: dict):
        """The transformers config equivalent to the family's ``config.json`` dict.

        Raises:
            NotImplementedError: a setting the native class cannot express (named).
        """
        raise NotImplementedError

    def to_native(self, name: str) -> str | None:
        """The native class's name of a checkpoint tensor (``None``: it has none). Default: the same name."""
        return name

    def to_checkpoint(self, native: str) -> str:
        """Inverse of :meth:`to_native` (exports, error messages). Default: the same name."""
        return native

    def unfused(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        """Native tensor names and shapes as the checkpoint stores them, from the native class's
        ``state_dict`` shapes (default: the same; :meth:`fused` assembles them)."""
        return shapes

    def fused(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The native class's ``state_dict`` from tensors named as :meth:`unfused` lists them (default: as is)."""
        return state

    def block_size(self, cfg: dict) -> int | None:
        """Tokens per block of a block-diffusion checkpoint, ``None`` for full attention (default)."""
        return None

    def transformers_class(self) -> type:
        import transformers

        return getattr(transformers, self.model_class)

    def adapter_fields(self, cfg: dict, folder: Path, tokenizer: Any, dtype: torch.dtype, device) -> dict:
        """Model in :attr:`model_class`; ids from ``config.json`` (a list-valued ``eos_token_id`` there or in
        ``generation_config.json``: the first is ``eos_id``, the rest stop ids), then the family defaults."""
        model = build_and_load(self.native_config(cfg), self.transformers_class(), folder, self, dtype, device)
        ends = end_ids(cfg, folder)
        cfg_eos = ends[0] if ends else None
        end = first_id(cfg_eos, self.eos_id)
        stops = cfg.get("maskrl_stop_ids")  # a maskrl export keeps its stop ids
        default = () if self.stops_if_undeclared and ends else self.stop_ids
        stops = default if stops is None else tuple(stops)
        return dict(model=model, mask_id=first_id(cfg.get("mask_token_id"), self.mask_id), eos_id=end,
                    pad_id=first_id(cfg.get("pad_token_id"), cfg_eos, self.eos_id), shift=self.shift,
                    family=self.name, attention="4d", tokenizer=tokenizer, stop_ids=without(stops + ends, end),
                    block_size=self.block_size(cfg))

    # ------------------------------------------------------------------ export
    def export_config(self, model: torch.nn.Module, adapter) -> dict:
        """The family's ``config.json`` dict for a native model (inverse of :meth:`native_config`)."""
        raise NotImplementedError

    def save(self, model: torch.nn.Module, adapter, path: Path, facts: dict) -> dict:
        """The family's own layout when ``model`` is its :attr:`model_class` (its tensor names, its config
        keys, :meth:`export_config`), else maskrl's layout (:func:`save_maskrl_layout`)."""
        if type(model).__name__ != self.model_class:
            return save_maskrl_layout(model, adapter, path, facts)
        cfg = self.export_config(model, adapter) | facts
        write_weights(self.export_state(model), path)
        return cfg

    def export_state(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """``model``'s tensors under the family's names (:meth:`to_checkpoint`), a tied output layer left out.

        Raises:
            NotImplementedError: a tensor with no name in the family's layout.
        """
        state = dict(model.state_dict())
        if is_tied(model.config):
            state.pop("lm_head.weight", None)
        state = self.split(state)
        out = {}
        for native, t in state.items():
            name = self.to_checkpoint(native)
            if self.to_native(name) != native:
                raise NotImplementedError(f"save_model: tensor {native!r} has no name in the {self.name} layout")
            out[name] = t.detach().contiguous()
        return out

    def split(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Inverse of :meth:`fused` (exports): the native tensors as the checkpoint stores them. Default: as is."""
        return state

    def how_to_load(self) -> str | None:
        if self.code_repo is None:
            return None
        return (f"{self.display_name}'s own code "
                f"(`AutoModel.from_pretrained(folder, trust_remote_code=True)`, code from `{self.code_repo}`) "
                "or `maskrl.models.load(folder)`")


def write_weights(state: dict[str, torch.Tensor], path: Path, max_shard_size: str = "5GB") -> None:
    """safetensors shards (+ ``model.safetensors.index.json`` when more than one) through
    ``huggingface_hub.save_torch_state_dict``."""
    from huggingface_hub import save_torch_state_dict

    save_torch_state_dict({k: v.cpu() for k, v in state.items()}, path, max_shard_size=max_shard_size,
                          metadata={"format": "pt"})


def is_tied(c) -> bool:
    """Whether a transformers config ties the output layer to the input embedding."""
    return bool(getattr(c, "tie_word_embeddings", False))


def check(cond: bool, family: str, what: str) -> None:
    """Refuse an export the family's layout cannot express (``NotImplementedError`` naming ``what``)."""
    if not cond:
        raise NotImplementedError(f"save_model: this {family} model has {what}, which the {family} "
                                  f"checkpoint layout cannot express")


def rope_theta(c) -> float:
    """θ of a config's default RoPE (refuses a scaled one, :func:`check`)."""
    params = getattr(c, "rope_parameters", None) or {}
    check(params.get("rope_type", "default") == "default", "model", f"rope_type {params.get('rope_type')!r}")
    return float(params.get("rope_theta", getattr(c, "rope_theta", 10000.0)))


def default_rope(cfg: dict, family: str) -> dict:
    """transformers 5's ``rope_parameters`` of a config whose ``rope_scaling`` is ``None`` or of type
    ``"default"`` (the form remote code writes).

    Raises:
        NotImplementedError: any other RoPE scaling (named).
    """
    scaling = cfg.get("rope_scaling")
    rope_type = None if scaling is None else scaling.get("rope_type", scaling.get("type"))
    if rope_type not in (None, "default"):
        raise NotImplementedError(f"{family} config rope_scaling={scaling!r}: only default RoPE is supported")
    return {"rope_type": "default", "rope_theta": float(cfg.get("rope_theta", 10000.0))}
