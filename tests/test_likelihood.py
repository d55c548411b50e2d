import dataclasses

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from maskrl.likelihood import mask_prompt, mean_field
from maskrl.models.adapter import ModelAdapter
from maskrl.sampling import SamplerConfig, generate
from maskrl.sft import encode_targets, sft_loss
from maskrl.text import encode_prompts


def _rollout(tiny, prompts=("abc", "hello there"), L=8):
    ids, mask = encode_prompts(tiny.tokenizer, list(prompts))
    return generate(tiny, ids, mask, SamplerConfig(gen_length=L, block_length=L, steps=4))


def test_mask_prompt_never_masks_padding_and_is_seeded(tiny):
    ids, mask = encode_prompts(tiny.tokenizer, ["a", "a much longer prompt here"])
    g = lambda: torch.Generator().manual_seed(3)
    a = mask_prompt(ids, mask, tiny.mask_id, 0.5, g())
    assert torch.equal(a, mask_prompt(ids, mask, tiny.mask_id, 0.5, g()))
    assert (a[~mask] == tiny.pad_id).all()
    assert (a[mask] == tiny.mask_id).any() and (a[mask] != tiny.mask_id).any()
    assert torch.equal(mask_prompt(ids, mask, tiny.mask_id, 0.0, g()), ids)
    assert (mask_prompt(ids, mask, tiny.mask_id, 1.0, g())[mask] == tiny.mask_id).all()


def test_mean_field_matches_per_token_loop(tiny):
    r = _rollout(tiny)
    lp = mean_field(tiny, r, torch.Generator().manual_seed(0), p_mask_prompt=0.3)
    # slow reference: rebuild the same masked input and read each position's log-softmax
    prompt = mask_prompt(r.prompt_ids, r.prompt_mask, tiny.mask_id, 0.3, torch.Generator().manual_seed(0))
    P, L = r.prompt_ids.shape[1], r.gen_length
    for n in range(r.batch_size):
        x = torch.cat([prompt[n], torch.full((L,), tiny.mask_id)])[None]
        att = torch.cat([r.prompt_mask[n], torch.ones(L, dtype=torch.bool)])[None]
        logits = tiny.logits(x, att)[0, P:]
        for i in range(L):
            ref = torch.log_softmax(logits[i].double(), -1)[r.completion_ids[n, i]]
            assert lp[n, i].item() == pytest.approx(ref.item(), abs=1e-5)


def test_mean_field_batch_equals_single_with_p_zero(tiny):
    r = _rollout(tiny, ("abc", "hello there", "x"))
    full = mean_field(tiny, r, None, p_mask_prompt=0.0)
    for n in range(3):
        single = r.select(slice(n, n + 1))
        # drop the shared left padding of the single row
        torch.testing.assert_close(mean_field(tiny, single, None, p_mask_prompt=0.0)[0], full[n], atol=1e-5, rtol=1e-5)


def _dream_like(shift: bool):
    cfg = Qwen2Config(vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(cfg).eval()
    return ModelAdapter(model=model, mask_id=19, eos_id=18, pad_id=17, shift=shift, family="dream")


@pytest.mark.numerics
def test_dream_shift_is_applied_in_sampler_and_likelihood():
    """With shift, position i's prediction comes from the raw logits at i-1 -- in the likelihood
    estimator and in the sampler's commit probabilities; the unshifted reading disagrees."""
    ad = _dream_like(True)
    ids = torch.tensor([[1, 2, 3, 4]])
    pm = torch.ones_like(ids, dtype=torch.bool)
    r = generate(ad, ids, pm, SamplerConfig(gen_length=4, block_length=4, steps=4))
    lp = mean_field(ad, r, None, p_mask_prompt=0.0)
    x = torch.cat([ids, torch.full((1, 4), 19)], 1)
    raw = ad.model(input_ids=x, attention_mask=ModelAdapterMask(x)).logits.float()
    right = torch.log_softmax(raw[0, 3:7], -1).gather(-1, r.completion_ids[0, :, None]).squeeze(-1)
    wrong = torch.log_softmax(raw[0, 4:8], -1).gather(-1, r.completion_ids[0, :, None]).squeeze(-1)
    torch.testing.assert_close(lp[0], right, atol=1e-5, rtol=1e-5)
    assert (lp[0] - wrong).abs().max() > 1e-3
    # sampler: the first committed token's probability is read from raw row P-1 (all masked state)
    first = r.commit_step[0] == 0
    p_raw = torch.softmax(raw[0, 3:7].clone().index_fill_(-1, torch.tensor([19]), float("-inf")), -1)
    exp_p = p_raw.gather(-1, r.completion_ids[0, :, None]).squeeze(-1)
    torch.testing.assert_close(r.commit_prob[0][first], exp_p[first], atol=1e-5, rtol=1e-5)
    # an unshifted adapter over the same weights gives different likelihoods
    lp_wrong = mean_field(_dream_like(False), r, None, p_mask_prompt=0.0)
    assert (lp_wrong - lp).abs().max() > 1e-3


def ModelAdapterMask(x):
    from maskrl.models.adapter import bidirectional_mask

    return bidirectional_mask(torch.ones_like(x, dtype=torch.bool), torch.float32)


def test_sft_loss_masks_only_the_answer_and_weights_by_one_over_t(tiny):
    ids, mask = encode_prompts(tiny.tokenizer, ["ab", "cde"])
    ans = encode_targets(tiny.tokenizer, ["12", "3"], 4, tiny.eos_id)
    assert ans.tolist()[1] == [tiny.tokenizer.convert_tokens_to_ids("3")] + [tiny.eos_id] * 3
    seen = []
    real = tiny.logits

    def spy(x, a=None):
        seen.append(x.clone())
        return real(x, a)

    tiny.logits = spy
    loss = sft_loss(tiny, ids, mask, ans, torch.Generator().manual_seed(0))
    assert torch.equal(seen[0][:, : ids.shape[1]], ids)  # prompt never masked
    # hand computation with the same draws
    g = torch.Generator().manual_seed(0)
    t = 1e-3 + (1 - 1e-3) * torch.rand((2, 1), generator=g)
    m = torch.rand((2, 4), generator=g) < t
    assert torch.equal(seen[0][:, ids.shape[1]:] == tiny.mask_id, m)
    logits = real(seen[0], torch.cat([mask, torch.ones(2, 4, dtype=torch.bool)], 1))[:, ids.shape[1]:]
    ce = torch.nn.functional.cross_entropy(logits.reshape(8, -1), ans.reshape(-1), reduction="none").view(2, 4)
    assert loss.item() == pytest.approx(((ce * m) / t).sum().item() / 8, rel=1e-5)
    with pytest.raises(ValueError, match="^training example 7: its SFT target 'toolong' is 7 tokens, more than the "
                                         "completion length gen_length = 3"):
        encode_targets(tiny.tokenizer, ["toolong"], 3, tiny.eos_id, ids=[7])


def test_saved_policy_of_any_family_reloads_with_its_facts(tmp_path):
    """save_model -> maskrl.models.load keeps ids, shift and logits (e.g. a trained Dream or LLaDA policy)."""
    from maskrl.models import load, save_model

    ad = _dream_like(True)
    ad.stop_ids = (16,)
    save_model(ad, tmp_path / "m")
    back = load(tmp_path / "m", tokenizer=False)
    assert (back.mask_id, back.eos_id, back.pad_id, back.shift, back.stop_ids, back.family) == (19, 18, 17, True, (16,), "dream")
    x = torch.tensor([[1, 2, 3, 19, 19]])
    torch.testing.assert_close(back.logits(x), ad.logits(x))


# ---------------------------------------------------------------- state likelihood (docs/spec.md §1.4 state)
from maskrl.likelihood import LIKELIHOODS, MeanField, State, commit_states, state  # noqa: E402


def test_commit_states_names_each_row_step_pair_once():
    cs = torch.tensor([[0, 2, 1, 2], [1, 0, 0, 1]])
    rows, steps, index = commit_states(cs)
    assert rows.tolist() == [0, 0, 0, 1, 1] and steps.tolist() == [0, 1, 2, 0, 1]
    assert (rows[index] == torch.arange(2)[:, None]).all() and (steps[index] == cs).all()


@pytest.mark.parametrize("schedule", ["fixed", "threshold"])
def test_state_matches_per_token_loop(tiny, schedule):
    """Each token is scored by a separate forward of its own commit state (slow reference)."""
    ids, pm = encode_prompts(tiny.tokenizer, ["abc", "hello there"])
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=8, temperature=1.0, schedule=schedule, threshold=0.2)
    r = generate(tiny, ids, pm, cfg, generator=torch.Generator().manual_seed(1))
    lp = state(tiny, r, torch.Generator().manual_seed(0), p_mask_prompt=0.3)
    prompt = mask_prompt(r.prompt_ids, r.prompt_mask, tiny.mask_id, 0.3, torch.Generator().manual_seed(0))
    P, L = r.prompt_ids.shape[1], r.gen_length
    for n in range(r.batch_size):
        for i in range(L):
            t = r.commit_step[n, i]
            comp = [tiny.mask_id if r.commit_step[n, j] >= t else r.completion_ids[n, j].item() for j in range(L)]
            x = torch.cat([prompt[n], torch.tensor(comp)])[None]
            att = torch.cat([r.prompt_mask[n], torch.ones(L, dtype=torch.bool)])[None]
            ref = torch.log_softmax(tiny.logits(x, att)[0, P + i].double(), -1)[r.completion_ids[n, i]]
            assert lp[n, i].item() == pytest.approx(ref.item(), abs=1e-5)


def test_state_equals_mean_field_for_first_commits_and_differs_later(tiny):
    r = _rollout(tiny)
    st = state(tiny, r, torch.Generator().manual_seed(4), p_mask_prompt=0.2)
    mf = mean_field(tiny, r, torch.Generator().manual_seed(4), p_mask_prompt=0.2)
    first = r.commit_step == 0
    torch.testing.assert_close(st[first], mf[first], atol=1e-5, rtol=1e-5)
    assert (st[~first] - mf[~first]).abs().max() > 1e-3


def test_state_batch_equals_single_and_is_seeded(tiny):
    r = _rollout(tiny, ("abc", "hello there", "x"))
    full = state(tiny, r, None, p_mask_prompt=0.0)
    for n in range(3):
        torch.testing.assert_close(state(tiny, r.select(slice(n, n + 1)), None, p_mask_prompt=0.0)[0], full[n],
                                   atol=1e-5, rtol=1e-5)
    g = lambda: torch.Generator().manual_seed(9)
    assert torch.equal(state(tiny, r, g(), 0.5), state(tiny, r, g(), 0.5))


def test_state_refuses_uncommitted_positions(tiny):
    r = _rollout(tiny)
    bad = dataclasses.replace(r, commit_step=r.commit_step.clone().index_fill_(1, torch.tensor([2]), -1))
    with pytest.raises(ValueError, match="row 0 .*never committed"):
        state(tiny, bad, None)
    with pytest.raises(ValueError, match="commit_step has shape"):
        state(tiny, dataclasses.replace(r, commit_step=r.commit_step[:, :3]), None)


def test_likelihood_registry_has_state():
    assert LIKELIHOODS.get("state") is State and LIKELIHOODS.get("mean_field") is MeanField


@pytest.mark.parametrize("bad, match", [
    (torch.tensor([[0, 1], [-1, 0]]), "row 1 has a position that was never committed"),
    (torch.tensor([0, 1, 2]), r"\[N, L\] integer tensor, got shape \(3,\)"),
    (torch.zeros(2, 2, 2, dtype=torch.long), r"got shape \(2, 2, 2\)"),
    (torch.tensor([[0.0, 1.5]]), "dtype torch.float32"),
])
def test_commit_states_rejects_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        commit_states(bad)


def test_commit_states_and_state_accept_an_empty_batch(tiny):
    rows, steps, index = commit_states(torch.zeros(0, 8, dtype=torch.long))
    assert rows.numel() == steps.numel() == 0 and index.shape == (0, 8)
    r = _rollout(tiny).select(slice(0, 0))
    assert state(tiny, r, None).shape == (0, r.gen_length)
