"""The FSDP rehearsal's parts that run inside its processes (``rehearse_fsdp.py --child single|fsdp|reference``):
the recipe reduced to one prompt per process, the trainer built on one process or sharded by FSDP2, the
gradients, updates and rollouts each child records, and the sampler checks."""
from __future__ import annotations

import dataclasses
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

from rehearse_launch import GIB, load_recipe, rehearsal_overrides
from rehearse_memory import proc_status, reset_peak

GROUP = 2            # rollouts per prompt; one prompt per process
WORLD = 2
SAMPLE_SEED = 1234   # the sampler check's generator seed on rank r: SAMPLE_SEED + r
CACHES = ("prefix", "dual")     # a full-attention model's KV caches; a block model's: BLOCK_CACHES
BLOCK_CACHES = ("none", "block")
ROLLOUT_FIELDS = ("completion_ids", "completion_mask", "commit_step", "num_steps")


class Phases:
    """Seconds and peak resident memory of named phases of this process (``VmHWM`` reset at each start)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}

    @contextmanager
    def __call__(self, name: str):
        reset_peak()
        t0 = time.time()
        yield
        st = proc_status()
        self.rows[name] = {"seconds": round(time.time() - t0, 2), "peak_rss_gib": round(st.get("VmHWM", 0) / GIB, 3),
                           "rss_end_gib": round(st.get("VmRSS", 0) / GIB, 3)}

    def peak(self) -> float:
        """The largest phase peak (GiB)."""
        return max((r["peak_rss_gib"] for r in self.rows.values()), default=0.0)


def fsdp_overrides(shipped, standin: Path, out_dir: Path) -> list[str]:
    """The rehearsal's overrides (``rehearse_launch.rehearsal_overrides``), μ = 1 and micro-batches of G rows."""
    return rehearsal_overrides(shipped, standin, out_dir, steps=1, group_size=GROUP, mu_cap=1) + [
        f"train.micro_batch_size={GROUP}", "train.max_forward_rows=0"]


def pick_examples(policy, fmt, rows, n: int = WORLD) -> list:
    """The ``n`` training rows with the shortest formatted prompts (ties: the earlier row)."""
    from maskrl.text import encode_prompts

    lengths = [int(encode_prompts(policy.tokenizer, [fmt(ex.prompt)])[1].sum()) for ex in rows]
    order = sorted(range(len(rows)), key=lambda i: (lengths[i], i))[:n]
    return [rows[i] for i in sorted(order)]


def build_trainer(cfg, accelerator=None) -> tuple:
    """``(trainer, examples, block class name)``: the recipe's model and trainer, as ``maskrl train`` builds them."""
    from maskrl.pipeline import load_policy, prompt_formatter, task_and_data
    from maskrl.trainer import RLTrainer

    task, _, _, train = task_and_data(cfg)
    policy = load_policy(cfg)
    block = type(policy.model.get_decoder().layers[0]).__name__  # before any wrapping
    fmt = prompt_formatter(policy, cfg.model.chat_template)
    examples = pick_examples(policy, fmt, train)
    tr = RLTrainer(cfg, policy, task, train, prompt_fn=fmt, accelerator=accelerator)
    return tr, examples, block


def trainable(model) -> dict:
    """Every trainable tensor by parameter name, full (a sharded one is gathered: a collective)."""
    out = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            out[name] = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
    return out


def capture_grads(trainer) -> dict:
    """A dict that the trainer's next gradient clipping fills with every trainable tensor's gradient, full
    (gathered: a collective) and before clipping, by parameter name."""
    names = {id(p): n for n, p in trainer.policy.model.named_parameters() if p.requires_grad}
    grads: dict = {}
    clip = trainer.acc.clip_grad_norm_

    def recording(parameters, *args, **kwargs):
        parameters = list(parameters)
        for p in parameters:
            if id(p) in names and p.grad is not None:
                g = p.grad
                grads[names[id(p)]] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
        return clip(parameters, *args, **kwargs)

    trainer.acc.clip_grad_norm_ = recording
    return grads


def share(batch, rank: int, world: int = WORLD):
    """Rank ``rank``'s contiguous share of the saved batch.

    Raises:
        NotImplementedError: the batch carries credit-module loss terms (not split here).
    """
    if batch.terms:
        raise NotImplementedError("rehearse_fsdp: a batch with credit-module loss terms (batch.terms) is not split")
    n = batch.rollout.batch_size // world
    sl = slice(rank * n, (rank + 1) * n)
    tr = batch.task_rewards[sl] if batch.task_rewards is not None else None
    return dataclasses.replace(batch, rollout=batch.rollout.select(sl), rewards=batch.rewards[sl],
                               advantages=batch.advantages[sl], loss_mask=batch.loss_mask[sl],
                               completions=batch.completions[sl], task_rewards=tr)


def sampler_config(cfg, cache: str):
    return dataclasses.replace(cfg.rollout, cache=cache)


def caches_of(cfg) -> tuple[str, ...]:
    """The caches the sampler check runs: a block model's recipe (``rollout.cache: block``) recomputation and
    the exact block cache, else the approximate prefix and dual caches."""
    return BLOCK_CACHES if cfg.rollout.cache == "block" else CACHES


def buffers(model, part: str = "expert_bias") -> dict:
    """Every buffer whose name holds ``part`` (the router's expert bias), full, by name."""
    return {n: (b.full_tensor() if hasattr(b, "full_tensor") else b).detach().clone()
            for n, b in model.named_buffers() if part in n}


def _cfg(args):
    return load_recipe(args.recipe, json.loads(args.overrides_json))


def child_single(args) -> dict:
    """1 process: the fixed batch of rollouts and the 1-process update (module docstring, ``single``)."""
    import torch

    cfg, work, ph = _cfg(args), Path(args.work), Phases()
    with ph("load"):
        tr, examples, block = build_trainer(cfg)
    with ph("collect"):
        batch = tr.collect(examples)
    out = {"examples": [ex.id for ex in examples], "block_class": block, "rewards": batch.rewards.tolist(),
           "prompt_tokens": batch.rollout.prompt_mask.sum(1).tolist(),
           "completion_tokens": batch.rollout.completion_mask.sum(1).tolist(), "advantages": "collected"}
    per_rank = batch.advantages.reshape(WORLD, -1).abs().sum(1)  # [WORLD]: one group per rank
    if not bool((per_rank > 0).all()):  # a share whose group's rewards tie trains nothing: unseen by the check
        n = batch.rollout.batch_size
        adv = torch.linspace(-1.0, 1.0, n)[:, None] * batch.loss_mask.float()  # [N, L]
        batch = dataclasses.replace(batch, advantages=adv)
        out["advantages"] = "fixed pattern linspace(-1, 1, N) x loss mask (a group's rewards tied)"
    torch.save(batch, work / "batch.pt")
    init, grads, bias = trainable(tr.policy.model), capture_grads(tr), buffers(tr.policy.model)
    with ph("optimize"):
        metrics = tr.optimize(batch)
    out["expert_bias_unchanged"] = all(torch.equal(b, buffers(tr.policy.model)[n]) for n, b in bias.items())
    torch.save({"init": init, "weights": trainable(tr.policy.model), "grads": grads}, work / "single.pt")
    tr.close()
    out.update(metrics={k: v for k, v in metrics.items() if "seconds" not in k}, phases=ph.rows,
               peak_rss_gib=ph.peak())
    return out


def fsdp_accelerator(cfg):
    """A gloo group from the launcher's variables and an accelerator on accelerate's FSDP2 path."""
    from datetime import timedelta

    from accelerate import Accelerator, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    from maskrl.training.metrics_log import tracker_kwargs

    PartialState(cpu=True, timeout=timedelta(seconds=float(os.environ.get("MASKRL_REHEARSE_DIST_TIMEOUT", "1800"))))
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True,
                                            auto_wrap_policy="transformer_based_wrap", state_dict_type="FULL_STATE_DICT")
    acc = Accelerator(cpu=True, fsdp_plugin=plugin, **tracker_kwargs(cfg))
    # accelerate sets FSDP for GPU process types only; here after the group starts, on the accelerator
    # state and on the process state under it (tests/dist_worker.py, fsdp_state, says why both)
    acc.state.distributed_type = DistributedType.FSDP
    acc.state.fsdp_plugin = plugin
    PartialState().distributed_type = DistributedType.FSDP
    return acc


def wrap_record(model, block: str) -> dict:
    """The FSDP units (module name -> wrapped class), whether every ``block`` module is one, and this
    rank's local shard of every LoRA tensor against its full size."""
    from torch.distributed.fsdp import FSDPModule

    units = {n: type(m).__name__.removeprefix("FSDP") for n, m in model.named_modules() if isinstance(m, FSDPModule)}
    blocks = sorted(n for n, m in model.named_modules() if type(m).__name__.removeprefix("FSDP") == block)
    lora = {}
    for name, p in model.named_parameters():
        if "lora_" in name:
            local = p.to_local() if hasattr(p, "to_local") else p
            lora[name] = {"full": list(p.shape), "local": list(local.shape), "dtype": str(local.dtype),
                          "dtensor": hasattr(p, "to_local")}
    full = sum(_numel(v["full"]) for v in lora.values())
    local = sum(_numel(v["local"]) for v in lora.values())
    experts = {n: p for n, p in model.named_parameters() if ".mlp.experts." in n}
    in_root = sorted(n for n, _ in model.named_parameters() if not any(u and n.startswith(u + ".") for u in units))
    return {"units": units, "root_params": in_root, "block_class": block, "blocks": blocks,
            "every_block_a_unit": bool(blocks) and all(b in units for b in blocks),
            "lora_tensors": len(lora), "lora_numel_full": full, "lora_numel_local": local,
            "lora_all_dtensors": all(v["dtensor"] for v in lora.values()),
            "lora_examples": dict(list(lora.items())[:4]),
            "expert_tensors": len(experts), "experts_all_dtensors": all(hasattr(p, "to_local") for p in experts.values()),
            "experts_numel_full": sum(p.numel() for p in experts.values()),
            "experts_numel_local": sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in experts.values()),
            "trainable_expert_bias": sorted(n for n, p in model.named_parameters() if "expert_bias" in n and p.requires_grad),
            "gradient_checkpointing": any(getattr(m, "gradient_checkpointing", False) for m in model.modules())}


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def sample(adapter, ids, mask, cfg, rank: int, all_done=None, ranks_max=None) -> tuple:
    """One KV-cached rollout of ``ids`` under generator seed ``SAMPLE_SEED + rank``; (rollout, decoder forwards)."""
    import torch

    from maskrl.sampling import generate

    calls = []
    hook = adapter.model.get_decoder().register_forward_pre_hook(lambda *_: calls.append(1))
    gen = torch.Generator().manual_seed(SAMPLE_SEED + rank)
    try:
        with torch.no_grad():
            ro = generate(adapter, ids, mask, cfg, generator=gen, all_done=all_done, ranks_max=ranks_max)
    finally:
        hook.remove()
    return ro, len(calls)


def child_fsdp(args) -> dict:
    """One rank of the FSDP2 run (module docstring, ``fsdp``)."""
    import torch

    cfg, work, ph = _cfg(args), Path(args.work), Phases()
    rank = int(os.environ["RANK"])
    with ph("load_and_wrap"):
        acc = fsdp_accelerator(cfg)
        tr, _, block = build_trainer(cfg, accelerator=acc)
    out = {"rank": rank, "distributed_type": str(acc.distributed_type), "model_class": type(tr.policy.model).__name__,
           "wrap": wrap_record(tr.policy.model, block)}
    batch = torch.load(work / "batch.pt", weights_only=False)
    mine, grads, bias = share(batch, rank), capture_grads(tr), buffers(tr.policy.model)
    with ph("optimize"):
        metrics = tr.optimize(mine)
    out["expert_bias_unchanged"] = all(torch.equal(b, buffers(tr.policy.model)[n]) for n, b in bias.items())
    with ph("gather"):
        weights = trainable(tr.policy.model)
    if rank == 0:
        torch.save(weights, work / "fsdp_weights.pt")
        torch.save(grads, work / "fsdp_grads.pt")
    del weights, grads
    rollouts, calls = {}, {}
    for cache in caches_of(cfg):
        with ph(f"sample_{cache}"):
            rollouts[cache], calls[cache] = sample(tr.policy_eval, mine.rollout.prompt_ids, mine.rollout.prompt_mask,
                                                   sampler_config(cfg, cache), rank, tr.all_done, tr.ranks_max)
    torch.save(rollouts, work / f"fsdp_rollouts{rank}.pt")
    tr.close()
    acc.wait_for_everyone()
    torch.distributed.destroy_process_group()
    out.update(metrics={k: v for k, v in metrics.items() if "seconds" not in k}, decoder_forwards=calls,
               distributed_type_at_end=str(acc.distributed_type),
               phases=ph.rows, peak_rss_gib=ph.peak())
    return out


def _rollout_diff(a, b) -> dict:
    eq = {f: bool(torch_equal(getattr(a, f), getattr(b, f))) for f in ROLLOUT_FIELDS}
    prob = float((a.commit_prob.float() - b.commit_prob.float()).abs().max())
    return {"equal": all(eq.values()), "fields_equal": eq, "commit_prob_max_abs_diff": prob}


def torch_equal(a, b) -> bool:
    import torch

    return a.shape == b.shape and torch.equal(a, b)


def child_reference(args) -> dict:
    """1 process: the unsharded model with the FSDP run's (then the 1-process run's) tensors loaded, sampling
    each rank's prompts with that rank's seed, no hooks (module docstring, ``reference``)."""
    import torch

    from maskrl.pipeline import load_policy

    cfg, work, ph = _cfg(args), Path(args.work), Phases()
    with ph("load"):
        policy = load_policy(cfg)
        policy.model.eval()
    batch = torch.load(work / "batch.pt", weights_only=False)
    got = [torch.load(work / f"fsdp_rollouts{r}.pt", weights_only=False) for r in range(WORLD)]
    sources = {"fsdp_update": torch.load(work / "fsdp_weights.pt", weights_only=False),
               "single_update": torch.load(work / "single.pt", weights_only=False)["weights"]}
    out: dict = {}
    a, b = sources.values()
    if a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a):
        del sources["single_update"]
        out["single_update"] = "not sampled: bitwise equal to the FSDP update, so are its completions"
    for src, weights in sources.items():
        res = policy.model.load_state_dict(weights, strict=False)
        missing = [k for k in weights if k in res.unexpected_keys]
        if missing:
            raise KeyError(f"reference: {len(missing)} trainable tensors have no parameter here, e.g. {missing[0]}")
        rows = {}
        for cache in caches_of(cfg):
            with ph(f"{src}_sample_{cache}"):
                for r in range(WORLD):
                    mine = share(batch, r)
                    ro, n = sample(policy, mine.rollout.prompt_ids, mine.rollout.prompt_mask,
                                   sampler_config(cfg, cache), r)
                    rows[f"{cache}_rank{r}"] = {**_rollout_diff(ro, got[r][cache]), "decoder_forwards": n,
                                                "completion_ids": ro.completion_ids.tolist()}
        out[src] = rows
    out.update(phases=ph.rows, peak_rss_gib=ph.peak())
    return out
