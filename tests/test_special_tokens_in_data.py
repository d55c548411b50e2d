"""Special ids come only from the template, never from the data's text (issue 50 §2): a prompt or an
SFT target that spells ``<|mask|>``, ``<|eos|>``, ``<|pad|>`` (or any special token of the family's
tokenizer) is encoded as that text, for the tiny character tokenizer and the LLaDA / Dream layouts."""
import pickle
from collections import Counter
from types import SimpleNamespace

import pytest

from maskrl.models import chat_prompt
from maskrl.models.tokenizer import build_char_tokenizer
from maskrl.prompts import prompt_formatter
from maskrl.sft import encode_targets
from maskrl.text import ModelInput, encode_prompts, model_input, prompt_token_ids


@pytest.fixture(scope="module", params=["char", "llada", "dream"])
def tok(request):
    if request.param == "char":
        return build_char_tokenizer()
    from maskrl.models.standins import build_tokenizer

    return build_tokenizer(request.param, bpe_size=400)


def _specials(t) -> dict[int, str]:
    out = {i: str(a) for i, a in t.added_tokens_decoder.items() if a.special}
    out.update(zip(t.all_special_ids, t.all_special_tokens))
    return out


def _spelling(t) -> str:
    """Data text spelling every special token of ``t`` and the usual control-token names."""
    names = sorted(set(_specials(t).values()) | {"<|mask|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|eot_id|>"})
    return "Fill " + " and ".join(names) + " please<|mask|><|mask|>"


def test_data_spelling_special_tokens_gives_only_the_templates_special_ids(tok):
    specials = _specials(tok)
    control = {tok.mask_token_id, tok.eos_token_id, tok.pad_token_id}
    for chat in (True, False):
        clean = prompt_token_ids(tok, model_input(tok, "Fill this please", chat))
        dirty = prompt_token_ids(tok, model_input(tok, _spelling(tok), chat))
        # the special ids are exactly the template's (and the bos the encoder adds), in number and kind
        assert Counter(i for i in dirty if i in specials) == Counter(i for i in clean if i in specials)
        assert not control & set(dirty) - set(clean)
        # and the text is all there, as written
        text = chat_prompt(tok, _spelling(tok)) if chat else _spelling(tok)
        assert tok.decode(dirty).endswith(text) or tok.decode(dirty) == text


def test_a_clean_prompt_encodes_as_the_whole_text_in_one_call(tok):
    """Where no data spells a special token, nothing changes: the ids of the whole templated text."""
    for q in ("What is 2+2?", "  spaced\n\nlines  ", ""):
        text = chat_prompt(tok, q)
        want = tok(text, add_special_tokens=False)["input_ids"]
        if tok.bos_token_id is not None and want[:1] != [tok.bos_token_id]:
            want = [tok.bos_token_id] + want
        assert prompt_token_ids(tok, model_input(tok, q)) == want


def test_plain_strings_are_data_in_every_encoder(tok):
    mask = tok.mask_token_id
    ids, m = encode_prompts(tok, ["a <|mask|> b " + tok.mask_token, tok.eos_token + tok.pad_token])
    assert mask not in ids[m].tolist() and tok.eos_token_id not in ids[m].tolist()[1:]
    targets = encode_targets(tok, [tok.mask_token + tok.eos_token + "7"], 64, tok.eos_token_id)
    n = len(tok(tok.mask_token + tok.eos_token + "7", add_special_tokens=False, split_special_tokens=True)["input_ids"])
    assert mask not in targets[0].tolist() and tok.eos_token_id not in targets[0, :n].tolist()
    assert tok.decode(targets[0, :n].tolist()) == tok.mask_token + tok.eos_token + "7"


def test_the_run_formatter_marks_the_task_prompt_as_data(tok):
    fmt = prompt_formatter(SimpleNamespace(tokenizer=tok), True)
    text = fmt("x " + tok.mask_token)
    assert isinstance(text, ModelInput) and any(not tmpl and tok.mask_token in t for t, tmpl in text.parts)
    ids, m = encode_prompts(tok, [text])
    assert tok.mask_token_id not in ids[m].tolist()


def test_model_input_keeps_its_parts_through_slices_additions_and_pickling():
    t = ModelInput([("<s>", True), ("a<|mask|>b", False), ("</s>\n", True)])
    assert t == "<s>a<|mask|>b</s>\n"
    assert t[:-1].parts == (("<s>", True), ("a<|mask|>b", False), ("</s>", True))
    assert t[2:5].parts == ((">", True), ("a<", False))
    assert (t + " x").parts == t.parts + ((" x", False),)
    assert pickle.loads(pickle.dumps(t)).parts == t.parts
    assert ModelInput.template("<|eos|>").parts == (("<|eos|>", True),)


def test_a_template_that_trims_the_user_text_keeps_it_data():
    """LLaDA's published template trims the content; what it writes of the user text is still data."""
    t = build_char_tokenizer()
    t.chat_template = "<|bos|>[{{ messages[0]['content'] | trim }}]<|eos|>"
    mi = model_input(t, "  a<|pad|>  ")
    assert mi.parts == (("<|bos|>[", True), ("a<|pad|>", False), ("]<|eos|>", True))
    ids = prompt_token_ids(t, mi)
    assert ids.count(t.pad_token_id) == 0 and ids.count(t.eos_token_id) == 1 and ids[-1] == t.eos_token_id
