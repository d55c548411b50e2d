"""What a model family is: one class per published checkpoint layout, registered by name and detected
from ``config.json`` (docs/spec.md §1.1; issue 48, "the shape it lands in").

A family holds everything that differs between layouts -- its config mapping onto a transformers class,
its tensor names, its special ids, its attention kind (full, or block-causal with a block size), its
logit shift and the layout :func:`maskrl.models.save_model` writes -- so :func:`maskrl.models.load` and
:func:`~maskrl.models.save_model` only ask the registry (:data:`FAMILIES`). A new family is one module
that subclasses :class:`Family` (usually :class:`NativeFamily`) and registers it::

    @FAMILIES.register("my_family")
    class MyFamily(NativeFamily):
        name = "my_family"
        model_types = ("my_model_type",)
        ...

which works from outside ``src/`` too (``plugins: [my_family.py]``, or any import before ``load``).
"""
from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any, ClassVar

import torch

from maskrl.registry import Registry

#: every registered family, by its :attr:`Family.name` (the adapter's ``family``)
FAMILIES: Registry[type["Family"]] = Registry("model family")


def first_id(*values) -> int | None:
    """The first of ``values`` that is not ``None``, as an int (``None`` when all are)."""
    for v in values:
        if v is not None:
            return int(v)
    return None


def without(ids, eos_id: int | None) -> tuple[int, ...]:
    """``ids`` without repeats and without ``eos_id`` (which ends a completion anyway)."""
    return tuple(i for i in dict.fromkeys(int(i) for i in ids) if i != eos_id)


class Family:
    """A checkpoint layout. Subclasses set the class attributes and override what differs.

    Attributes:
        name: the family's name (:attr:`ModelAdapter.family`, the registry key).
        display_name: how people write it ("LLaDA", "Fast-dLLM v2"), for messages and model cards.
        model_types: ``config.json`` ``model_type`` values of the family (compared case-insensitively).
        architectures: ``fnmatch`` patterns over ``config.json``'s ``architectures`` (``"Dream*"``).
        marker_key: a ``config.json`` key whose presence alone claims the folder (maskrl's own layout).
        shift: logits at ``i`` predict token ``i + 1`` (Dream, Fast-dLLM v2); the adapter re-aligns them.
        attention: ``"4d"`` (a decoder class run with maskrl's 4-D mask) or ``"2d"`` (bidirectional class).
        code_repo: Hub repository of the family's own modelling code (exports' ``auto_map``), or ``None``.
        own_tokenizer: the family reads its own tokenizer: :meth:`adapter_fields` gets the caller's
            ``tokenizer`` argument as is (``None``: its own, ``False``: none, else that one).
        block_rule: the decoding rule (:class:`~maskrl.sampling.SamplerConfig` fields) ``maskrl eval`` and the
            lm-eval model use on the family's block-diffusion models unless told otherwise
            (:func:`model_decode_rule`; default: the exact block cache and early stop).
        qwen_tokenizer: fall back to ``Qwen2Tokenizer`` (``vocab.json`` + ``merges.txt``) when the
            folder's tokenizer needs remote code.
    """

    name: ClassVar[str] = ""
    display_name: ClassVar[str] = ""
    model_types: ClassVar[tuple[str, ...]] = ()
    architectures: ClassVar[tuple[str, ...]] = ()
    marker_key: ClassVar[str | None] = None
    shift: ClassVar[bool] = False
    attention: ClassVar[str] = "4d"
    code_repo: ClassVar[str | None] = None
    qwen_tokenizer: ClassVar[bool] = False
    own_tokenizer: ClassVar[bool] = False
    block_rule: ClassVar[dict] = {"cache": "block", "early_stop": True}

    # ------------------------------------------------------------------ detection
    @classmethod
    def claims(cls, cfg: dict) -> int | None:
        """How strongly this family claims a ``config.json`` dict: 0 by :attr:`marker_key`, 1 by
        ``model_type``, 2 by ``architectures``; ``None``: not at all (lower wins, :func:`detect`)."""
        if cls.marker_key is not None and cls.marker_key in cfg:
            return 0
        if str(cfg.get("model_type", "")).lower() in {t.lower() for t in cls.model_types}:
            return 1
        archs = [str(a) for a in cfg.get("architectures") or []]
        if any(fnmatch.fnmatchcase(a, p) for a in archs for p in cls.architectures):
            return 2
        return None

    # ------------------------------------------------------------------ loading
    def adapter_fields(self, cfg: dict, folder: Path, tokenizer: Any, dtype: torch.dtype, device) -> dict:
        """The :class:`~maskrl.models.ModelAdapter` fields (model, ids, shift, attention, block size) of the
        checkpoint in ``folder`` whose ``config.json`` is ``cfg``; ``tokenizer`` is the loaded one or ``None``.

        Raises:
            ValueError / NotImplementedError: the checkpoint does not fit the family (named).
        """
        raise NotImplementedError(f"family {self.name!r} cannot load checkpoints")

    # ------------------------------------------------------------------ export
    def save(self, model: torch.nn.Module, adapter, path: Path, facts: dict) -> dict:
        """Write ``model``'s weights into ``path`` and return its ``config.json`` dict (``facts``, the
        adapter's ``maskrl_*`` keys, included). Default: maskrl's own layout (:func:`save_maskrl_layout`)."""
        return save_maskrl_layout(model, adapter, path, facts)

    def how_to_load(self) -> str | None:
        """The model card's "load with" line, or ``None`` for maskrl's own
        (:func:`maskrl.models.export.write_model_card`)."""
        return None


#: maskrl's own layout of a decoder class made bidirectional: a type transformers maps to no class
TINY_MODEL_TYPE = "maskrl_tiny"
TINY_ARCHITECTURE = "MaskrlTinyDiffusionLM"


def save_maskrl_layout(model: torch.nn.Module, adapter, path: Path, facts: dict) -> dict:
    """``model.save_pretrained(path)`` plus the adapter's facts and ``maskrl_family``. A 4-D-mask model
    (a decoder class made bidirectional) gets ``model_type: "maskrl_tiny"`` so that a plain causal load is
    refused; its own type is kept under ``maskrl_native_model_type`` for :func:`maskrl.models.load_tiny`."""
    model.save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg |= facts | {"maskrl_family": adapter.family}
    if adapter.attention == "4d":
        cfg["maskrl_native_model_type"] = cfg["model_type"]
        cfg["maskrl_native_architectures"] = cfg.get("architectures")
        cfg["model_type"], cfg["architectures"] = TINY_MODEL_TYPE, [TINY_ARCHITECTURE]
        cfg["maskrl_loader"] = "maskrl.models.load"
    return cfg


def detect(cfg: dict, folder=None) -> type[Family]:
    """The registered family of a ``config.json`` dict: the one with the strongest claim
    (:meth:`Family.claims`: marker key, then ``model_type``, then ``architectures``).

    Raises:
        ValueError: no family claims it (``model_type`` and ``architectures`` named, the families
            listed), or two claim it equally (both named).
    """
    claims = {}
    for name in FAMILIES:
        rank = FAMILIES.get(name).claims(cfg)
        if rank is not None:
            claims.setdefault(rank, []).append(name)
    if not claims:
        archs = [str(a) for a in cfg.get("architectures") or []]
        known = ", ".join(f"{n} (model_type {list(FAMILIES.get(n).model_types)})" for n in FAMILIES)
        raise ValueError(f"cannot load {str(folder or '')!r}: model_type={cfg.get('model_type', '')!r}, "
                         f"architectures={archs}; supported families: {known}")
    best = claims[min(claims)]
    if len(best) > 1:
        raise ValueError(f"{str(folder or '')!r}: families {best} all claim model_type={cfg.get('model_type')!r}")
    return FAMILIES.get(best[0])


def declared_block_size(cfg: dict, folder=None) -> int | None:
    """Tokens per block a ``config.json`` dict declares, as its family reads it (SDAR's ``block_size``,
    Fast-dLLM v2's ``bd_size``, maskrl's own layout's ``maskrl_block_size``), ``None`` for full attention.

    Raises:
        ValueError: no family claims ``cfg`` (:func:`detect`), or a malformed block size (named).
    """
    fam = detect(cfg, folder)
    if fam.marker_key is not None and fam.marker_key in cfg:  # maskrl's own layout states it itself
        return cfg.get("maskrl_block_size")
    reader = getattr(fam(), "block_size", None)
    return reader(cfg) if reader is not None else None


def model_block_size(model) -> int | None:
    """The block size of ``model`` before (or without) loading it: a loaded adapter's ``block_size``, a
    folder's ``config.json`` (:func:`declared_block_size`), a Hub id whose shape the planner knows
    (:data:`maskrl.plan.KNOWN_MODELS`), else ``None`` (full attention, or not known before loading)."""
    if hasattr(model, "block_size") and hasattr(model, "model"):
        return model.block_size
    f = Path(str(model)) / "config.json"
    if f.is_file():
        try:
            return declared_block_size(json.loads(f.read_text()), f.parent)
        except (ValueError, OSError):
            return None  # the loader names what is wrong with the folder
    from maskrl.plan.shapes import KNOWN_MODELS

    return KNOWN_MODELS.get(str(model), {}).get("block_size")


def model_decode_rule(model) -> dict:
    """The decoding rule (:class:`~maskrl.sampling.SamplerConfig` fields) evaluation uses by default on
    ``model`` (a loaded adapter, a folder or a Hub id): for a block-diffusion model (:func:`model_block_size`)
    its family's :attr:`Family.block_rule` (LLaDA2's threshold rule, ...), else ``{}`` (the sampler's
    defaults). A copy: changing it changes no family."""
    if model_block_size(model) is None:
        return {}
    family = getattr(model, "family", None) if hasattr(model, "model") else None
    f = Path(str(model)) / "config.json"
    if family is None and f.is_file():
        try:
            return dict(detect(json.loads(f.read_text()), f.parent).block_rule)
        except (ValueError, OSError):
            pass
    return dict((FAMILIES.get(family) if family in FAMILIES else Family).block_rule)
