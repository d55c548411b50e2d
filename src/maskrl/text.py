"""Turning prompt texts into left-padded id batches and completions back into text.

**Special ids come only from the template, never from the data's text** (issue 50 §2). A task row
that spells a control token (``<|mask|>``, ``<|eos|>``, ``<|pad|>``, ``<|im_start|>``, ... -- any
special token of the tokenizer) is text: for a masked diffusion model a mask id in the prompt is a
blank it is asked to fill. A plain ``str`` given to :func:`prompt_token_ids` / :func:`encode_prompts`
/ :func:`data_token_ids` is data: encoded with ``split_special_tokens=True`` (transformers' public
tokenizer call), so its special-token strings become their ordinary text tokens. Text written by a
template is a :class:`ModelInput` (:func:`model_input`: the chat template around the task prompt),
which records which characters the template wrote; only there are special tokens read as control
ids. The bos id the encoder prepends is the template's too.
"""
from __future__ import annotations

import re
import warnings
from typing import Sequence

import torch

#: stands for the user text when the chat template is rendered to find what the template writes
_SENTINEL = "MASKRLUSERTEXT7F3A"


class ModelInput(str):
    """Model-input text that knows which of its characters a template wrote.

    A ``str`` (usable wherever text is), with ``parts``: ``((text, from_template), ...)`` whose texts
    join to the string. Special-token strings are control ids only inside ``from_template`` parts.
    Slicing a ``ModelInput`` and adding a ``str`` to it (the added text is data) keep the parts; any
    other string operation gives a plain ``str`` (data).
    """

    parts: tuple[tuple[str, bool], ...]

    def __new__(cls, parts: Sequence[tuple[str, bool]]) -> "ModelInput":
        merged: list[tuple[str, bool]] = []
        for text, tmpl in parts:
            if not text:
                continue
            if merged and merged[-1][1] == bool(tmpl):
                merged[-1] = (merged[-1][0] + text, bool(tmpl))
            else:
                merged.append((text, bool(tmpl)))
        obj = super().__new__(cls, "".join(t for t, _ in merged))
        obj.parts = tuple(merged)
        return obj

    @classmethod
    def template(cls, text: str) -> "ModelInput":
        """All of ``text`` written by a template (e.g. lm-eval's ``--apply_chat_template`` contexts)."""
        return cls([(str(text), True)])

    def __add__(self, other: str) -> "ModelInput":
        if not isinstance(other, str):
            return NotImplemented
        return ModelInput(self.parts + tuple(getattr(other, "parts", ((str(other), False),))))

    def __getitem__(self, key):
        if not isinstance(key, slice) or key.step not in (None, 1):
            return str(self)[key]
        start, stop, _ = key.indices(len(self))
        out, pos = [], 0
        for text, tmpl in self.parts:
            lo, hi = max(start - pos, 0), min(stop - pos, len(text))
            if lo < hi:
                out.append((text[lo:hi], tmpl))
            pos += len(text)
        return ModelInput(out)

    def __reduce__(self):
        return ModelInput, (self.parts,)


def model_input(tokenizer, user_text: str, chat_template: bool = True) -> ModelInput:
    """The model input for one task prompt: ``user_text`` as data, inside the tokenizer's chat template
    (one user turn, generation prompt added) when ``chat_template`` is true and the tokenizer has one.

    The template's own text is found by rendering it around a placeholder; whatever the template
    does to the user text (LLaDA's template trims it) is kept, and is data.
    """
    from maskrl.models import chat_prompt

    if not chat_template or tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return ModelInput([(str(user_text), False)])
    rendered, frame = chat_prompt(tokenizer, user_text), chat_prompt(tokenizer, _SENTINEL)
    if frame.count(_SENTINEL) == 1:
        head, tail = frame.split(_SENTINEL)
        if rendered.startswith(head) and rendered.endswith(tail) and len(rendered) >= len(head) + len(tail):
            return ModelInput([(head, True), (rendered[len(head):len(rendered) - len(tail)], False), (tail, True)])
    warnings.warn("the tokenizer's chat template does not write the user text once as given; its special "
                  "tokens in the prompt's data are read as control tokens", stacklevel=2)
    return ModelInput.template(rendered)


def _special_strings(tokenizer) -> list[str]:
    """The tokenizer's special-token strings (added tokens marked special and ``all_special_tokens``),
    longest first."""
    found = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(tok, "special", False):
            found.add(str(tok))
    return sorted((t for t in found if t), key=len, reverse=True)


def data_token_ids(tokenizer, text: str) -> list[int]:
    """The ids of data text: no special tokens added, and special-token strings in it read as text."""
    return tokenizer(str(text), add_special_tokens=False, split_special_tokens=True)["input_ids"] if text else []


def _encode(tokenizer, text: str) -> list[int]:
    parts = getattr(text, "parts", None) or ((str(text), False),)
    if not any(tmpl for _, tmpl in parts):
        return data_token_ids(tokenizer, str(text))
    specials = _special_strings(tokenizer)
    if not specials:
        return tokenizer(str(text), add_special_tokens=False)["input_ids"]
    pattern = re.compile("|".join(re.escape(t) for t in specials))
    spans, pos = [], 0
    for part, tmpl in parts:
        if tmpl:
            spans.append((pos, pos + len(part)))
        pos += len(part)
    if all(any(a <= m.start() and m.end() <= b for a, b in spans) for m in pattern.finditer(str(text))):
        return tokenizer(str(text), add_special_tokens=False)["input_ids"]  # every special is the template's
    # some data spells a special token: the template's specials are ids, everything else is text
    out, run = [], ""
    for part, tmpl in parts:
        if not tmpl:
            run += part
            continue
        last = 0
        for m in pattern.finditer(part):
            out += data_token_ids(tokenizer, run + part[last:m.start()])
            out.append(tokenizer.convert_tokens_to_ids(m.group()))
            run, last = "", m.end()
        run += part[last:]
    return out + data_token_ids(tokenizer, run)


def prompt_token_ids(tokenizer, text: str, add_bos: bool = True) -> list[int]:
    """The ids one prompt is encoded to (:func:`encode_prompts`' rule: no special tokens but the bos
    token, prepended when the tokenizer has one and the text does not start with it).

    Special-token strings are control ids only where a template wrote them (a :class:`ModelInput`'s
    template parts); in a plain ``str`` and in a ``ModelInput``'s data they are text (the module
    docstring). Where no data spells a special token, the ids are those of encoding the whole text
    in one call."""
    ids = _encode(tokenizer, text)
    bos = getattr(tokenizer, "bos_token_id", None)
    if add_bos and bos is not None and (not ids or ids[0] != bos):
        ids = [bos] + ids
    return ids


def encode_prompts(tokenizer, texts: Sequence[str], add_bos: bool = True,
                   pad_id: int | None = None, empty_id: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenise prompts into a left-padded batch.

    Args:
        tokenizer: a transformers tokenizer (with ``bos_token_id`` if ``add_bos``).
        texts: N prompt strings (already chat-formatted when the model needs it: a :class:`ModelInput`
            from :func:`model_input`; a plain ``str`` is data, special-token strings in it are text).
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
