"""Turning prompt texts into left-padded id batches and completions back into text."""
from __future__ import annotations

from typing import Sequence

import torch


def prompt_token_ids(tokenizer, text: str, add_bos: bool = True) -> list[int]:
    """The ids one prompt is encoded to (:func:`encode_prompts`' rule: no special tokens but the bos
    token, prepended when the tokenizer has one and the text does not start with it)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    bos = getattr(tokenizer, "bos_token_id", None)
    if add_bos and bos is not None and (not ids or ids[0] != bos):
        ids = [bos] + ids
    return ids


def encode_prompts(tokenizer, texts: Sequence[str], add_bos: bool = True,
                   pad_id: int | None = None, empty_id: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenise prompts into a left-padded batch.

    Args:
        tokenizer: a transformers tokenizer (with ``bos_token_id`` if ``add_bos``).
        texts: N prompt strings (already chat-formatted when the model needs it).
        add_bos: prepend the bos token when the tokenizer has one and the text does not start with it.
        pad_id: the id to pad with; default the tokenizer's ``pad_token_id`` (a
            :class:`~maskrl.models.adapter.ModelAdapter` gives a tokenizer without one the model's
            pad id).
        empty_id: the one token a prompt that tokenises to no tokens is encoded to (an empty text on a
            tokenizer without a bos token, Qwen2 / Dream style; the lm-eval model passes its
            ``prefix_token_id``, lm-eval's contract for an empty context). Default ``None``: such a
            prompt is an error.

    Returns:
        ``(ids [N, P] long, mask [N, P] bool)``, padding on the left.

    Raises:
        ValueError: on an empty list, a prompt that tokenises to nothing (without ``empty_id``), or no
            pad id (a tokenizer without a pad token and no ``pad_id``).
    """
    if not texts:
        raise ValueError("encode_prompts: no prompts")
    pad = pad_id if pad_id is not None else getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        raise ValueError("encode_prompts: the tokenizer has no pad token (pad_token_id is None) and no pad_id was "
                         "given; set tokenizer.pad_token, pass pad_id= (the model's pad id), or load the model with "
                         "maskrl.models.load, which gives the tokenizer the model's pad id from config.json")
    seqs = []
    for i, t in enumerate(texts):
        ids = prompt_token_ids(tokenizer, t, add_bos)
        if not ids and empty_id is not None:
            ids = [int(empty_id)]
        if not ids:
            raise ValueError(f"prompt {i} ({t!r}) tokenises to no tokens (the tokenizer adds no bos token); give it "
                             "some text, or pass empty_id= (the token an empty prompt stands for)")
        seqs.append(ids)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s)
        mask[i, width - len(s):] = True
    return ids, mask


def decode_completions(tokenizer, completion_ids: torch.Tensor, completion_mask: torch.Tensor) -> list[str]:
    """Text of each completion: valid tokens only (stop at the first eos), special tokens dropped.

    Args:
        completion_ids: ``[N, L]`` long.
        completion_mask: ``[N, L]`` bool (``Rollout.completion_mask``).
    """
    out = []
    for ids, m in zip(completion_ids.tolist(), completion_mask.tolist()):
        out.append(tokenizer.decode([t for t, keep in zip(ids, m) if keep], skip_special_tokens=True))
    return out
