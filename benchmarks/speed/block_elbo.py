"""The one-forward x_t ⊕ x_0 likelihood of a block-diffusion model against one forward per block (issue 48
items 3 and 6): FLOPs counted and wall time on the tiny block model.

Two measurements per block size (L = 256 completion tokens after a 29-token prompt, so the last prompt
block is shared with the completion; the default tiny shape: hidden 128, 4 layers):

- ``elbo_row``: one ELBO mask (t = ½) scored for every block. ``doubled``: one forward of the doubled
  row (:func:`maskrl.likelihood.blocks.score_blocks`); ``per_block``: the loop it replaces, one forward
  per block over "clean prefix, then that block noisy" (the cheapest loop: nothing after the block);
  ``plain``: one ordinary forward of the noisy row, the cost of a full-attention model's ELBO row
  (it gives a block model's earlier blocks the wrong context; for scale only).
- ``state``: the state (trajectory) likelihood of a block-by-block rollout with 4 denoising steps per
  block. ``rounds``: TraceRL's within-block rounds through the doubled forward (4 rows, what
  :class:`maskrl.likelihood.State` runs); ``per_state``: one plain row per commit state (64 / 8 rows).

FLOPs are torch's ``FlopCounterMode`` totals (matmuls, and attention as dense ``T × T``), for the forward
and for forward + backward of the summed log-probs; times are the median of ``--repeats`` runs of
forward + backward on ``--threads`` CPU threads (``--slow-repeats`` for the two loops; the machine
this record was made on was shared, so times are noisier than FLOPs). ``max_abs_diff`` checks that both sides score the same
numbers. Writes JSON::

    PYTHONPATH=src python benchmarks/speed/block_elbo.py --out benchmarks/speed/block_elbo.json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from maskrl.likelihood.base import score_positions
from maskrl.likelihood.blocks import block_rounds, score_blocks
from maskrl.models import build_tiny


def measure(fn, repeats: int) -> dict:
    """FLOPs of ``fn()`` (forward) and of its backward, and the median wall time of forward + backward."""
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        fn()
    fwd = fc.get_total_flops()
    with FlopCounterMode(display=False) as fc:
        fn().sum().backward()
    train = fc.get_total_flops()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn().sum().backward()
        times.append(time.perf_counter() - t0)
    return {"flops_forward": fwd, "flops_forward_backward": train, "seconds_forward_backward": statistics.median(times)}


def per_block_loop(a, prompt, clean, noisy, cols):
    """``[M]`` log-probs at ``cols`` (one row): one block-causal forward per block, over the clean prefix
    and the block's noisy tokens only."""
    bs, p = a.block_size, prompt.numel()
    out = []
    blocks = (p + cols) // bs
    for b in blocks.unique().tolist():
        start, end = b * bs, min((b + 1) * bs, p + clean.numel())
        x = torch.cat([torch.cat([prompt, clean])[:start], torch.cat([prompt, noisy])[start:end]])[None]
        at = cols[blocks == b]
        out.append(a.log_probs_at(x, None, torch.zeros_like(at), p + at, clean[at]))
    return torch.cat(out)


def block_rollout_steps(p_len: int, L: int, bs: int, steps: int, g: torch.Generator) -> torch.Tensor:
    """``[1, L]`` commit steps of a block-by-block decode, ``steps`` per block (the shared prompt block too)."""
    blk = (p_len + torch.arange(L)) // bs
    cs = torch.zeros(L, dtype=torch.long)
    for k, b in enumerate(blk.unique().tolist()):
        cols = (blk == b).nonzero()[:, 0]
        cs[cols] = k * steps + torch.randint(0, steps, (cols.numel(),), generator=g)
    return cs[None]


def run(bs: int, args) -> dict:
    a = build_tiny(block_size=bs, max_positions=1024, seed=0)
    g = torch.Generator().manual_seed(bs)
    v = len(a.tokenizer)
    prompt = torch.randint(10, v - 1, (1, args.prompt), generator=g)
    pmask = torch.ones_like(prompt, dtype=torch.bool)
    clean = torch.randint(10, v - 1, (1, args.length), generator=g)
    hide = torch.rand(clean.shape, generator=g) < 0.5
    noisy = torch.where(hide, a.mask_id, clean)
    rows, cols = hide.nonzero(as_tuple=True)
    tg = clean[rows, cols]
    out = {"elbo_row": {}, "state": {}}
    e = out["elbo_row"]
    e["doubled"] = measure(lambda: score_blocks(a, prompt, pmask, noisy, clean, rows, cols, tg), args.repeats)
    e["per_block"] = measure(lambda: per_block_loop(a, prompt[0], clean[0], noisy[0], cols), args.slow_repeats)
    e["plain"] = measure(lambda: score_positions(a, prompt, pmask, noisy, rows, cols, tg), args.repeats)
    with torch.no_grad():
        d = score_blocks(a, prompt, pmask, noisy, clean, rows, cols, tg)
        e["max_abs_diff"] = float((d - per_block_loop(a, prompt[0], clean[0], noisy[0], cols)).abs().max())
        e["per_block"]["forwards"] = int(((args.prompt + cols) // bs).unique().numel())
    # the state likelihood of a block-by-block rollout
    cs = block_rollout_steps(args.prompt, args.length, bs, args.steps_per_block, g)
    ordered, rank = block_rounds(cs, pmask, bs)
    assert bool(ordered.all())
    n_rounds, n_states = int(rank.max()) + 1, int(cs.unique().numel())
    r_rounds, c_all = torch.arange(n_rounds).repeat_interleave(args.length), torch.arange(args.length).repeat(n_rounds)
    keep = rank[0, c_all] == r_rounds
    r_rounds, c_all = r_rounds[keep], c_all[keep]
    x_rounds = torch.where(rank[0][None] >= torch.arange(n_rounds)[:, None], a.mask_id, clean)  # [R, L]
    steps = cs[0].unique()
    x_states = torch.where(cs[0][None] >= steps[:, None], a.mask_id, clean)  # [S, L]
    s_of = torch.searchsorted(steps, cs[0])
    s = out["state"]
    s["rounds"] = measure(lambda: score_blocks(a, prompt.expand(n_rounds, -1), pmask.expand(n_rounds, -1), x_rounds,
                                               clean.expand(n_rounds, -1), r_rounds, c_all, clean[0, c_all]), args.repeats)
    s["per_state"] = measure(lambda: score_positions(a, prompt.expand(n_states, -1), pmask.expand(n_states, -1),
                                                     x_states, s_of, torch.arange(args.length), clean[0]),
                               args.slow_repeats)
    s["rounds"]["rows"], s["per_state"]["rows"] = n_rounds, n_states
    with torch.no_grad():
        lr = score_blocks(a, prompt.expand(n_rounds, -1), pmask.expand(n_rounds, -1), x_rounds,
                          clean.expand(n_rounds, -1), r_rounds, c_all, clean[0, c_all])
        ls = score_positions(a, prompt.expand(n_states, -1), pmask.expand(n_states, -1), x_states, s_of,
                             torch.arange(args.length), clean[0])
        order = torch.argsort(c_all)
        s["max_abs_diff"] = float((lr[order] - ls).abs().max())
    for part in (e, s):
        names = [k for k in part if isinstance(part[k], dict)]
        base = part[names[0]]
        for k in names[1:]:
            part[k]["flops_ratio_to_" + names[0]] = part[k]["flops_forward_backward"] / base["flops_forward_backward"]
            part[k]["time_ratio_to_" + names[0]] = part[k]["seconds_forward_backward"] / base["seconds_forward_backward"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=29)
    ap.add_argument("--blocks", type=int, nargs="+", default=[32, 4])
    ap.add_argument("--steps-per-block", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slow-repeats", type=int, default=1, help="timed runs of the loops (per_block, per_state)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    res = {"config": vars(args), "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
           "model": "build_tiny(): hidden 128, 4 layers, 4 heads, fp32", "block_size": {}}
    for bs in args.blocks:
        res["block_size"][str(bs)] = run(bs, args)
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
