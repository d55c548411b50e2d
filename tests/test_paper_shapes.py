"""Every method at the papers' shapes (issue 19 item 6): one trainer step of every registered base
objective x every registered credit module, and the compositions of the shipped recipes, at
LLaDA-8B's rollout shape -- L = 256 in 8 blocks of 32 (docs/spec.md §1.2, d1 / LLaDA), LLaDA's vocabulary
(126464 ids, mask 126336, eos = pad 126081, end-of-turn 126348; docs/spec.md §1.1) -- under the fixed and the
threshold schedule, with completions that end in a tail of stop tokens.

The shipped recipes all decode one block of 16 tokens with no tail; this file exists to catch what
hides outside that shape. The model is LLaDA-shaped but narrow (hidden 16, one layer), with an
output layer made for the test: 32 "active" ids carry all the probability mass but ~2 %, which is
given to the stop ids at every masked position, so that sampled completions stop somewhere in the
middle and leave a tail (LLaDA's completions are mostly end-of-text tail). Rows of one group still
differ (temperature 1), so the advantages are not all zero.

Checked in every case: the rollout's multi-block contract (every position committed, blocks
committed strictly left to right per row, commits in all 8 blocks, the completion mask is "up to and
including the first stop token", a tail exists and stays out of every loss mask), the seams
(likelihood outputs ``[N, L]`` float32 -- each named tensor of a record such as ``spg_bounds``'
(ELBO, EUBO) pair -- finite where scored; token advantages ``[N, L]`` float32; loss terms' shapes and dtypes), and that
every loss, metric and updated parameter is finite.
"""
from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from maskrl.config import load_config
from maskrl.credit import CREDITS
from maskrl.models.adapter import ModelAdapter
from maskrl.objectives import OBJECTIVES
from maskrl.tasks.base import Example, Task
from maskrl.trainer import RLTrainer
from maskrl.types import LossTerm

V, MASK, EOS, EOT, BOS = 126464, 126336, 126081, 126348, 126080  # LLaDA-8B (models/loading.py, docs/spec.md §1.1)
L, BLOCK = 256, 32
N_BLOCKS = L // BLOCK
ACTIVE = [11 + 3001 * i for i in range(32)]  # ids spread over the vocabulary
ALPHABET = "abcdefghijklmnopqrstuvwxyz012345"


class IdTokenizer:
    """The part of a tokenizer the trainer uses, over LLaDA's id space: character ``ALPHABET[k]`` is
    id ``ACTIVE[k]``; every other id decodes to nothing (special or unused)."""

    bos_token_id, pad_token_id, eos_token_id, mask_token_id = BOS, EOS, EOS, MASK

    def __call__(self, text, add_special_tokens=False, split_special_tokens=True):
        return {"input_ids": [ACTIVE[ALPHABET.index(c)] for c in text]}  # no text spells a special id here

    def decode(self, ids, skip_special_tokens=True):
        where = {t: c for t, c in zip(ACTIVE, ALPHABET)}
        return "".join(where.get(int(t), "") for t in ids)


def parity_tag(tokenizer, ids, mask):
    """DTCA tagger for the test (``tagger: test_paper_shapes:parity_tag``): even ids NOUN, odd DET."""
    return [["NOUN" if int(t) % 2 == 0 else "DET" for t in row] for row in ids]


class OddLetters(Task):
    """Reward: share of odd letters in the decoded completion plus its length / L (where the tail starts
    varies between rows of a group, so the advantages are not all zero)."""

    name = "odd_letters"

    def reward(self, prompts, completions, **_):
        return [sum(ord(c) % 2 for c in t) / max(1, len(t)) + len(t) / L for t in completions]


PROMPT = "hello0"  # the one training prompt (its group: two completions); no padding, so column = position
STOP_AT, STOP_RAMP = 80, 40  # the stop signal grows from completion position 80 over 40 positions
COINS = 8  # completion positions 0..7: two letters equally likely (rows of a group differ)


def llada_shaped() -> ModelAdapter:
    """A LLaDA-shaped narrow model (vocabulary 126464, hidden 16, 1 layer, fp32, seed-fixed) whose
    completions read like LLaDA's: a hundred-odd content tokens, then a confident tail of stop tokens.

    A forward hook on the input embeddings (a public ``torch.nn.Module`` hook) adds ``e2 + r_j e1``
    at column ``j``, with ``r_j`` rising from 0 to 1 over completion positions STOP_AT ..
    STOP_AT + STOP_RAMP; this dominates the (init-scale) residual stream, so the final hidden state is
    ``4 (e2 + r_j e1) / |e2 + r_j e1|``. The output layer is zero except: a dominant letter (logit 18
    at r = 0, p ~ 0.97: the threshold schedule commits several tokens per step), five other letters
    (logit 12.5), eos along ``e1`` (it overtakes
    the letters near r ~ 0.4, i.e. around position 97, and is near-certain after) and end-of-turn
    about 4 nats below eos (p ~ 0.02 in the tail). At completion positions 0 .. COINS-1 the hook also
    adds ``0.3 e3``, along which a second letter ties with the dominant one (p ~ 0.49 each): a coin
    flip per position under both schedules, so the two completions of the group differ and the
    advantages are not all zero (the threshold schedule commits one such position per step). The other ~126k ids keep logit 0 (~0.2 % of the mass)."""
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
                      pad_token_id=EOS, bos_token_id=BOS, eos_token_id=EOS)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
    model.eval()
    d = cfg.hidden_size
    e1, e2, e3 = torch.eye(d)[0], torch.eye(d)[1], torch.eye(d)[2]
    p_len = len(PROMPT) + 1  # bos
    cols = torch.arange(512, dtype=torch.float32)
    ramp = ((cols - p_len - STOP_AT) / STOP_RAMP).clamp(0.0, 1.0)
    coin = ((cols >= p_len) & (cols < p_len + COINS)).float()  # completion positions 0 .. COINS-1
    signal = e2[None, :] + ramp[:, None] * e1[None, :] + 0.3 * coin[:, None] * e3[None, :]  # [512, d]

    def add_signal(_module, _args, out):  # out: [N, S, d] input embeddings
        return out + signal[: out.shape[1]].to(out.dtype)

    model.get_input_embeddings().register_forward_hook(add_signal)
    with torch.no_grad():
        w = model.get_output_embeddings().weight  # [V, d]; logit = w . h with h ~ 4 (e2 + r e1) / |.|
        w.zero_()
        w[ACTIVE[1]] = 4.5 * e2
        w[ACTIVE[0]] = 14.0 * e3  # ties with the dominant letter where the coin signal is on
        for i in range(2, 7):
            w[ACTIVE[i]] = 3.125 * e2
        w[EOS] = 7.5 * math.sqrt(2.0) * e1
        w[EOT] = 7.5 * math.sqrt(2.0) * e1 - 1.4 * e2
    return ModelAdapter(model=model, mask_id=MASK, eos_id=EOS, pad_id=EOS, stop_ids=(EOT,), family="llada",
                        tokenizer=IdTokenizer())


# ------------------------------------------------------------------------------------ cases
STATE_CREDITS = ("rldf_steps", "dtca")  # their terms score recorded states: the `state` likelihood only
CREDIT_FIELDS = {  # the shipped recipes' settings (configs/), pos table and tagger replaced by the test's
    "dps": "{name: dps, lam: 0.5, dps_target: confidence, dps_scope: all, dps_normalize: auto, clip: 2.0}",
    "dispo": "{name: dispo, z: 2, timing: late, power: 4.0, alpha_base: 1.0, alpha_step: 0.1, clip_eps: 0.5, "
             "p_mask_prompt: 0.15}",
    "rldf_steps": "{name: rldf_steps, k: 4, temperature: 1.0, keep_threshold: 0.6}",
    "dtca": "{name: dtca, coverage: 0.7, min_steps: 2, max_steps: 32, pos_credit: true, calibration: true, "
            "keep_threshold: 0.6, pos_weights: POS, tagger: 'test_paper_shapes:parity_tag'}",
}
SCHEDULES = ("fixed", "threshold")


def _cases():
    """(id, base, credit names, likelihood override or None, schedule). Base x (no credit + each credit),
    the schedule alternating along both axes so that every base and every credit module runs under
    both schedules; then the recipes' compositions (SML likelihood, SML + DPS, state likelihood)."""
    out = []
    bases, credits = OBJECTIVES.names(), [None] + CREDITS.names()
    assert set(CREDIT_FIELDS) == set(CREDITS.names()), "a credit module was registered: add its recipe fields here"
    for i, base in enumerate(bases):
        for j, credit in enumerate(credits):
            if credit in STATE_CREDITS and base == "spg":
                continue  # spg needs spg_bounds; tested below as a clear error
            lik = "{name: state, p_mask_prompt: 0.0}" if credit in STATE_CREDITS else None
            if base == "ebpo" and lik is None:  # its own block_elbo scores block models: tests/test_block_shapes.py
                lik = "{name: elbo}"
            if base == "spg":  # 4 block draws per row: with 1, both rows' drawn blocks can lie in the stop-token
                lik = "{name: spg_bounds, masking: block, draws: 4}"  # tail (unbiased, but no gradient at all)
            sched = SCHEDULES[(i + j) % 2]
            out.append(pytest.param(f"{base}+{credit or 'none'}-{sched}", base, (credit,) if credit else (), lik, sched,
                                    id=f"{base}+{credit or 'none'}-{sched}"))
    sml_grpo = "{name: stratified, k: 4, layout: random, full: 0.5, sml: 0.5, p_mask_prompt: 0.15}"
    sml_wd1 = "{name: stratified, k: 4, layout: random, full: 1.0, sml: 1.0, p_mask_prompt: 0.15}"
    recipes = [
        ("recipe-diffu_grpo+sml+dps-fixed", "diffu_grpo", ("dps",), sml_grpo, "fixed"),
        ("recipe-wd1+sml-threshold", "wd1", (), sml_wd1, "threshold"),
        ("recipe-wd1+sml+dps-fixed", "wd1", ("dps",), sml_wd1, "fixed"),
        ("recipe-demo-diffu_grpo+state-threshold", "diffu_grpo", (), "{name: state, p_mask_prompt: 0.15}", "threshold"),
    ]
    return out + [pytest.param(*r, id=r[0]) for r in recipes]


CASES = _cases()


def _config(tmp_path, base, credits, likelihood, schedule, overrides=()):
    table = tmp_path / "pos.json"
    table.write_text(json.dumps({"w_c": {"NOUN": 1.2, "DET": 0.8}}))
    entries = ", ".join(CREDIT_FIELDS[c].replace("POS", str(table)) for c in credits)
    sets = [f"output_dir={tmp_path / 'run'}", f"rollout.gen_length={L}", f"rollout.block_length={BLOCK}",
            f"rollout.steps={2 * N_BLOCKS}", "rollout.temperature=1.0", f"rollout.schedule={schedule}",
            "rollout.threshold=0.9", f"objective.name={base}", f"credit=[{entries}]", "train.prompts_per_step=1",
            "train.group_size=2", "train.inner_iterations=1", "train.lr=1e-3", "train.log_every=0",
            "train.micro_batch_size=2"]
    if likelihood:
        sets.append(f"likelihood={likelihood}")
    return load_config([], sets + list(overrides))


def _trainer(tmp_path, base, credits, likelihood, schedule):
    examples = [Example(id=0, prompt=PROMPT)]
    return RLTrainer(_config(tmp_path, base, credits, likelihood, schedule), llada_shaped(), OddLetters(), examples)


def _per_token(out):
    """The ``[N, L]`` tensors a likelihood returned: the tensor itself, or each named tensor of a
    :class:`~maskrl.likelihood.base.PerToken` record."""
    from maskrl.likelihood.base import PerToken, tensors_of

    assert isinstance(out, (torch.Tensor, PerToken)), f"likelihood returned {type(out).__name__}"
    return list(tensors_of(out).values())


def _check_rollout(ro, adapter, schedule):
    n = ro.batch_size
    assert ro.completion_ids.shape == (n, L) and ro.commit_step.shape == (n, L)
    assert bool((ro.commit_step >= 0).all()), "uncommitted positions"
    blocks = ro.commit_step.view(n, N_BLOCKS, BLOCK)
    first, last = blocks.min(-1).values, blocks.max(-1).values  # [n, 8]
    assert bool((last[:, :-1] < first[:, 1:]).all()), "blocks not decoded strictly left to right"
    if schedule == "fixed":
        assert ro.num_steps.tolist() == [2 * N_BLOCKS] * n
        assert bool((first[:, 1:] >= 2 * torch.arange(1, N_BLOCKS)).all())
    else:
        assert bool((ro.num_steps >= N_BLOCKS).all()) and bool((ro.num_steps <= L).all())
    # completion mask: up to and including the first stop token
    stop = adapter.is_stop(ro.completion_ids)
    assert torch.equal(ro.completion_mask, (stop.long().cumsum(-1) - stop.long()) == 0)
    assert ro.completion_mask[:, 0].all()
    tail = ~ro.completion_mask
    assert bool(tail.any()), "no completion ends before L: the stop-token tail is not exercised"
    return tail


def _check_term(t, who):
    m = t.rollout.batch_size
    assert isinstance(t, LossTerm), who
    assert t.advantages.shape == (m, L) and t.advantages.dtype == torch.float32, who
    assert t.mask.shape == (m, L) and t.mask.dtype == torch.bool, who
    assert bool(torch.isfinite(t.advantages).all()), who
    assert math.isfinite(float(t.weight)), who


@pytest.mark.slow
@pytest.mark.parametrize("name, base, credits, likelihood, schedule", CASES)
def test_one_trainer_step_at_llada_shapes(tmp_path, name, base, credits, likelihood, schedule):
    tr = _trainer(tmp_path, base, credits, likelihood, schedule)
    seen = {}
    collect, loglik = tr.collect, tr._loglik

    def record_collect(*a, **k):
        seen["batch"] = collect(*a, **k)
        return seen["batch"]

    def record_loglik(term, adapter, rollout, seed, need):
        out = loglik(term, adapter, rollout, seed, need)
        seen.setdefault("loglik", []).append((term.name, out, need))
        return out

    tr.collect, tr._loglik = record_collect, record_loglik
    before = [p.detach().clone() for p in tr.policy.model.parameters()]
    metrics = tr.step()

    batch = seen["batch"]
    ro, n = batch.rollout, batch.rollout.batch_size
    tail = _check_rollout(ro, tr.policy, schedule)
    # the base term's token advantages and loss mask (the credit seam's output)
    assert batch.advantages.shape == (n, L) and batch.advantages.dtype == torch.float32
    assert bool(torch.isfinite(batch.advantages).all())
    loss_mask = ro.completion_mask if batch.loss_mask is None else batch.loss_mask
    assert loss_mask.dtype == torch.bool and loss_mask.shape == (n, L)
    assert not bool((loss_mask & tail).any()), "the stop-token tail is in the base term's loss mask"
    if not credits or credits == ("dps",):  # the base term trains on tokens past the first block
        assert bool(loss_mask[:, BLOCK:].any())
    for t in batch.terms:
        _check_term(t, f"term {t.name}")
        if t.rollout.completion_ids.shape == ro.completion_ids.shape:
            assert not bool((t.mask & ~t.rollout.completion_mask).any()), f"term {t.name} trains past a stop token"
    # likelihood outputs: [N, L], float32 (each tensor of a record such as spg_bounds'), finite where scored
    assert seen.get("loglik"), "no likelihood was called"
    for name, out, need in seen["loglik"]:
        for x in _per_token(out):
            assert x.shape == need.shape, (name, tuple(x.shape))
            assert x.dtype == torch.float32, (name, x.dtype)
            assert bool(torch.isfinite(x[need]).all()), f"non-finite log-likelihood in term {name}"
    # every metric and every parameter finite; the step changed the model
    bad = {k: v for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)}
    assert not bad, bad
    assert metrics["step"] == 1
    after = list(tr.policy.model.parameters())
    assert all(bool(torch.isfinite(p).all()) for p in after)
    assert any(not torch.equal(p0, p1.detach()) for p0, p1 in zip(before, after)), "the step changed no parameter"


def test_every_base_and_credit_runs_under_both_schedules():
    for name in OBJECTIVES.names() + CREDITS.names():
        used = {c.values[4] for c in CASES if c.values[1] == name or name in c.values[2]}
        assert used == set(SCHEDULES), (name, used)


@pytest.mark.slow  # minutes of CPU: CI's slow stage (make test-slow)
@pytest.mark.parametrize("credit", STATE_CREDITS)
def test_state_credit_with_spg_is_a_clear_error(tmp_path, credit):
    with pytest.raises(ValueError, match="state"):
        _trainer(tmp_path, "spg", (credit,), None, "fixed").step()



def test_spg_bounds_stays_differentiable_when_the_drawn_blocks_hold_no_needed_position():
    """The small form of the spg failures above: L = 8 in 2 blocks, only block 0 needed (block 1 is
    the tail); for a mask seed whose block draw picks block 1 for every row, the output must still
    be part of the graph (zero, with a gradient of zero), as it is when something is scored."""
    from conftest import fresh_tiny

    from maskrl.likelihood import SPGBounds
    from maskrl.likelihood.base import tensors_of
    from maskrl.sampling import SamplerConfig, generate
    from maskrl.text import encode_prompts

    a = fresh_tiny()
    ids, mask = encode_prompts(a.tokenizer, ["ab", "cd"])
    ro = generate(a, ids, mask, SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=1.0),
                  generator=torch.Generator().manual_seed(0))
    need = torch.zeros_like(ro.completion_mask)
    need[:, :4] = True
    lik = SPGBounds(nodes=2, draws=1)
    def total(out):
        return sum(float(t.abs().sum()) for t in tensors_of(out).values())

    empty = [s for s in range(64) if not total(lik(a, ro, torch.Generator().manual_seed(s), need))]
    assert empty, "no seed in 0..63 draws block 1 for both rows"
    out = lik(a, ro, torch.Generator().manual_seed(empty[0]), need)
    assert all(t.requires_grad for t in tensors_of(out).values()), "nothing scored: the output is cut from the graph"
