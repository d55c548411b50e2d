"""maskrl's own layouts: the built-in tiny model's folders (``maskrl_family`` key) and ``*ForMaskedLM``
checkpoints of classes transformers knows (docs/spec.md §1.1).

``tiny`` (a folder written by :func:`maskrl.models.save_model`; ``maskrl_family`` key, and
``model_type: "maskrl_tiny"`` so that no plain transformers load passes silently)
    Loaded with :func:`maskrl.models.load_tiny` (its ``maskrl_block_size`` too). LLaDA / Dream / SDAR /
    Fast-dLLM v2 exports of :func:`~maskrl.models.save_model` are in their family's own layout and load
    as that family (their ``maskrl_stop_ids`` kept).
``masked_lm`` (``architectures`` ending in ``ForMaskedLM``, a ``model_type`` transformers knows)
    Loaded with ``AutoModelForMaskedLM.from_pretrained`` (no remote code) and run with a 2-D mask.
    Missing tensors are refused; tensors transformers drops for that class (e.g. BERT's pooler and
    next-sentence head) are ignored. Needs a mask token (config ``mask_token_id`` or the tokenizer's).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from maskrl.models.families.base import FAMILIES, Family, first_id, without
from maskrl.models.loading import end_ids, listing


@FAMILIES.register("tiny")
class Tiny(Family):
    """A folder in maskrl's own layout (:func:`maskrl.models.save_model` of the tiny model or any model
    without a family layout): claimed by its ``maskrl_family`` key."""

    name = "tiny"
    display_name = "maskrl"
    marker_key = "maskrl_family"
    own_tokenizer = True

    def adapter_fields(self, cfg: dict, folder: Path, tokenizer: Any, dtype: torch.dtype, device) -> dict:
        """:func:`maskrl.models.load_tiny`'s fields; its own tokenizer unless one (or ``False``) was passed."""
        from maskrl.models.tiny import load_tiny

        tiny = load_tiny(folder, dtype=dtype)
        tiny.model.to(device or "cpu").eval()
        fields = dict(vars(tiny))  # the dataclass's fields
        if tokenizer is not None:  # an explicit tokenizer, or False for none
            fields["tokenizer"] = None if tokenizer is False else tokenizer
        return fields


@FAMILIES.register("masked_lm")
class MaskedLM(Family):
    """A ``*ForMaskedLM`` checkpoint of a class transformers knows (2-D attention mask, no shift)."""

    name = "masked_lm"
    display_name = "masked LM"
    architectures = ("*ForMaskedLM",)
    attention = "2d"

    def adapter_fields(self, cfg: dict, folder: Path, tokenizer: Any, dtype: torch.dtype, device) -> dict:
        """Ids: ``config.json``'s, then the tokenizer's (eos: the first end id, sep, the tokenizer's eos / sep)."""
        model = _load_masked_lm(folder, dtype, device)
        c, tok = model.config, tokenizer
        ends = end_ids(cfg, folder)
        end = first_id(ends[0] if ends else None, getattr(c, "sep_token_id", None),
                       getattr(tok, "eos_token_id", None), getattr(tok, "sep_token_id", None))
        return dict(model=model, shift=False, family="masked_lm", attention="2d", tokenizer=tok,
                    mask_id=first_id(getattr(c, "mask_token_id", None), getattr(tok, "mask_token_id", None)),
                    eos_id=end, pad_id=first_id(getattr(c, "pad_token_id", None), getattr(tok, "pad_token_id", None)),
                    stop_ids=without(ends, end))


def _load_masked_lm(folder: Path, dtype: torch.dtype, device) -> torch.nn.Module:
    from transformers import AutoModelForMaskedLM

    model, info = AutoModelForMaskedLM.from_pretrained(folder, dtype=dtype, trust_remote_code=False,
                                                       output_loading_info=True)
    if info.get("missing_keys"):
        raise ValueError(f"checkpoint {str(folder)!r} lacks tensors of {type(model).__name__}: "
                         f"{listing(info['missing_keys'])}")
    if info.get("mismatched_keys"):
        raise ValueError(f"checkpoint {str(folder)!r}: tensors of the wrong shape: "
                         f"{listing(str(k) for k in info['mismatched_keys'])}")
    return model.to(device or "cpu").eval()
