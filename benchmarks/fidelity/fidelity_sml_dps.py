"""Issue 19 items 2 and 3: how far SML and DPS are from their docs/spec.md definitions (before/after numbers).

* **SML (docs/spec.md §2.2)**: completions with a tail of stop tokens after the answer (as LLaDA's end-of-text
  tail). The spec's ``ℓ^SML_i`` masks only the stratum Π_s and keeps every other completion position,
  the tail included, visible. Reference: one full float64 forward per stratum. Reported: the maximum
  over valid positions of ``|ℓ_library − ℓ_spec|`` (nats) for ``full: 0, sml: 1``.
* **DPS (docs/spec.md §2.1)** under ``rollout.cache: prefix | dual``: δ_k must be computed from θ's logits at
  the rollout's states. Reference: replay every state of the *cached* rollout (positions with
  ``commit_step >= k`` masked) through a full forward and compute S(k, k+1), S(k+1, k+1) in float64.
  Reported: the maximum ``|δ_library − δ_reference|`` over valid (row, step) pairs, and the sampler's
  cost with and without the DPS observer under each cache mode: model forwards, query token
  positions (rows × columns summed over forwards; deterministic) and wall time (best of 3; noisy on
  a shared machine).

Runs on any maskrl version (it passes no option that older versions lack), so the same command
gives the "before" numbers on an older checkout:
``PYTHONPATH=<checkout>/src OMP_NUM_THREADS=1 python benchmarks/fidelity/fidelity_sml_dps.py --out before.json``.
Models: the built-in tiny model (seed 0; 32 wide, 2 layers) and its 40×-sharpened output layer
(``sharp``; confident enough that the threshold schedule commits several tokens per step).
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from maskrl.credit.dps import DPSObserver, progress_deltas
from maskrl.likelihood import Stratified, strata
from maskrl.models import build_tiny
from maskrl.sampling import SamplerConfig, generate
from maskrl.text import encode_prompts
from maskrl.types import Rollout

PROMPTS = ["ab", "a longer prompt", "c", "dd e", "xyz", "q", "hello", "1,2,3>6:"]


def tiny(sharp: float = 1.0):
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    with torch.no_grad():
        a.model.get_output_embeddings().weight.mul_(sharp)
    a.model.eval()
    return a


@torch.no_grad()
def full_log_probs(a, prompt_ids, prompt_mask, completion, drop_mask: bool = True) -> torch.Tensor:
    """``[R, L, V]`` float64 log-softmax of a full forward; ``drop_mask``: the ``[M]`` logit excluded
    (the sampler's convention; the likelihoods normalise over all V)."""
    x = torch.cat([prompt_ids, completion], 1)
    attn = torch.cat([prompt_mask.bool(), torch.ones_like(completion, dtype=torch.bool)], 1)
    z = a.logits(x, attn)[:, prompt_ids.shape[1]:].double()
    if drop_mask:
        z[..., a.mask_id] = float("-inf")
    return torch.log_softmax(z, -1)


def sml_gap(a, L: int = 24, k: int = 4, seed: int = 0) -> dict:
    ids, mask = encode_prompts(a.tokenizer, PROMPTS)
    n = ids.shape[0]
    g = torch.Generator().manual_seed(seed)
    comp = torch.randint(5, 40, (n, L), generator=g)
    ends = torch.randint(3, L // 2, (n,), generator=g)  # answer length; then a stop token and its tail
    pos = torch.arange(L)
    comp = torch.where(pos[None, :] >= ends[:, None], a.eos_id, comp)
    valid = a.completion_mask(comp)
    ro = Rollout(prompt_ids=ids, prompt_mask=mask, completion_ids=comp, completion_mask=valid,
                 commit_step=torch.zeros(n, L, dtype=torch.long), commit_prob=torch.ones(n, L),
                 num_steps=torch.ones(n, dtype=torch.long), group_ids=torch.arange(n))
    out = {}
    for layout in ("random", "stride"):
        with torch.no_grad():
            lib = Stratified(k=k, layout=layout, full=0.0, sml=1.0, p_mask_prompt=0.0)(
                a, ro, torch.Generator().manual_seed(3)).double()
        s_of = strata(valid, k, layout, torch.Generator().manual_seed(3))
        ref = torch.zeros(n, L, dtype=torch.float64)
        for s in range(k):
            hidden = (s_of == s) & valid  # docs/spec.md §2.2: only the stratum is masked
            lp = full_log_probs(a, ids, mask, torch.where(hidden, a.mask_id, comp), drop_mask=False)
            ref = torch.where(hidden, lp.gather(-1, comp[..., None]).squeeze(-1), ref)
        gap = (lib - ref).abs()[valid]
        out[layout] = {"max_abs_nats": gap.max().item(), "mean_abs_nats": gap.mean().item(),
                       "valid_tokens": int(valid.sum()), "tail_tokens": int((~valid).sum())}
    return out


def dps_reference(a, ids, mask, ro, scope: str = "all") -> dict:
    """δ per (row, step) from full forwards at the states of ``ro`` (docs/spec.md §2.1, confidence target)."""
    out = {}
    for i in range(ro.batch_size):
        T = int(ro.num_steps[i])
        cs = ro.commit_step[i]
        states = torch.stack([torch.where(cs >= k, a.mask_id, ro.completion_ids[i]) for k in range(T)])
        lmp = full_log_probs(a, ids[i:i + 1].expand(T, -1), mask[i:i + 1].expand(T, -1), states).max(-1).values
        b = ro.sampler.block_length
        for k in range(T - 1):
            after = cs > k  # M_{k+1}
            if scope == "block":
                first = int((cs >= k).nonzero()[0, 0]) // b * b
                blk = torch.zeros_like(after)
                blk[first:first + b] = True
                after = after & blk
            if after.any():
                out[i, k] = (lmp[k + 1][after].mean() - lmp[k][after].mean()).item()
    return out


def dps_gap(a, cfg: SamplerConfig, scope: str = "all", reps: int = 3) -> dict:
    ids, mask = encode_prompts(a.tokenizer, PROMPTS)
    obs = DPSObserver(scope)
    ro = generate(a, ids, mask, cfg, generator=torch.Generator().manual_seed(0), observers=[obs])
    delta, valid = progress_deltas(ro.step_stats["dps_s_next"], ro.step_stats["dps_s_self"], ro.num_steps)
    ref = dps_reference(a, ids, mask, ro, scope)
    assert set(ref) == {tuple(x) for x in valid.nonzero().tolist()}
    gaps = [abs(delta[n, k].item() - v) for (n, k), v in ref.items()]
    ref_vals = torch.tensor(list(ref.values()))
    cost = {}
    for name, obs_list in (("with_dps", lambda: [DPSObserver(scope)]), ("without_observer", lambda: [])):
        seen = []
        hook = a.model.get_decoder().register_forward_pre_hook(  # every forward of the sampler runs the decoder
            lambda _m, args, kw: seen.append(kw.get("input_ids", args[0] if args else None).shape), with_kwargs=True)
        try:
            generate(a, ids, mask, cfg, generator=torch.Generator().manual_seed(0), observers=obs_list())
        finally:
            hook.remove()
        cost[f"forwards_{name}"] = len(seen)
        cost[f"token_positions_{name}"] = int(sum(sh[0] * sh[1] for sh in seen))  # rows x query columns
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        generate(a, ids, mask, cfg, generator=torch.Generator().manual_seed(0), observers=[DPSObserver(scope)])
        times.append(time.perf_counter() - t0)
    t_plain = []
    for _ in range(reps):
        t0 = time.perf_counter()
        generate(a, ids, mask, cfg, generator=torch.Generator().manual_seed(0))
        t_plain.append(time.perf_counter() - t0)
    return {"max_abs_delta_gap": max(gaps), "mean_abs_delta_gap": sum(gaps) / len(gaps), "pairs": len(gaps),
            "delta_std": ref_vals.std(unbiased=False).item(), "sampler_s_with_dps": min(times),
            "sampler_s_without_observer": min(t_plain), **cost}


def observer_cost(a) -> dict:
    """Forwards and query token positions of one rollout of the 8 prompts with no observer, DiSPO's
    and RLDF's (θ's exact commit probabilities) under each cache mode (``"exact"`` honoured)."""
    from maskrl.credit import DiSPO, RLDFSteps

    ids, mask = encode_prompts(a.tokenizer, PROMPTS)
    out = {}
    samplers = {"fixed": dict(gen_length=32, block_length=8, steps=16, temperature=1.0),
                "threshold": dict(gen_length=32, block_length=8, temperature=1.0, schedule="threshold", threshold=0.5)}
    for sched, kw in samplers.items():
        for cache in ("none", "prefix", "dual"):
            cfg = SamplerConfig(**kw, cache=cache)
            makers = {"none": lambda: [], "dispo": lambda: DiSPO().observers(cfg, torch.Generator().manual_seed(0))}
            if hasattr(RLDFSteps, "observers") and "observers" in RLDFSteps.__dict__:  # versions with exact p_i
                makers["rldf_steps"] = lambda: RLDFSteps().observers(cfg, torch.Generator())
            for name, mk in makers.items():
                seen = []
                hook = a.model.get_decoder().register_forward_pre_hook(
                    lambda _m, args, kw: seen.append(kw.get("input_ids", args[0] if args else None).shape),
                    with_kwargs=True)
                try:
                    generate(a, ids, mask, cfg, generator=torch.Generator().manual_seed(0), observers=mk())
                finally:
                    hook.remove()
                out[f"{sched}/{cache}/{name}"] = {"forwards": len(seen),
                                                  "token_positions": int(sum(sh[0] * sh[1] for sh in seen))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/fidelity/fidelity_sml_dps.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    res = {"sml": {"tiny": sml_gap(tiny()), "sharp": sml_gap(tiny(40.0))}, "dps": {}}
    samplers = {
        "fixed": dict(gen_length=32, block_length=8, steps=16, temperature=1.0),
        "threshold": dict(gen_length=32, block_length=8, temperature=1.0, schedule="threshold", threshold=0.5),
    }
    for model, sharp in (("tiny", 1.0), ("sharp", 40.0)):
        a = tiny(sharp)
        for sched, kw in samplers.items():
            for cache in ("none", "prefix", "dual"):
                for scope in ("all", "block"):
                    res["dps"][f"{model}/{sched}/{cache}/{scope}"] = dps_gap(a, SamplerConfig(**kw, cache=cache), scope)
    res["observer_cost_sharp"] = observer_cost(tiny(40.0))
    text = json.dumps(res, indent=1)
    print(text)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
