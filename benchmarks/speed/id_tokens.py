"""Token-id helpers shared by the speed scripts that run a random model outside maskrl's environment too
(``gpu_grid.py``, ``d1_step.py``): they import nothing from maskrl, so another project's environment
(transformers 4.49 for d1's trainer) can load them."""
from __future__ import annotations

import zlib

import torch


def id_tokenizer(vocab: int, mask_id: int, eos_id: int):
    """A word-level tokenizer with one entry ``<i>`` per model id (``<mask>`` at ``mask_id``, ``<eos>`` at
    ``eos_id``, also the pad token), so that prompts are exact id lists and every id is a candidate."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = {i: f"<{i}>" for i in range(vocab)} | {mask_id: "<mask>", eos_id: "<eos>"}
    tok = Tokenizer(models.WordLevel({t: i for i, t in names.items()}, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>", mask_token="<mask>")


def prompt_texts(n: int, length: int, vocab_high: int, seed: int) -> list[str]:
    """``n`` prompts of ``length`` random ids in ``[10, vocab_high)`` written as :func:`id_tokenizer` text."""
    g = torch.Generator().manual_seed(seed)
    return [" ".join(f"<{i}>" for i in row) for row in torch.randint(10, vocab_high, (n, length), generator=g).tolist()]


def hash_reward(completions) -> list[float]:
    """Reward 0 or 1 from a CRC-32 of each completion's text: random, so advantages are non-zero."""
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]
