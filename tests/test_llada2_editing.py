"""LLaDA2.1's token-to-token editing (``rollout.edit_threshold``, :mod:`maskrl.sampling.edit`) and LLaDA2's eos stop
on the one block sampler: against the tokens and forward counts of the family's own ``generate()``
(``tests/data/llada2_tiny/generate_edit.json``, recorded by ``benchmarks/references/llada2_reference.py`` from
ZHZisZZ/dllm ca17675's copies of LLaDA2.1's and LLaDA2.0's code) in their greedy limit, against a slow loop
restatement of the rule (tokens, commit steps, commit probabilities, step counts), batch against single rows,
the block cache against none, the rule's hand values, and the refusals (docs/sampler.md, "LLaDA2.x")."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from maskrl.models import load
from maskrl.sampling import SamplerConfig, generate
from maskrl.sampling.edit import edit_block_done, select_edits
from test_sampling_sdar import _noise

DATA = Path(__file__).resolve().parent / "data" / "llada2_tiny"
RECORD = json.loads((DATA / "generate_edit.json").read_text())
B, L = 4, 12


def _adapter(eos_id: int | None = None):
    adapter = load(DATA)
    adapter.block_size = B
    if eos_id is not None:
        adapter.eos_id = eos_id
    return adapter


def _config(settings: dict, cache: str = "none", edit: bool = True) -> SamplerConfig:
    """The sampler settings of a recorded ``generate()`` call: LLaDA2.1's one transfer per step is the dynamic
    rule with ``steps`` = one per position (count 1); LLaDA2.0 always ends a row after a block holding its eos."""
    v21 = "editing_threshold" in settings
    return SamplerConfig(gen_length=L, block_length=B, steps=L, schedule="fixed", remasking="low_confidence_dynamic",
                         threshold=settings["threshold"], temperature=0.0, cache=cache,
                         edit_threshold=settings["editing_threshold"] if v21 and edit else None,
                         max_post_steps=settings.get("max_post_steps", 16),
                         early_stop=settings["eos_early_stop"] if v21 else True)


class EditMargins:
    """Observer of one row (``prompt``): its smallest decision margin over its steps -- the top-two logit gap at
    every block position (the candidate decides both commits and edits), each mask's confidence against
    ``threshold``, each committed position's against ``edit_threshold`` -- and whether the family's code would
    have proposed ``[M]`` at a block position (``proposes_mask``: their candidates include it, and an edit to
    ``[M]`` re-masks the position; maskrl never proposes it), from a full forward of the pre-step state."""

    def __init__(self, adapter, prompt: list[int], threshold: float, edit_threshold: float | None):
        self.adapter, self.threshold, self.edit, self.low = adapter, threshold, edit_threshold, {}
        self.state = torch.tensor([prompt + [adapter.mask_id] * L])
        self.proposes_mask = False

    def on_step(self, view) -> None:
        with torch.no_grad():
            raw = self.adapter.logits(self.state)[0, -L:][view.covered[0]]
        self.proposes_mask |= bool((raw.argmax(-1) == self.adapter.mask_id).any())
        self.state[0, -L:] = view.tokens[0]
        z = view.logits.float().detach()
        top2 = z.topk(2, dim=-1).values
        conf = torch.softmax(z, -1).max(-1).values
        owner = view.covered.nonzero()[:, 0]
        masked = view.masked[view.covered]
        for i, row in enumerate(view.rows.tolist()):
            mine = owner == i
            m = [float((top2[:, 0] - top2[:, 1])[mine].min())]
            if (mine & masked).any():
                m.append(float((conf[mine & masked] - self.threshold).abs().min()))
            if self.edit is not None and (mine & ~masked).any():
                m.append(float((conf[mine & ~masked] - self.edit).abs().min()))
            self.low[row] = min([self.low.get(row, 9.0)] + m)

    def result(self) -> dict:
        return {}


def _run(adapter, prompt: list[int], cfg: SamplerConfig, observers=()):
    ids = torch.tensor([prompt])
    return generate(adapter, ids, torch.ones_like(ids, dtype=torch.bool), cfg, observers=observers)


@pytest.mark.numerics
@pytest.mark.parametrize("cache", ["none", "block"])
@pytest.mark.parametrize("name", sorted(RECORD))
def test_block_sampler_equals_the_familys_generate(name, cache):
    """Tokens left of maskrl's cut last block (their return ends at the first eos: there maskrl's
    completion_mask ends too), and, where no block is cut (P mod 4 = 0), maskrl's step count = their number
    of forwards (one per step, post steps and the eos stop included); on the rows clear of float noise where
    their code never proposes ``[M]`` (:class:`EditMargins`)."""
    rec = RECORD[name]
    s = rec["settings"]
    adapter, cfg = _adapter(s["eos_id"]), _config(s, cache)
    checked = counted = 0
    for case in rec["cases"]:
        prompt, want = case["prompt"], case["generated"]
        margins = EditMargins(adapter, prompt, cfg.threshold, cfg.edit_threshold)
        got = _run(adapter, prompt, cfg, [margins])
        if margins.low[0] <= _noise(adapter, torch.tensor([prompt])) or margins.proposes_mask:
            continue
        cut = L - len(prompt) % B
        comp = got.completion_ids[0].tolist()
        assert comp[:min(cut, len(want))] == want[:cut], (name, prompt)
        if len(want) < L:  # their return stopped at an eos
            assert want[-1] == s["eos_id"] and got.completion_mask[0].sum() == len(want)
        if len(prompt) % B == 0:
            assert int(got.num_steps[0]) == case["forwards"], (name, prompt)
            counted += 1
        checked += 1
    print(f"{name} {cache}: {checked} rows compared, {counted} step counts")
    assert 2 * checked > len(rec["cases"]) and counted >= 2, f"{name}: {checked} rows clear of float noise, {counted} counted"


def test_the_recorded_settings_edit_and_stop():
    """The record exercises what it is for: edits change tokens (the same decoding without editing differs on
    some row), and the eos settings end rows early."""
    for name in ("edit_0.5", "edit_0.0"):
        s = RECORD[name]["settings"]
        adapter = _adapter(s["eos_id"])
        differ = sum(_run(adapter, c["prompt"], _config(s, edit=False)).completion_ids[0].tolist()[:len(c["generated"])]
                     != c["generated"] for c in RECORD[name]["cases"])
        assert differ >= 1, name
    for name in ("edit_0.5_eos_early_stop", "llada20_eos_stop"):
        assert sum(len(c["generated"]) < L for c in RECORD[name]["cases"]) >= 2, name


# ------------------------------------------------------------------ a slow, obvious restatement
def loop_reference(adapter, prompt: list[int], cfg: SamplerConfig) -> tuple[list[int], list[int], list[float], int]:
    """LLaDA2.1's loop, one row, greedy, one full block-causal forward per step: per block (counted from the
    first prompt token), while it runs: count a post step if it holds no mask, stop once post steps exceed
    ``max_post_steps``; commit the masks with confidence > threshold (else the most confident one), edit every
    committed completion position whose argmax differs with confidence > edit_threshold; stop after a step
    that started with no mask and edited nothing. Early stop after a block when the completion holds eos.
    Returns (tokens, commit steps, commit probabilities, steps)."""
    P, M = len(prompt), adapter.mask_id
    x = list(prompt) + [M] * L
    step_of, prob_of, step = [-1] * L, [0.0] * L, 0
    off = P % B
    for j in range(math.ceil((off + L) / B)):
        lo, hi, post = max(j * B - off, 0), min((j + 1) * B - off, L), 0
        while True:
            masked = [i for i in range(lo, hi) if x[P + i] == M]
            post += not masked
            if post > cfg.max_post_steps:
                break
            with torch.no_grad():
                z = adapter.logits(torch.tensor([x]))[0].float()
            z[:, M] = float("-inf")
            p = torch.softmax(z, -1)
            cand = {i: int(z[P + i].argmax()) for i in range(lo, hi)}
            conf = {i: float(p[P + i, cand[i]]) for i in range(lo, hi)}
            writes = [i for i in masked if conf[i] > cfg.threshold]
            if masked and not writes:
                writes = [max(masked, key=lambda i: (conf[i], -i))]
            edits = [i for i in range(lo, hi) if x[P + i] != M and conf[i] > cfg.edit_threshold and cand[i] != x[P + i]]
            for i in writes + edits:
                x[P + i], step_of[i], prob_of[i] = cand[i], step, conf[i]
            step += 1
            if not masked and not edits:
                break
        if cfg.early_stop and adapter.eos_id in x[P:P + hi]:
            for i in range(hi, L):
                x[P + i], step_of[i], prob_of[i] = adapter.pad_id, step - 1, 1.0
            break
    return x[P:], step_of, prob_of, step


PROMPTS = [[20, 27, 61, 30, 20], [56, 6, 88, 68], [33, 58, 79], [5, 9, 71, 2, 40, 11], [7, 7],
           [60, 3, 18, 44, 91, 12, 70, 30]]


@pytest.mark.numerics
@pytest.mark.parametrize("edit,post,eos", [(0.5, 4, None), (0.0, 3, None), (0.1, 0, None), (0.2, 2, 7)])
def test_sampler_equals_the_loop_reference(edit, post, eos):
    adapter = _adapter(eos)
    cfg = SamplerConfig(gen_length=L, block_length=B, steps=L, schedule="fixed", remasking="low_confidence_dynamic",
                        threshold=0.3, temperature=0.0, edit_threshold=edit, max_post_steps=post,
                        early_stop=eos is not None)
    edited = stopped = checked = 0
    for prompt in PROMPTS:
        tokens, steps, probs, n = loop_reference(adapter, prompt, cfg)
        margins = EditMargins(adapter, prompt, cfg.threshold, cfg.edit_threshold)
        got = _run(adapter, prompt, cfg, [margins])
        if margins.low[0] <= _noise(adapter, torch.tensor([prompt])):
            continue  # a decision within float noise: the two forwards may round it apart
        checked += 1
        assert got.completion_ids[0].tolist() == tokens and got.commit_step[0].tolist() == steps, prompt
        assert int(got.num_steps[0]) == n
        torch.testing.assert_close(got.commit_prob[0], torch.tensor(probs), rtol=0,
                                   atol=64 * torch.finfo(torch.float32).eps)
        plain = _run(adapter, prompt, SamplerConfig(**{**cfg.__dict__, "edit_threshold": None}))
        edited += plain.completion_ids[0].tolist() != tokens or int(plain.num_steps[0]) != n
        stopped += adapter.pad_id in tokens
    assert 2 * checked > len(PROMPTS) and edited >= 1  # editing changed something: the comparison can fail
    assert eos is None or stopped >= 1


def _left_pad(adapter, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.tensor([[adapter.pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
    return ids, mask


@pytest.mark.numerics
@pytest.mark.parametrize("cache", ["none", "block"])
@pytest.mark.parametrize("eos", [None, 7])
def test_batch_equals_single_rows_and_cache_equals_none(cache, eos):
    """Rows finish their blocks independently (post steps, early stop): a left-padded batch decodes, records
    and counts what each row alone does, with the exact block cache as without it."""
    adapter = _adapter(eos)
    cfg = SamplerConfig(gen_length=L, block_length=B, steps=L, schedule="fixed", remasking="low_confidence_dynamic",
                        threshold=0.3, temperature=0.0, edit_threshold=0.2, max_post_steps=3, cache=cache,
                        early_stop=eos is not None)
    batch = generate(adapter, *_left_pad(adapter, PROMPTS), cfg)
    ref = generate(adapter, *_left_pad(adapter, PROMPTS), SamplerConfig(**{**cfg.__dict__, "cache": "none"}))
    assert len(set(batch.num_steps.tolist())) > 1  # rows take different step counts
    assert eos is None or 0 < int((~batch.completion_mask.all(-1)).sum()) < len(PROMPTS)  # some rows stop early
    assert torch.equal(batch.completion_ids, ref.completion_ids) and torch.equal(batch.commit_step, ref.commit_step)
    for i, prompt in enumerate(PROMPTS):
        one = _run(adapter, prompt, cfg)
        assert torch.equal(one.completion_ids[0], batch.completion_ids[i]), prompt
        assert torch.equal(one.commit_step[0], batch.commit_step[i]) and one.num_steps[0] == batch.num_steps[i], prompt
        torch.testing.assert_close(one.commit_prob[0], batch.commit_prob[i], rtol=0,
                                   atol=64 * torch.finfo(torch.float32).eps)


@pytest.mark.numerics
def test_sampled_editing_with_the_block_cache_equals_none():
    """At τ > 0 (candidates drawn at every block position, committed ones too) the block cache draws and
    decides what the full forwards do; editing changes the step counts against the same draws without it."""
    adapter = _adapter(7)
    cfg = SamplerConfig(gen_length=L, block_length=B, steps=L, schedule="fixed", remasking="low_confidence_dynamic",
                        threshold=0.3, temperature=1.0, edit_threshold=0.2, max_post_steps=3, early_stop=True)
    runs = {c: generate(adapter, *_left_pad(adapter, PROMPTS), SamplerConfig(**{**cfg.__dict__, "cache": c}),
                        generator=torch.Generator().manual_seed(3)) for c in ("none", "block")}
    assert torch.equal(runs["none"].completion_ids, runs["block"].completion_ids)
    assert torch.equal(runs["none"].commit_step, runs["block"].commit_step)
    plain = generate(adapter, *_left_pad(adapter, PROMPTS), SamplerConfig(**{**cfg.__dict__, "edit_threshold": None}),
                     generator=torch.Generator().manual_seed(3))
    assert not torch.equal(plain.num_steps, runs["none"].num_steps)


# ------------------------------------------------------------------ the rule's pieces by hand
def test_select_edits_by_hand():
    cand = torch.tensor([[5, 6, 7, 8]])
    conf = torch.tensor([[0.9, 0.95, 0.5, 0.99]])
    current = torch.tensor([[5, 1, 2, 3]])
    editable = torch.tensor([[True, True, True, False]])
    # 0: same token; 1: changed, 0.95 > 0.9; 2: below; 3: not editable (a mask or a prompt token)
    assert select_edits(cand, conf, current, editable, 0.9).tolist() == [[False, True, False, False]]
    assert select_edits(cand, conf, current, editable, 0.95).tolist() == [[False, False, False, False]]  # strict


def test_edit_block_done_by_hand():
    t, f = True, False
    had = torch.tensor([t, t, f, f, f])
    filled = torch.tensor([f, t, t, t, t])
    edited = torch.tensor([f, t, f, t, t])
    post = torch.tensor([0, 0, 1, 1, 2])
    # masks left: on; filled now: on while post steps remain; a post step without edits: done; post steps spent: done
    assert edit_block_done(had, filled, edited, post, 2).tolist() == [f, f, t, f, t]
    assert edit_block_done(had, filled, edited, post, 0).tolist() == [f, t, t, t, t]


def test_refusals():
    with pytest.raises(ValueError, match="edit_threshold.*block-diffusion strategy"):
        SamplerConfig(gen_length=8, block_length=4, steps=8, schedule="threshold", edit_threshold=0.5)
    with pytest.raises(ValueError, match=r"edit_threshold.*\[0, 1\]"):
        SamplerConfig(gen_length=8, block_length=4, steps=8, remasking="low_confidence_dynamic", edit_threshold=1.5)
    with pytest.raises(ValueError, match="max_post_steps"):
        SamplerConfig(gen_length=8, block_length=4, steps=8, remasking="low_confidence_dynamic", max_post_steps=-1)
    with pytest.raises(ValueError, match="sub_block_length"):
        SamplerConfig(gen_length=8, block_length=4, steps=8, remasking="low_confidence_dynamic", edit_threshold=0.5,
                      sub_block_length=2)
    adapter = _adapter()
    adapter.block_size = None
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=8, remasking="low_confidence_dynamic", edit_threshold=0.5)
    with pytest.raises(ValueError, match="edit_threshold.*block-diffusion model"):
        _run(adapter, [1, 2, 3], cfg)


# ------------------------------------------------------------------ who reads edited rollouts
EDIT_RUN = ["rollout.remasking=low_confidence_dynamic", "rollout.edit_threshold=0.5", "rollout.temperature=0.9"]


@pytest.mark.parametrize("extra,who", [
    (["likelihood={name: state}"], "likelihood 'state'"), (["objective={name: tracerl}"], "likelihood 'state'"),
    (["objective={name: rldf}"], "likelihood 'state'"), (["credit=[{name: dps}]"], "credit module 'dps'"),
    (["credit=[{name: dispo}]"], "credit module 'dispo'"), (["credit=[{name: dtca}]"], "credit module 'dtca'"),
    (["credit=[{name: rldf_steps}]"], "credit module 'rldf_steps'"), (["rollout.mismatch_every=2"], "mismatch_every"),
])
def test_the_config_refuses_readers_of_states_on_edited_rollouts(extra, who):
    from maskrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=rf"rollout\.edit_threshold: .*last write.*{who}"):
        load_config([], EDIT_RUN + extra)
    load_config([], [item for item in EDIT_RUN if "edit_threshold" not in item] + extra)  # without editing: taken


@pytest.mark.parametrize("extra", [[], ["objective={name: wd1}"], ["objective={name: spg}"],
                                   ["objective={name: ebpo}", "model.tiny.block_size=4"],  # block_elbo: block models
                                   ["likelihood={name: stratified}"], ["likelihood={name: elbo}"]])
def test_readers_of_the_final_completion_take_edited_rollouts(extra):
    from maskrl.config import load_config

    assert load_config([], EDIT_RUN + extra).rollout.edit_threshold == 0.5


def test_the_state_likelihood_refuses_an_edited_rollout_passed_directly():
    from maskrl.likelihood.state import state

    adapter = _adapter()
    cfg = SamplerConfig(gen_length=L, block_length=B, steps=L, remasking="low_confidence_dynamic", threshold=0.3,
                        edit_threshold=0.5)
    ro = _run(adapter, PROMPTS[0], cfg)
    with pytest.raises(ValueError, match="likelihood 'state': the rollout was sampled with edit_threshold"):
        state(adapter, ro, torch.Generator().manual_seed(0))
