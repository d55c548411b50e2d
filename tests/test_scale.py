"""LoRA, bf16 and gradient checkpointing helpers on the tiny bidirectional Llama."""
from __future__ import annotations

import pytest
import torch

from maskrl.models import apply_lora, build_char_tokenizer, build_tiny, chat_prompt, enable_gradient_checkpointing


def _tiny(seed=0):
    return build_tiny(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, seed=seed)


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 90, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.bool)
    mask[1, :3] = False  # a left-padded row exercises the 4-D mask
    mask[2, :1] = False
    return ids, mask


def _loss(logits, ids, mask):
    logp = logits.float().log_softmax(-1).gather(-1, ids[..., None])[..., 0]  # [N, T]
    return -(logp * mask).sum() / mask.sum()


def test_lora_trains_only_adapters_and_reference_is_the_base():
    adapter = _tiny()
    ids, mask = _batch()
    with torch.no_grad():
        base = adapter.logits(ids, mask)
    policy = apply_lora(adapter, rank=4, alpha=8, dropout=0.0)
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # all-linear: every projection of both layers is adapted, the output head is not
    assert len(trainable) == 2 * 7 * 2 and not any("lm_head" in n for n in trainable)
    assert (policy.mask_id, policy.eos_id, policy.family) == (adapter.mask_id, adapter.eos_id, adapter.family)

    with torch.no_grad():
        assert (policy.logits(ids, mask) - base).abs().max() < 1e-6  # B = 0 at init
    opt = torch.optim.SGD([p for p in policy.model.parameters() if p.requires_grad], lr=0.5)
    _loss(policy.logits(ids, mask), ids, mask).backward()
    opt.step()
    with torch.no_grad():
        after = policy.logits(ids, mask)
        with policy.reference() as ref:
            reference = ref.logits(ids, mask)
    assert (after - base).abs().max() > 1e-3  # the policy moved
    assert (reference - base).abs().max() < 1e-6  # the reference did not


def test_lora_on_bf16_base_keeps_fp32_adapters():
    adapter = _tiny()
    adapter.model.to(torch.bfloat16)
    policy = apply_lora(adapter, rank=4, alpha=8)
    dtypes = {n: p.dtype for n, p in policy.model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {torch.bfloat16}
    ids, mask = _batch()
    logits = policy.logits(ids, mask)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    _loss(logits, ids, mask).backward()
    grads = {n: p.grad for n, p in policy.model.named_parameters() if "lora_" in n}
    assert all(g is not None and g.dtype == torch.float32 for g in grads.values())
    assert any(g.abs().sum() > 0 for n, g in grads.items() if "lora_B" in n)
    assert all(p.grad is None for n, p in policy.model.named_parameters() if "lora_" not in n)


def test_lora_initialisation_is_seeded_and_leaves_the_global_rng_alone():
    """peft draws the A matrices from the global RNG; apply_lora seeds that draw, so every process and
    every run starts from the same adapter (a 2-process run, or a rerun, is reproducible)."""
    import subprocess
    import sys

    def adapters(seed, burn):
        torch.manual_seed(burn)  # whatever state the global RNG is in
        state = torch.random.get_rng_state()
        policy = apply_lora(_tiny(), rank=2, alpha=4, seed=seed)
        assert torch.equal(torch.random.get_rng_state(), state)  # left as it was
        return {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_A" in n}

    a, b, c = adapters(0, 1), adapters(0, 2), adapters(1, 1)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)  # the seed matters
    code = ("import torch, hashlib; from maskrl.models import apply_lora, build_tiny; "
            "p = apply_lora(build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=32), rank=2); "
            "print(hashlib.sha256(b''.join(t.detach().numpy().tobytes() for n, t in "
            "p.model.named_parameters() if 'lora_A' in n)).hexdigest())")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)}
    assert len(runs) == 1  # two fresh processes, the same adapter


def test_a_runs_lora_is_initialised_from_train_seed():
    """load_policy passes ``train.seed`` to apply_lora: equal seeds give identical A matrices, other
    seeds other ones, and each is exactly apply_lora's adapter of that seed on the same base; the
    base weights (``model.tiny.seed``) do not move with ``train.seed``."""
    from maskrl.config import load_config
    from maskrl.policy import load_policy

    def policy(seed):
        return load_policy(load_config([], ["model.tiny={hidden_size: 32, num_layers: 2, num_heads: 2, "
                                             "intermediate_size: 64}", "model.lora_rank=2", f"train.seed={seed}"]))

    def params(p, lora):
        return {n: t.detach().clone() for n, t in p.model.named_parameters() if ("lora_A" in n) == lora}

    a, b, c = policy(0), policy(0), policy(7)
    a_lora, c_lora = params(a, True), params(c, True)
    assert a_lora and a_lora.keys() == params(b, True).keys() == c_lora.keys()
    assert all(torch.equal(a_lora[k], params(b, True)[k]) for k in a_lora)  # equal seeds: the same adapter
    assert not any(torch.equal(a_lora[k], c_lora[k]) for k in a_lora)  # another seed: every A differs
    base_a, base_c = params(a, False), params(c, False)
    assert all(torch.equal(base_a[k], base_c[k]) for k in base_a)
    direct = apply_lora(build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), rank=2,
                        alpha=32.0, seed=7)
    assert all(torch.equal(t, params(direct, True)[k]) for k, t in c_lora.items())


def test_apply_lora_twice_is_refused():
    policy = apply_lora(_tiny(), rank=2, alpha=4)
    with pytest.raises(ValueError, match="already has peft adapters"):
        apply_lora(policy, rank=2, alpha=4)


def _grads(adapter, ids, mask):
    """Gradients of the loss, and how many tensors autograd kept for backward outside checkpoints."""
    adapter.model.train()
    adapter.model.zero_grad()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(1) or t, lambda t: t):
        loss = _loss(adapter.logits(ids, mask), ids, mask)
    loss.backward()
    return {n: p.grad.clone() for n, p in adapter.model.named_parameters() if p.grad is not None}, len(saved)


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_gives_the_same_gradients(lora):
    ids, mask = _batch()
    plain, ckpt = _tiny(), _tiny()
    if lora:
        plain, ckpt = apply_lora(plain, rank=4, alpha=8), apply_lora(ckpt, rank=4, alpha=8)
        for a, b in zip(plain.model.parameters(), ckpt.model.parameters()):
            if a.requires_grad:  # non-zero B so gradients reach every LoRA matrix
                torch.manual_seed(a.numel())
                a.data.normal_(0, 0.1)
                b.data.copy_(a.data)
    ref, saved_plain = _grads(plain, ids, mask)
    enable_gradient_checkpointing(ckpt)
    base = ckpt.model.get_base_model() if lora else ckpt.model
    assert base.is_activation_checkpointing and base.config.use_cache is False
    got, saved_ckpt = _grads(ckpt, ids, mask)
    assert saved_ckpt < saved_plain / 2  # the layers' activations were not kept: checkpointing is active
    assert ref.keys() == got.keys() and len(ref) > 0
    for name in ref:
        assert torch.allclose(ref[name], got[name], atol=1e-6, rtol=1e-5), name


def test_chat_prompt_uses_the_template_when_there_is_one():
    tok = build_char_tokenizer()
    assert chat_prompt(tok, "2+2?") == "2+2?"
    assert chat_prompt(None, "2+2?") == "2+2?"
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert chat_prompt(tok, "2+2?") == "<user>2+2?<assistant>"
