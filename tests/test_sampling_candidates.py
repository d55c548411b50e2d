"""The sampler commits only what it should (docs/spec.md §1.1-1.2):

- under ``suppress_eos`` a stop candidate (eos or any stop id) is committed only when no other
  candidate is left in the block, under the fixed and the threshold schedule, with and without caches;
- ids with no tokenizer entry (padded output-layer rows, as Qwen2 / Dream have) are never candidates:
  not in the proposal, not in the observers' view, not in DiSPO's fillings;
- special ids that collide (the mask id equal to eos, pad or a stop id) are refused at construction
  and at load;
- a tokenizer without a pad token pads with the model's pad id, or batching says what is missing.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from maskrl.credit.dispo import DiSPO
from maskrl.models import build_char_tokenizer, load
from maskrl.models.adapter import ModelAdapter
from maskrl.sampling import SamplerConfig, StepView, generate, rollout_mismatch
from maskrl.text import encode_prompts

PROMPTS = ["abc", "hello world", "x", "countdown 1,2,3"]


# ------------------------------------------------------------------------------- suppress_eos
class Scripted(torch.nn.Module):
    """Logits that depend on the completion position only: ``table [L, V]`` at the completion columns,
    whatever the tokens (no decoder forward: the sampler's full-logits path)."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # the adapter's device / dtype

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
        n, s = input_ids.shape
        out = torch.zeros(n, s, self.table.shape[1])
        out[:, s - self.table.shape[0]:] = self.table
        return SimpleNamespace(logits=out)


V, EOS, MASK, STOP = 12, 2, 3, 11  # ids 4 .. 10 letters, 11 an extra stop id


def scripted_adapter() -> ModelAdapter:
    """L = 8: eos at position 0 (p = e^10 / (e^10 + 10) = 0.9995) and the stop id 11 at position 4
    (p 0.9988); letters at 1, 2 with p 0.96, 0.95; letters at 3, 5, 6, 7 below any threshold >= 0.9,
    in that order of confidence (every other id has logit 0; [M] is never a candidate)."""
    table = torch.zeros(8, V)
    table[0, EOS], table[4, STOP] = 10.0, 9.0
    table[1, 4], table[2, 5] = 5.5, 5.3
    for pos, letter, a in ((3, 6, 4.0), (5, 7, 3.7), (6, 8, 3.4), (7, 9, 3.1)):  # p 0.85, 0.80, 0.75, 0.69
        table[pos, letter] = a
    return ModelAdapter(model=Scripted(table), mask_id=MASK, eos_id=EOS, pad_id=0, stop_ids=(STOP,))


@pytest.mark.parametrize("schedule, suppress, want", [
    ("threshold", False, [0, 0, 0, 1, 0, 2, 3, 4]),  # confident stops go first
    ("threshold", True, [4, 0, 0, 1, 4, 2, 3, 4]),  # ... only with the block's last other candidate
    ("fixed", True, [6, 0, 1, 2, 7, 3, 4, 5]),  # one per step, by confidence, stops last
])
def test_stop_candidates_wait_for_the_rest_of_the_block_by_hand(schedule, suppress, want):
    ad = scripted_adapter()
    kw = dict(schedule="threshold", threshold=0.9) if schedule == "threshold" else dict(steps=8)
    ro = generate(ad, torch.tensor([[4, 5]]), torch.ones(1, 2, dtype=torch.bool),
                  SamplerConfig(gen_length=8, block_length=8, suppress_eos=suppress, **kw))
    assert ro.commit_step[0].tolist() == want
    assert ro.completion_ids[0, 0] == EOS and ro.completion_ids[0, 4] == STOP


@pytest.mark.parametrize("kw", [
    dict(schedule="dream", remasking="origin"),
    *(dict(schedule=s, remasking=r, alg_temp=0.5) for s in ("fixed", "dream")
      for r in ("maskgit_plus", "topk_margin", "entropy")),
])
@pytest.mark.parametrize("block_length", [4, 8])
def test_stop_candidates_wait_under_dreams_random_position_draws(kw, block_length):
    """Dream's ``origin`` reveal and ``alg_temp`` position draw are random, yet a stop candidate is
    committed only when no other candidate is left in the block (the scripted logits depend on the
    position only, so a greedy position's candidate never changes: every letter of a block is committed
    no later than any of its stops), and every position is committed."""
    ad = scripted_adapter()
    cfg = SamplerConfig(gen_length=8, block_length=block_length, steps=8, suppress_eos=True, **kw)
    for seed in range(6):
        ro = generate(ad, torch.tensor([[4, 5]]), torch.ones(1, 2, dtype=torch.bool), cfg,
                      generator=torch.Generator().manual_seed(seed))
        step, tok = ro.commit_step[0].view(-1, block_length), ro.completion_ids[0].view(-1, block_length)
        stops = ad.is_stop(tok)
        for blk in range(step.shape[0]):
            if stops[blk].any() and (~stops[blk]).any():
                assert step[blk][~stops[blk]].max() <= step[blk][stops[blk]].min(), (seed, ro.commit_step.tolist())


class HoldReference:
    """Observer (block scope, no exact logits: its view holds the step's own logits) that recomputes
    each step's commits with a slow rule -- candidates by argmax, or by Gumbel-max on a copy of the
    sampler's generator (one ``[m, V]`` float64 draw per step over the block's ``m`` still-masked
    positions, as the sampler) -- and checks them:
    the threshold schedule's top-1 + confident, or the fixed schedule's top-k, stops ranked last, and
    no stop committed while a non-stop candidate of the block stays uncommitted."""

    def __init__(self, adapter, config, seed):
        self.ad, self.cfg = adapter, config
        self.gen = torch.Generator().manual_seed(seed) if config.temperature > 0 else None
        self.checked = self.held = 0
        self.block_steps = {}

    def on_step(self, v: StepView):
        b, L = self.cfg.block_length, v.covered.shape[1]
        vidx = v.covered.flatten().long().cumsum(0).view(v.covered.shape) - 1
        pos = v.block_start[:, None] + torch.arange(b)
        logits = v.logits[vidx.gather(1, pos)]  # [n, b, V], the step's own
        if self.gen is None:
            cand = logits.argmax(-1)
        else:  # drawn at the still-masked positions only, row-major, as the sampler draws
            drawn = v.masked.gather(1, pos)
            u = torch.rand(logits[drawn].shape, generator=self.gen, dtype=torch.float64)
            cand = torch.full(drawn.shape, -1, dtype=torch.long)
            cand[drawn] = (logits[drawn].double() / self.cfg.temperature - torch.log(-torch.log(u))).argmax(-1)
        prob = torch.softmax(logits.float(), -1).gather(-1, cand.clamp(min=0)[..., None]).squeeze(-1)  # as committed
        for r in range(v.rows.numel()):
            key = (int(v.rows[r]), int(v.block_start[r]))
            j = self.block_steps.get(key, 0)
            self.block_steps[key] = j + 1
            elig = [bool(v.masked[r, p]) for p in pos[r].tolist()]
            stop = [bool(self.ad.is_stop(cand[r, i])) for i in range(b)]
            score = [float(prob[r, i] - 2.0) if stop[i] else float(prob[r, i]) for i in range(b)]  # float32 scores
            order = sorted((i for i in range(b) if elig[i]), key=lambda i: (stop[i], -score[i]))
            if self.cfg.schedule == "threshold":
                plain = {order[0]} | {i for i in order if prob[r, i] >= self.cfg.threshold}
            else:
                plain = set(order[:self.cfg.commits_per_step()[j]])
            take = plain
            if any(not stop[i] and i not in plain for i in order):
                take = {i for i in plain if not stop[i]}
                self.held += len(plain) - len(take)
            got = {i for i in range(b) if v.committed[r, int(pos[r, i])]}
            assert got == take, (v.step, int(v.rows[r]), sorted(got), sorted(take))
            assert (v.committed[r] & ~torch.isin(torch.arange(L), pos[r])).sum() == 0
            self.checked += 1

    def result(self):
        return {}


def _eos_prone(tiny):
    """The tiny model made confident (output layer x20), with eos and a second stop id (50) boosted and
    a fixed random signal added to the input embeddings per query column (a public forward hook), so
    that some positions of a block prefer a stop and others a letter: confident stops in the middle
    of blocks. (A window forward's columns get the signal of their offset in the window; the rule is
    checked on each step's own logits, whatever they are.)"""
    sig = torch.randn(512, tiny.model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    tiny.model.get_input_embeddings().register_forward_hook(lambda _m, _a, out: out + sig[: out.shape[1]])
    with torch.no_grad():
        w = tiny.model.get_output_embeddings().weight
        w.mul_(20.0)
        w[tiny.eos_id] *= 2.0
        w[50] = 2.0 * w[51]
    tiny.stop_ids = (50,)
    return tiny


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("schedule", ["threshold", "fixed"])
@pytest.mark.parametrize("tau", [0.0, 1.0])
def test_suppress_eos_rule_at_every_step_with_and_without_caches(tiny, cache, schedule, tau):
    ad = _eos_prone(tiny)
    ids, mask = encode_prompts(ad.tokenizer, PROMPTS)
    kw = dict(schedule="threshold", threshold=0.5) if schedule == "threshold" else dict(steps=16)
    cfg = SamplerConfig(gen_length=32, block_length=8, cache=cache, temperature=tau, suppress_eos=True, **kw)
    ref = HoldReference(ad, cfg, seed=5)
    ro = generate(ad, ids, mask, cfg, generator=torch.Generator().manual_seed(5), observers=[ref])
    assert ref.checked == int(ro.num_steps.sum())
    if schedule == "threshold":
        assert ref.held > 0  # confident stops were held back: the rule binds here
    plain = generate(ad, ids, mask, cfg, generator=torch.Generator().manual_seed(5))
    assert torch.equal(plain.commit_step, ro.commit_step)  # the reference observer changes nothing


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_suppress_eos_threshold_at_the_papers_shape(tiny, cache):
    """L 256 in blocks of 32, threshold 0.9, greedy and sampled: the rule holds at every step, binds
    (confident stops are held back), and the completions end in stop tokens."""
    ad = _eos_prone(tiny)
    ids, mask = encode_prompts(ad.tokenizer, PROMPTS)
    for tau in (0.0, 1.0):
        cfg = SamplerConfig(gen_length=256, block_length=32, schedule="threshold", threshold=0.9, temperature=tau,
                            suppress_eos=True, cache=cache)
        ref = HoldReference(ad, cfg, seed=3)
        ro = generate(ad, ids, mask, cfg, generator=torch.Generator().manual_seed(3), observers=[ref])
        assert ref.checked == int(ro.num_steps.sum()) and ref.held > 0
        assert ad.is_stop(ro.completion_ids).any(-1).all()


# ------------------------------------------------------------------------------- ids with no tokenizer entry
EXTRA = 6  # output rows beyond the tokenizer


def padded_vocab():
    """A tiny Llama whose output layer has ``EXTRA`` rows beyond its tokenizer (ids len(tok) ..), made
    the most likely ids at most positions (they would win every argmax if they were candidates)."""
    tok = build_char_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok) + EXTRA, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        w = model.get_output_embeddings().weight
        w.mul_(10.0)
        w[len(tok):] = 4.0 * w[10:10 + EXTRA]
    return ModelAdapter(model=model, mask_id=tok.mask_token_id, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                        tokenizer=tok)


class ViewCheck:
    """Observer asking for every masked position: records whether ids without a tokenizer entry are
    ever finite in its view."""

    logit_scope = "masked"

    def __init__(self, count):
        self.count, self.finite = count, []

    def on_step(self, v):
        self.finite.append(bool(torch.isfinite(v.logits[:, self.count:]).any()))

    def result(self):
        return {}


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("kw", [dict(steps=8, temperature=0.0), dict(steps=8, temperature=1.5),
                                dict(schedule="threshold", threshold=0.3, temperature=1.0)])
def test_ids_without_a_tokenizer_entry_are_never_candidates(cache, kw):
    ad = padded_vocab()
    count = len(ad.tokenizer)
    assert ad.token_count == count < ad.model.config.vocab_size
    ids, mask = encode_prompts(ad.tokenizer, PROMPTS)
    full = ad.logits(torch.cat([ids, torch.full((4, 16), ad.mask_id)], 1))[:, ids.shape[1]:]
    assert (full.argmax(-1) >= count).float().mean() > 0.5  # they would win most argmaxes
    view = ViewCheck(count)
    ro = generate(ad, ids, mask, SamplerConfig(gen_length=16, block_length=4, cache=cache, **kw),
                  generator=torch.Generator().manual_seed(0), observers=[view])
    assert (ro.completion_ids < count).all()
    assert view.finite and not any(view.finite)


@pytest.mark.numerics
def test_commit_prob_is_over_the_tokenizer_ids_only():
    """Replay each commit state with a full forward: commit_prob = softmax over the ids with a tokenizer
    entry ([M] excluded) of the committed token; rollout_mismatch sees the same distribution."""
    ad = padded_vocab()
    count = len(ad.tokenizer)
    ids, mask = encode_prompts(ad.tokenizer, PROMPTS[:2])
    ro = generate(ad, ids, mask, SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=1.0),
                  generator=torch.Generator().manual_seed(1))
    P = ids.shape[1]
    for t in range(4):
        state = torch.where(ro.commit_step >= t, ad.mask_id, ro.completion_ids)
        logits = ad.logits(torch.cat([ids, state], 1), torch.cat([mask, torch.ones_like(state, dtype=torch.bool)], 1))
        logits = logits[:, P:, :count].clone()  # the tokenizer's ids only
        logits[..., ad.mask_id] = float("-inf")
        p = torch.softmax(logits, -1).gather(-1, ro.completion_ids[..., None]).squeeze(-1)
        at = ro.commit_step == t
        torch.testing.assert_close(p[at], ro.commit_prob[at], rtol=1e-4, atol=1e-6)
    assert rollout_mismatch(ad, ro)["mismatch_max"] < 1e-4


def test_dispo_fillings_never_draw_ids_without_a_tokenizer_entry():
    ad = padded_vocab()
    count = len(ad.tokenizer)
    ids, mask = encode_prompts(ad.tokenizer, PROMPTS)
    cfg = SamplerConfig(gen_length=16, block_length=4, steps=8, temperature=1.0, cache="dual")
    obs = DiSPO(z=4, temperature=2.0, timing="uniform").observers(cfg, torch.Generator().manual_seed(2))
    ro = generate(ad, ids, mask, cfg, generator=torch.Generator().manual_seed(0), observers=obs)
    fill, lp = ro.step_stats["dispo_fill"], ro.step_stats["dispo_logp_old"]
    assert (ro.step_stats["dispo_step"] >= 0).all() and (fill >= 0).any()
    assert (fill < count).all() and torch.isfinite(lp).all()


# ------------------------------------------------------------------------------- special ids
def test_colliding_special_ids_are_refused_at_construction(tiny):
    m, tok = tiny.model, tiny.tokenizer
    with pytest.raises(ValueError, match=r"mask_id 2 collides with eos_id"):
        ModelAdapter(model=m, mask_id=2, eos_id=2, pad_id=0)
    with pytest.raises(ValueError, match=r"mask_id 3 collides with pad_id"):
        ModelAdapter(model=m, mask_id=3, eos_id=2, pad_id=3)
    with pytest.raises(ValueError, match=r"stop_ids\[1\]"):
        ModelAdapter(model=m, mask_id=3, eos_id=2, pad_id=0, stop_ids=(9, 3))
    with pytest.raises(ValueError, match="tokenizer's pad_token_id"):
        ModelAdapter(model=m, mask_id=tok.pad_token_id, eos_id=2, pad_id=1, tokenizer=tok)
    with pytest.raises(ValueError, match="eos_id 500 has no tokenizer entry"):
        ModelAdapter(model=m, mask_id=3, eos_id=500, pad_id=0, tokenizer=tok)
    with pytest.raises(ValueError, match="mask_id is None"):
        ModelAdapter(model=m, mask_id=None, eos_id=2, pad_id=0)
    ModelAdapter(model=m, mask_id=3, eos_id=2, pad_id=2, stop_ids=(2,), tokenizer=tok)  # eos = pad = stop: fine


def test_colliding_special_ids_are_refused_at_load(tmp_path):
    from test_loaders import LLADA_CFG, llada_weights, write_folder

    clash = write_folder(tmp_path / "clash", {**LLADA_CFG, "mask_token_id": 61}, llada_weights())  # eos 61
    with pytest.raises(ValueError, match="mask_id 61 collides with eos_id"):
        load(clash, tokenizer=False)
    ok = write_folder(tmp_path / "ok", LLADA_CFG, llada_weights())
    with pytest.raises(ValueError, match="mask_id 62 collides with pad_id"):
        load(ok, tokenizer=False, mask_id=62)
    assert load(clash, tokenizer=False, mask_id=60).mask_id == 60  # an override repairs it


# ------------------------------------------------------------------------------- pad token
def _no_pad_tokenizer():
    tok = build_char_tokenizer()
    tok.pad_token = None
    assert tok.pad_token_id is None
    return tok


def test_batching_without_a_pad_token_names_it():
    tok = _no_pad_tokenizer()
    with pytest.raises(ValueError, match="no pad token"):
        encode_prompts(tok, ["a", "abc"])
    ids, mask = encode_prompts(tok, ["a", "abc"], pad_id=7)
    assert ids[0, :2].tolist() == [7, 7] and mask[0].tolist() == [False, False, True, True]


def test_the_adapter_gives_a_tokenizer_without_pad_the_models_pad_id(tiny):
    tok = _no_pad_tokenizer()
    ad = ModelAdapter(model=tiny.model, mask_id=3, eos_id=2, pad_id=2, tokenizer=tok)
    assert tok.pad_token_id == 2
    ids, _ = encode_prompts(ad.tokenizer, ["a", "abc"])
    assert ids[0, :2].tolist() == [2, 2]
    with pytest.raises(ValueError, match=r"pad id 5000 \(pad_id\)"):
        ModelAdapter(model=tiny.model, mask_id=3, eos_id=2, pad_id=5000, tokenizer=_no_pad_tokenizer())


def test_load_uses_the_config_pad_id_for_a_tokenizer_without_one(tmp_path):
    from test_loaders import LLADA_CFG, llada_weights, write_folder

    for name, cfg, want in (("pad", LLADA_CFG, 62), ("nopad", {k: v for k, v in LLADA_CFG.items() if k != "pad_token_id"}, 61)):
        folder = write_folder(tmp_path / name, cfg, llada_weights())
        _no_pad_tokenizer().save_pretrained(folder)
        assert json.loads((folder / "tokenizer_config.json").read_text()).get("pad_token") is None
        ad = load(folder)
        assert ad.pad_id == want and ad.tokenizer.pad_token_id == want  # config.json's pad id, else its eos
        ids, mask = encode_prompts(ad.tokenizer, ["ab", "abcd"])
        assert ids[0, :2].tolist() == [want, want]
        ro = generate(ad, ids, mask, SamplerConfig(gen_length=4, block_length=4, steps=4))
        assert ro.completion_ids.shape == (2, 4)
