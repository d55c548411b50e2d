"""Peak memory and time of one likelihood forward + backward, ``state`` vs ``mean_field``, at LLaDA's
vocabulary size (issue "plug-in seams", item 5).

Each configuration runs in a fresh subprocess, so its peak resident memory (``ru_maxrss``) is its
own; ``extra_peak_mb`` is that peak minus the process's resident memory just before the likelihood
call (model, rollout and interpreter excluded). The model is a randomly initialised 2-layer,
64-wide bidirectional Llama with V = 126,464 (LLaDA-8B's vocabulary); the rollout is synthetic
(random tokens, each position committed at a random step, ``L / steps`` per step), which is all the
estimators read.

Variants:
- ``lean`` (the library): the output layer runs only on the scored positions
  (``ModelAdapter.log_probs_at``);
- ``full_logits`` (for comparison; what maskrl did before): full ``[rows, P+L, V]`` logits of every
  forward row, then the log-prob of the targets.

    python benchmarks/speed/likelihood_memory.py --out benchmarks/results/likelihood_memory.json
    python benchmarks/speed/likelihood_memory.py --quick   # L = 64, 32 steps, also the full-logits variant

The JSON holds one record per (likelihood, variant, shape) and, per shape and variant, the ratio
``state / mean_field`` of extra peak memory (issue target: <= 1.5 at L = 256). ``lean@128`` runs
the same calls under ``train.max_forward_rows = 128`` (one sequence's 128 states per forward +
backward, as the trainer splits them).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

VOCAB = 126_464


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def run_one(likelihood: str, variant: str, n: int, prompt: int, L: int, steps: int, seed: int,
            max_rows: int = 0) -> dict:
    """One measurement in this process (call in a fresh process). ``max_rows`` > 0 splits the call
    into forward + backward passes of at most that many rows, as ``train.max_forward_rows`` does."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from maskrl.likelihood import LIKELIHOODS, commit_states
    from maskrl.models.adapter import ModelAdapter, token_log_probs
    from maskrl.types import Rollout

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=prompt + L + 8)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    mask_id = VOCAB - 1
    adapter = ModelAdapter(model=model, mask_id=mask_id, eos_id=VOCAB - 2, pad_id=VOCAB - 3)
    per_step = L // steps
    order = torch.stack([torch.randperm(L, generator=g) for _ in range(n)])  # [N, L] commit order
    commit_step = torch.empty(n, L, dtype=torch.long).scatter_(1, order, (torch.arange(L) // per_step).expand(n, L))
    ro = Rollout(prompt_ids=torch.randint(0, VOCAB - 3, (n, prompt), generator=g),
                 prompt_mask=torch.ones(n, prompt, dtype=torch.bool),
                 completion_ids=torch.randint(0, VOCAB - 3, (n, L), generator=g),
                 completion_mask=torch.ones(n, L, dtype=torch.bool), commit_step=commit_step,
                 commit_prob=torch.full((n, L), 0.5), num_steps=torch.full((n,), steps), group_ids=torch.zeros(n))
    name, _, kw = likelihood.partition(":")  # e.g. "stratified:k=8,full=0"
    params = {k: float(v) if "." in v else int(v) for k, v in (item.split("=") for item in kw.split(",") if item)}
    est = LIKELIHOODS.get(name)(p_mask_prompt=0.0, **params)
    rows = int(est.rows(ro).sum())

    def full_logits() -> torch.Tensor:  # the pre-seam computation, for comparison
        if likelihood == "mean_field":
            comp = torch.full((n, L), mask_id)
            x, index = torch.cat([ro.prompt_ids, comp], 1), None
        else:
            r, s, index = commit_states(ro.commit_step)
            comp = torch.where(ro.commit_step[r] >= s[:, None], mask_id, ro.completion_ids[r])
            x = torch.cat([ro.prompt_ids[r], comp], 1)
        lp = token_log_probs(adapter.logits(x)[:, prompt:], ro.completion_ids if index is None
                             else ro.completion_ids[r])
        return lp if index is None else lp.gather(0, index)

    from maskrl.trainer import split_rows

    base = _rss_mb()
    t0 = time.perf_counter()
    total = 0.0
    if variant == "lean":
        for sl in split_rows(est.rows(ro), 0, max_rows):
            lp = est(adapter, ro.select(sl), None)
            lp.sum().backward()
            total += float(lp.detach().sum())
    else:
        lp = full_logits()
        lp.sum().backward()
        total = float(lp.detach().sum())
    sec = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"likelihood": likelihood, "variant": variant, "n": n, "prompt_length": prompt, "gen_length": L,
            "steps": steps, "vocab": VOCAB, "forward_rows": rows, "max_forward_rows": max_rows, "seconds": sec, "baseline_rss_mb": base,
            "peak_rss_mb": peak, "extra_peak_mb": peak - base, "log_prob_sum": total}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results/likelihood_memory.json")
    ap.add_argument("--quick", action="store_true", help="L = 64 in 32 steps only (the issue's shape)")
    ap.add_argument("--sml", action="store_true",
                    help="instead: SML (stratified, pure) at K = 2, 4, 8, alone and under max_forward_rows = 8, L = 256")
    ap.add_argument("--n", type=int, default=2, help="completions")
    ap.add_argument("--prompt", type=int, default=32, help="prompt length")
    ap.add_argument("--one", nargs=6, metavar=("LIKELIHOOD", "VARIANT", "L", "STEPS", "SEED", "MAX_ROWS"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        lik, var, L, steps, seed, max_rows = args.one
        print(json.dumps(run_one(lik, var, args.n, args.prompt, int(L), int(steps), int(seed), int(max_rows))))
        return {}
    if args.sml:
        return sml_memory(args)
    # (L, steps, variants); a variant "lean@R" runs under train.max_forward_rows = R
    shapes = [(64, 32, ("lean", "full_logits"))]
    if not args.quick:  # full logits of state at L = 256 would need ~39 GB: not run
        shapes.append((256, 128, ("lean", "lean@128")))
    records = []
    for L, steps, variants in shapes:
        for variant in variants:
            for lik in ("mean_field", "state"):
                name, _, budget = variant.partition("@")
                cmd = [sys.executable, __file__, "--n", str(args.n), "--prompt", str(args.prompt),
                       "--one", lik, name, str(L), str(steps), "0", budget or "0"]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                rec = json.loads(out.stdout.strip().splitlines()[-1])
                rec["variant"] = variant
                records.append(rec)
                print(f"L={L:4d} {variant:11s} {lik:10s} rows={rec['forward_rows']:4d} "
                      f"extra peak {rec['extra_peak_mb']:9.1f} MB  {rec['seconds']:6.2f} s", flush=True)
    ratios = {}
    for L, steps, variants in shapes:
        for variant in variants:
            pick = {r["likelihood"]: r for r in records if r["gen_length"] == L and r["variant"] == variant}
            ratios[f"L{L}_{variant}"] = {
                "state_over_mean_field_memory": pick["state"]["extra_peak_mb"] / pick["mean_field"]["extra_peak_mb"],
                "state_over_mean_field_time": pick["state"]["seconds"] / pick["mean_field"]["seconds"]}
    result = {"benchmark": "likelihood_memory", "records": records, "ratios": ratios,
              "target": "lean state <= 1.5x mean_field extra peak memory at L = 256"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(ratios, indent=2))
    return result


def sml_memory(args) -> dict:
    """Peak memory of SML's pass as K grows, with and without a row budget (issue 9: peak memory must
    not grow with K beyond one row budget). Rows per sequence = K; the budget packs whole sequences."""
    records = []
    for budget in (0, 8):
        for k in (2, 4, 8):
            lik = f"stratified:k={k},full=0.0,sml=1.0"
            cmd = [sys.executable, __file__, "--n", str(args.n), "--prompt", str(args.prompt),
                   "--one", lik, "lean", "256", "128", "0", str(budget)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            rec = json.loads(out.stdout.strip().splitlines()[-1])
            records.append(rec)
            print(f"SML K={k} max_forward_rows={budget}: rows={rec['forward_rows']} extra peak "
                  f"{rec['extra_peak_mb']:.1f} MB  {rec['seconds']:.2f} s", flush=True)
    result = {"benchmark": "likelihood_memory_sml", "records": records}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
