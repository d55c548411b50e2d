"""Masked-diffusion supervised fine-tuning (``maskrl sft``), the warm start before RL.

Objective (LLaDA SFT): for each example draw ``t ~ U(ε, 1)``, mask every completion token with
probability t (the prompt is never masked), and minimise ``Σ_masked CE / t`` divided by the number
of completion tokens. The completion is the target text followed by eos, padded with eos to the
generation length, so the model learns where to stop.

On a block-diffusion model (``adapter.block_size`` set, no logit shift) each block is scored as it is
decoded: its own noisy tokens over the *clean* earlier blocks, through the doubled x_t ⊕ x_0 forward
(:func:`maskrl.likelihood.blocks.block_logits`; SDAR's training forward). A plain block-causal forward
of x_t would let a block read the masks drawn in earlier blocks, a context the block sampler never gives.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import torch
from tqdm.auto import tqdm

from maskrl.models.adapter import ModelAdapter
from maskrl.tasks.base import Example
from maskrl.text import data_token_ids, encode_prompts



def encode_targets(tokenizer, targets: Sequence[str], gen_length: int, eos_id: int,
                   ids: Sequence[int] | None = None, prompts: Sequence[str] | None = None,
                   gen_length_key: str = "gen_length") -> torch.Tensor:
    """Target completions as ``[N, L]`` long: the text's tokens, then eos up to ``gen_length``. The
    target is data: special-token strings in it are text (:func:`maskrl.text.data_token_ids`), so a
    target spelling ``<|eos|>`` does not end early nor teach a mask id.

    Raises:
        ValueError: naming the example whose target is longer than ``gen_length`` tokens (its id, its
            prompt when ``prompts`` are given, the target's text) and ``gen_length_key``, the setting to raise.
    """
    out = torch.full((len(targets), gen_length), eos_id, dtype=torch.long)
    for i, t in enumerate(targets):
        tok = data_token_ids(tokenizer, t)
        if len(tok) > gen_length:
            who = ids[i] if ids is not None else i
            prompt = f" (prompt {prompts[i][:80]!r})" if prompts is not None else ""
            raise ValueError(f"training example {who}{prompt}: its SFT target {t[:80]!r} is {len(tok)} tokens, more "
                             f"than the completion length {gen_length_key} = {gen_length}; raise it or shorten "
                             "the target")
        out[i, : len(tok)] = torch.tensor(tok, dtype=torch.long)
    return out


def sft_loss(adapter: ModelAdapter, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, answer_ids: torch.Tensor,
             generator: torch.Generator | None, eps: float = 1e-3) -> torch.Tensor:
    """Masked-diffusion SFT loss of one batch.

    Args:
        prompt_ids: ``[N, P]`` long, left-padded; prompt_mask ``[N, P]`` bool.
        answer_ids: ``[N, L]`` long target completion (eos-padded).
        generator: draws ``t [N]`` and the token masks ``[N, L]``.
        eps: lower bound of t.

    Returns:
        Scalar: ``mean_N (1/L) Σ_{masked i} CE_i / t``; on a block-diffusion model each block's logits
        are those over clean earlier blocks (module docstring).
    """
    n, L = answer_ids.shape
    dev = answer_ids.device
    t = eps + (1 - eps) * torch.rand((n, 1), generator=generator, device=dev)  # [N, 1]
    masked = torch.rand((n, L), generator=generator, device=dev) < t  # [N, L]
    noisy = torch.where(masked, adapter.mask_id, answer_ids)
    if getattr(adapter, "block_size", None) is not None and not adapter.shift:
        from maskrl.likelihood.blocks import block_logits

        logits = block_logits(adapter, prompt_ids, prompt_mask, noisy, answer_ids).float()  # [N, L, V]
    else:
        x = torch.cat([prompt_ids, noisy], 1)
        attn = torch.cat([prompt_mask.bool(), torch.ones_like(noisy, dtype=torch.bool)], 1)
        logits = adapter.logits(x, attn)[:, prompt_ids.shape[1]:].float()  # [N, L, V]
    ce = torch.nn.functional.cross_entropy(logits.reshape(n * L, -1), answer_ids.reshape(-1), reduction="none")
    ce = ce.view(n, L) * masked / t  # [N, L]
    return ce.sum() / (n * L)


def run_sft(adapter: ModelAdapter, examples: Sequence[Example], target_fn: Callable[[Example], str], *,
            gen_length: int, steps: int, batch_size: int, lr: float, warmup_steps: int = 0,
            weight_decay: float = 0.01, max_grad_norm: float = 1.0, seed: int = 0, log_every: int = 50,
            prompt_fn: Callable[[str], str] = lambda s: s, progress: bool = True,
            on_step: Callable[[int], None] | None = None, gen_length_key: str = "gen_length") -> list[dict]:
    """Train ``adapter`` in place on ``examples`` (their ``target_fn`` text as completion).

    ``on_step(k)``, when given, is called after optimizer step k (1-based), e.g. to score a
    validation split along the run; the model is put back in training mode after it.

    Returns:
        The logged metrics (``{"step", "loss", "lr", "seconds"}`` every ``log_every`` steps).

    Raises:
        ValueError: no examples; a target longer than ``gen_length`` tokens (:func:`encode_targets`;
            ``gen_length_key`` names the setting in the message, e.g. ``rollout.gen_length``).
    """
    if not examples:
        raise ValueError("run_sft: no training examples")
    tok = adapter.tokenizer
    device = adapter.device
    prompt_ids, prompt_mask = encode_prompts(tok, [prompt_fn(ex.prompt) for ex in examples])
    answers = encode_targets(tok, [target_fn(ex) for ex in examples], gen_length, adapter.eos_id, [ex.id for ex in examples],
                             [ex.prompt for ex in examples], gen_length_key)
    gen = torch.Generator(device=device).manual_seed(seed)
    data_gen = torch.Generator().manual_seed(seed + 1)
    params = [p for p in adapter.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

    def lr_at(step: int) -> float:  # linear warmup, cosine decay to 10 %
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        frac = (step - warmup_steps) / max(1, steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    adapter.model.train()
    history, t0, running = [], time.time(), 0.0
    bar = tqdm(range(steps), desc="sft", disable=not progress, dynamic_ncols=True)
    for step in bar:
        idx = torch.randint(len(examples), (batch_size,), generator=data_gen)
        # trim the common left padding of this batch
        pm = prompt_mask[idx]
        first = int(pm.any(0).nonzero()[0])
        loss = sft_loss(adapter, prompt_ids[idx, first:].to(device), pm[:, first:].to(device), answers[idx].to(device), gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        opt.step()
        sched.step()
        if on_step is not None:
            on_step(step + 1)
            adapter.model.train()
        running += loss.item()
        if (step + 1) % log_every == 0 or step + 1 == steps:
            k = (step % log_every) + 1
            rec = {"step": step + 1, "loss": running / k, "lr": sched.get_last_lr()[0], "seconds": time.time() - t0}
            history.append(rec)
            bar.set_postfix(loss=f"{rec['loss']:.3f}")
            running = 0.0
    adapter.model.eval()
    return history
