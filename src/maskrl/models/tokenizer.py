"""Character-level tokenizer for the built-in tiny model (puzzles: Sudoku, Countdown).

Built with the ``tokenizers`` library and wrapped in ``PreTrainedTokenizerFast`` so it is saved and
loaded beside the model with ``save_pretrained`` / ``from_pretrained`` like any hub tokenizer.
"""
from __future__ import annotations

import string

from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = {"pad_token": "<|pad|>", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
                  "mask_token": "<|mask|>", "unk_token": "<|unk|>"}


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable ASCII character (plus newline and tab) and five special tokens.

    Ids: 0 pad, 1 bos, 2 eos, 3 mask, 4 unk, then the characters. Unknown characters map to unk.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    specials = [SPECIAL_TOKENS[k] for k in ("pad_token", "bos_token", "eos_token", "mask_token", "unk_token")]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # any char incl. newline (Oniguruma has no (?s))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIAL_TOKENS)
