"""Worker processes of ``tests/test_distributed.py`` (not collected by pytest: no ``test_`` prefix).

``python tests/dist_worker.py single OUT`` -- one process: builds the tiny model and the trainer,
collects one batch, rigs it (see :func:`rig`), saves it to ``OUT/batch.pt``, runs ``optimize`` on the
whole batch and saves the updated weights to ``OUT/single.pt``.

``python tests/dist_worker.py multi OUT`` -- one rank of a multi-process gloo run (the launcher sets
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; the
trainer's ``Accelerator(cpu=True)`` then starts a ``MULTI_CPU`` gloo group). Each rank runs
``optimize`` on its contiguous share of ``OUT/batch.pt``, logs and checkpoints into its own
``OUT/rank{r}`` folder (so a write by a non-main rank cannot hide behind rank 0's file), then runs
the sampler-synchronisation scenario (:func:`sampling_scenario`). Results go to ``OUT/multi{r}.pt``.

``python tests/dist_worker.py fsdp OUT`` -- one rank of the same launch with the trainer's model under
FSDP2 (:func:`run_fsdp`): ``optimize`` on this rank's share, then the KV-cached sampler on the sharded
model. Results go to ``OUT/fsdp{r}.pt``.

``python tests/dist_worker.py resume OUT`` -- one rank of a launch that trains, checkpoints and
resumes (:func:`run_resume`): the resumed run against the uninterrupted one. Results go to
``OUT/resume{r}.pt``.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from maskrl.config import RunConfig, TinyModelConfig, TrainConfig
from maskrl.models import ModelAdapter, build_tiny
from maskrl.sampling import SamplerConfig, generate
from maskrl.tasks.base import Example, Task
from maskrl.trainer import Batch, RLTrainer, all_ranks_done

N_PROMPTS, GROUP = 4, 2          # N = 8 rows in the global batch
MICRO = 4                        # = N / 2: the 2-process run has one micro-batch per rank
SHAPE = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
# valid completion lengths per row: rank 0's half holds many more loss tokens than rank 1's, so a
# per-rank (instead of global) token normaliser would change the update direction
LENGTHS = [16, 15, 16, 12, 3, 5, 1, 4]


class ConstantTask(Task):
    """Reward 0 everywhere: the test sets the advantages itself (:func:`rig`)."""

    name = "constant"

    def reward(self, prompts, completions, **_):
        return [0.0] * len(completions)


def examples() -> list[Example]:
    """Prompts of different lengths (so the batch is left-padded)."""
    texts = ["2+2=", "sudoku 4x4: 1020 0301", "abc", "a longer prompt with padding"]
    return [Example(id=i, prompt=t, fields={}) for i, t in enumerate(texts)]


def make_cfg(out_dir: Path) -> RunConfig:
    return RunConfig(
        output_dir=str(out_dir), model=dataclasses.replace(RunConfig().model, tiny=SHAPE),
        rollout=SamplerConfig(gen_length=16, block_length=8, steps=8, temperature=0.9),
        train=TrainConfig(prompts_per_step=N_PROMPTS, group_size=GROUP, inner_iterations=2,
                          micro_batch_size=MICRO, lr=1e-3, max_grad_norm=1.0, seed=3),
    )


def make_trainer(out_dir: Path, accelerator=None) -> RLTrainer:
    cfg = make_cfg(out_dir)
    policy = build_tiny(hidden_size=SHAPE.hidden_size, num_layers=SHAPE.num_layers, num_heads=SHAPE.num_heads,
                        intermediate_size=SHAPE.intermediate_size, seed=SHAPE.seed)
    return RLTrainer(cfg, policy, ConstantTask(), examples(), accelerator=accelerator)


def rig(batch: Batch) -> Batch:
    """Deterministic non-zero advantages and uneven valid lengths (see :data:`LENGTHS`)."""
    ro = batch.rollout
    n, L = ro.completion_ids.shape
    mask = torch.arange(L)[None, :] < torch.tensor(LENGTHS)[:, None]  # [N, L]
    adv = torch.linspace(-1.0, 1.5, n)[:, None] * mask.float()  # [N, L]
    return dataclasses.replace(batch, rollout=dataclasses.replace(ro, completion_mask=mask), advantages=adv,
                               loss_mask=mask)


def weights(trainer: RLTrainer) -> dict[str, torch.Tensor]:
    """The full weights (an FSDP2 shard is gathered: a collective, every rank must call it)."""
    model = trainer.acc.unwrap_model(trainer.policy.model)
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in model.state_dict().items()}


def run_single(out: Path) -> None:
    tr = make_trainer(out / "single_run")
    init = weights(tr)
    batch = rig(tr.collect(examples()))
    torch.save(batch, out / "batch.pt")
    metrics = tr.optimize(batch)
    torch.save({"init": init, "weights": weights(tr), "metrics": metrics}, out / "single.pt")


# ---------------------------------------------------------------------------------------- sampling
PEAK = 5  # first prompt token that makes ToyLM's rows confident


class ToyLM(torch.nn.Module):
    """Logits from the input ids alone, counting forwards.

    Rows whose first token is :data:`PEAK` put logit 20 on one token per position (p ≈ 1: the
    threshold schedule commits a whole block per step); other rows put logit 1 on it (p ≈ 0.15 with
    V = 16: one commit per step). So peaked rows need ``L/b`` steps, flat rows ``L``.
    """

    vocab = 16

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(()))
        self.calls = 0

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
        self.calls += 1
        n, t = input_ids.shape
        target = 6 + torch.arange(t) % 8  # [T] never eos / mask
        height = torch.where(input_ids[:, :1] == PEAK, 20.0, 1.0)  # [n, 1]
        logits = torch.zeros(n, t, self.vocab)
        logits.scatter_(2, target.expand(n, t)[..., None], height[..., None].expand(n, t, 1))
        return SimpleNamespace(logits=logits + self.bias)


def sampling_scenario(trainer: RLTrainer) -> dict:
    """Rank 0 decodes peaked rows (2 steps), other ranks flat rows (8 steps); with and without sync."""
    rank = trainer.acc.process_index
    first = PEAK if rank == 0 else 7
    ids = torch.tensor([[first, 8, 9], [first, 9, 8]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    toy = ToyLM()
    adapter = ModelAdapter(model=toy, mask_id=3, eos_id=2, pad_id=0)
    cfg = SamplerConfig(gen_length=8, block_length=4, schedule="threshold", threshold=0.9)
    plain = generate(adapter, ids, mask, cfg)
    plain_calls, toy.calls = toy.calls, 0
    synced = generate(adapter, ids, mask, cfg, all_done=all_ranks_done(trainer.acc))
    return {"plain": plain, "plain_calls": plain_calls, "synced": synced, "synced_calls": toy.calls}


def cached_scenario(trainer: RLTrainer, adapter: ModelAdapter | None = None, plain_adapter: ModelAdapter | None = None
                    ) -> dict:
    """The KV-cached sampler (prefix and dual): rank 0 commits a whole block per step (threshold 0.01),
    the others one token per step (threshold 1.0); decoder forwards counted, without the trainer's
    ``ranks_max`` hook (on ``plain_adapter``, default ``adapter``) and with it (on ``adapter``, default a
    fresh tiny Llama). Under FSDP the unhooked run must use an unsharded copy: there every forward is
    a collective and unequal counts would hang."""
    from maskrl.models import build_tiny
    from maskrl.trainer import ranks_max

    rank = trainer.acc.process_index
    adapter = adapter or build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, seed=0)
    plain_adapter = plain_adapter or adapter
    calls = []
    hooks = [a.model.get_decoder().register_forward_pre_hook(lambda *_: calls.append(1))
             for a in {id(adapter): adapter, id(plain_adapter): plain_adapter}.values()]
    ids = torch.tensor([[5, 6, 7], [7, 6, 5]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    out = {}
    with torch.no_grad():
        for cache in ("prefix", "dual"):
            cfg = SamplerConfig(gen_length=8, block_length=4, schedule="threshold",
                                threshold=0.01 if rank == 0 else 1.0, cache=cache)
            plain = generate(plain_adapter, ids, mask, cfg)
            n_plain = len(calls)
            calls.clear()
            synced = generate(adapter, ids, mask, cfg, all_done=all_ranks_done(trainer.acc),
                              ranks_max=ranks_max(trainer.acc))
            out[cache] = {"plain": plain, "plain_calls": n_plain, "synced": synced, "synced_calls": len(calls)}
            calls.clear()
    for h in hooks:
        h.remove()
    return out


def start_group() -> tuple[int, int]:
    """Start the gloo group from the launcher's variables, with a short timeout so that a failed
    rendezvous or a hung collective ends the run instead of waiting 30 min (the trainer's Accelerator
    reuses this state); ``(rank, world size)``."""
    from datetime import timedelta

    from accelerate import PartialState

    PartialState(cpu=True, timeout=timedelta(seconds=float(os.environ.get("MASKRL_TEST_DIST_TIMEOUT", "60"))))
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def end_group() -> None:
    """End a worker process once its results are saved: wait for every rank, tear the gloo group down, and
    leave with ``os._exit(0)`` (stdout / stderr flushed) instead of returning. Returning frees the trainer,
    whose DDP ``Reducer`` holds the last reference to the destroyed group: ``~ProcessGroupGloo`` then joins
    gloo's run-loop thread while holding the GIL, and when that thread is still freeing a finished
    all-gather (its tensors' Python references need the GIL) the two wait on each other for ever. Seen about
    once in 40 launches (rank idle at exit after both ranks wrote their results; native stack: pybind11
    ``dealloc`` of ``c10d::Reducer`` -> ``~ProcessGroupGloo`` -> ``std::thread::join``, the run loop in
    ``~AsyncAllgatherWork`` -> ``gil_scoped_acquire``); left to interpreter shutdown, gloo's threads also
    aborted finished processes ("terminate called without an active exception", exit -6)."""
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def local_share(out: Path, rank: int, world: int) -> Batch:
    """This rank's contiguous share of the 1-process run's batch (``OUT/batch.pt``)."""
    batch: Batch = torch.load(out / "batch.pt", weights_only=False)
    share = batch.rollout.batch_size // world
    sl = slice(rank * share, (rank + 1) * share)
    return Batch(rollout=batch.rollout.select(sl), rewards=batch.rewards[sl], advantages=batch.advantages[sl],
                 completions=batch.completions[sl], loss_mask=batch.loss_mask[sl])


def run_multi(out: Path) -> None:
    rank, world = start_group()
    tr = make_trainer(out / f"rank{rank}")
    assert tr.acc.num_processes == world and tr.acc.process_index == rank, "accelerate did not start the group"
    metrics = tr.optimize(local_share(out, rank, world))
    result = {"rank": rank, "metrics": metrics, "distributed_type": str(tr.acc.distributed_type)}
    if tr.acc.is_main_process:
        result["weights"] = weights(tr)
    # only the main process may write logs and the shared checkpoint files
    tr.step_count = 1
    tr.log({"step": 1, **metrics})
    tr.save_checkpoint(out / f"rank{rank}" / "checkpoints" / "step_1")
    tr.close()
    # the trainer's collect() passes the rank hook to the sampler: count its calls on each rank
    calls = []
    hook = tr.all_done
    tr.all_done = lambda finished: calls.append(finished) or hook(finished)
    tr.collect(examples()[:2])
    result["collect_all_done_calls"] = len(calls)
    result.update(sampling_scenario(tr))
    result["cached"] = cached_scenario(tr)
    result["interrupt"] = interrupt_scenario(tr, out / "interrupt", rank)
    torch.save(result, out / f"multi{rank}.pt")
    end_group()


def fsdp_state(acc, plugin) -> None:
    """Set the started group's accelerator state to FSDP with ``plugin``, where accelerate's own state sets it
    on GPU process types: on the accelerator state and on the process state underneath. The second matters:
    every later ``AcceleratorState()`` (the optimizer's wrapper builds one in ``prepare``) copies the process
    state's type over its own, and would turn FSDP back into ``MULTI_CPU`` for ``no_sync``, clipping and
    any later ``prepare``."""
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    acc.state.distributed_type = DistributedType.FSDP
    acc.state.fsdp_plugin = plugin
    PartialState().distributed_type = DistributedType.FSDP  # what AcceleratorState.__init__ does on GPU


def run_fsdp(out: Path) -> None:
    """One rank of the FSDP2 run: the trainer's model sharded by accelerate's own FSDP2 preparation
    (``fsdp2_prepare_model``: each decoder layer, the embedding, the tail and the root), ``optimize`` on
    this rank's share of ``OUT/batch.pt``, then the KV-cached sampler on the sharded model.

    accelerate turns its FSDP plugin on for GPU process types only (``AcceleratorState`` keeps
    ``MULTI_CPU`` with ``cpu=True``); the worker sets the state's type to FSDP after the group has
    started (:func:`fsdp_state`), so that ``Accelerator.prepare`` takes its FSDP2 path on CPU / gloo, which
    torch supports."""
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin

    rank, world = start_group()
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True,
                                            auto_wrap_policy="transformer_based_wrap", state_dict_type="FULL_STATE_DICT")
    from maskrl.trainer import tracker_kwargs

    acc = Accelerator(cpu=True, fsdp_plugin=plugin, **tracker_kwargs(make_cfg(out / f"fsdp_rank{rank}")))
    fsdp_state(acc, plugin)
    tr = make_trainer(out / f"fsdp_rank{rank}", accelerator=acc)
    from torch.distributed.fsdp import FSDPModule

    sharded = sorted(n for n, m in tr.policy.model.named_modules() if isinstance(m, FSDPModule))
    metrics = tr.optimize(local_share(out, rank, world))
    full = weights(tr)
    result = {"rank": rank, "metrics": metrics, "model_class": type(tr.policy.model).__name__, "sharded": sharded,
              "weights": full if rank == 0 else None, "distributed_type": str(acc.distributed_type)}
    # the unhooked reference run on an unsharded copy with the same (updated) weights
    plain = build_tiny(hidden_size=SHAPE.hidden_size, num_layers=SHAPE.num_layers, num_heads=SHAPE.num_heads,
                       intermediate_size=SHAPE.intermediate_size, seed=SHAPE.seed)
    plain.model.load_state_dict(full)
    result["cached"] = cached_scenario(tr, adapter=tr.policy_eval, plain_adapter=plain)
    result["lora"] = lora_scenario(tr)
    torch.save(result, out / f"fsdp{rank}.pt")
    end_group()


def lora_adapter() -> ModelAdapter:
    """A tiny model built as the 8B recipes build theirs: bf16 base, fp32 LoRA on every linear layer
    (peft), with non-zero ``B`` matrices drawn from a fixed generator (so that the adapters act)."""
    from maskrl.models import apply_lora

    adapter = build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, seed=0)
    for p in adapter.model.parameters():
        p.data = p.data.to(torch.bfloat16)
    adapter = apply_lora(adapter, rank=4, alpha=8.0, target_modules="all-linear", seed=0)
    gen = torch.Generator().manual_seed(1)
    for name, p in adapter.model.named_parameters():
        if "lora_B" in name:
            p.data = 0.1 * torch.randn(p.shape, generator=gen)
    return adapter


def lora_scenario(trainer: RLTrainer) -> dict:
    """A fresh peft model (:func:`lora_adapter`) sharded by the trainer's FSDP2 accelerator, whose first
    forward is the KV-cached sampler's (:func:`cached_scenario`, against an unsharded copy). accelerate's
    wrap leaves this model's final norm in the root unit (it looks for the norm under the peft wrapper's
    forwarded ``base_model_prefix``), so the cached path must enter through the root's forward."""
    from torch.distributed.fsdp import FSDPModule

    sharded = lora_adapter()
    sharded = dataclasses.replace(sharded, model=trainer.acc.unwrap_model(trainer.acc.prepare(sharded.model)))
    units = sorted(n for n, m in sharded.model.named_modules() if isinstance(m, FSDPModule))
    in_root = sorted(n for n, _ in sharded.model.named_parameters()
                     if not any(u and n.startswith(u + ".") for u in units))
    lora = [(list(p.shape), list(p.to_local().shape), p.dtype)
            for n, p in sharded.model.named_parameters() if "lora_" in n]
    return {"units": units, "root_params": in_root, "lora_shards": lora,
            "cached": cached_scenario(trainer, adapter=sharded, plain_adapter=lora_adapter())}


def interrupt_scenario(trainer: RLTrainer, out_dir: Path, rank: int) -> dict:
    """SIGTERM to rank 1 alone, during the first step of ``train``: every rank must finish that step,
    save one checkpoint together and stop (``TrainingInterrupted``), not hang in a collective."""
    import signal

    from maskrl.trainer import TrainingInterrupted

    trainer.out_dir = out_dir
    trainer.tc.eval_every = 1  # eval_fn runs inside the loop, after the signal handlers are installed
    trainer.eval_fn = lambda step: (os.kill(os.getpid(), signal.SIGTERM) if rank == 1 else None) or {}
    start = trainer.step_count
    try:
        trainer.train(steps=3, progress=False)
    except TrainingInterrupted as e:
        return {"start": start, "step": e.step, "signum": int(e.signum), "checkpoint": str(e.checkpoint)}
    return {"start": start, "step": None}


# ------------------------------------------------------------------------------------------ resume
RESUME_EXAMPLES = 8  # 2 of 8 prompts per step and process: the two ranks' streams draw different ones


def resume_trainer(out_dir: Path) -> RLTrainer:
    """A small run whose rows and rewards vary (``OddChars``, μ = 2), recording what each step draws on
    this process: ``tr.drawn_prompts`` (example ids) and ``tr.drawn_completions`` (``[N, L]``)."""
    from conftest import OddChars

    cfg = RunConfig(output_dir=str(out_dir), model=dataclasses.replace(RunConfig().model, tiny=SHAPE),
                    rollout=SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=1.0),
                    train=TrainConfig(prompts_per_step=2, group_size=2, inner_iterations=2, lr=1e-3, seed=5,
                                      steps=3, save_every=0, report_to=[]))
    policy = build_tiny(hidden_size=SHAPE.hidden_size, num_layers=SHAPE.num_layers, num_heads=SHAPE.num_heads,
                        intermediate_size=SHAPE.intermediate_size, seed=SHAPE.seed)
    tr = RLTrainer(cfg, policy, OddChars(), [Example(id=i, prompt=f"say a {i}", fields={})
                                             for i in range(RESUME_EXAMPLES)])
    tr.drawn_prompts, tr.drawn_completions = [], []
    sample, collect = tr.sample_prompts, tr.collect

    def recording_sample():
        picked = sample()
        tr.drawn_prompts.append([ex.id for ex in picked])
        return picked

    def recording_collect(examples=None):
        batch = collect(examples)
        tr.drawn_completions.append(batch.rollout.completion_ids.clone())
        return batch

    tr.sample_prompts, tr.collect = recording_sample, recording_collect
    return tr


def record(tr: RLTrainer, history: list[dict]) -> dict:
    """What a run drew and produced on this process: per step the prompt ids and completions, the
    metrics and ``metrics.jsonl``'s rows (main process) without wall-clock fields, and the weights."""
    import json

    def stable(m: dict) -> dict:
        return {k: v for k, v in m.items() if "seconds" not in k}

    path = tr.out_dir / "metrics.jsonl"
    rows = [stable(json.loads(line)) for line in path.read_text().splitlines()] if tr.acc.is_main_process else []
    return {"prompts": tr.drawn_prompts, "completions": tr.drawn_completions, "metrics": [stable(m) for m in history],
            "metrics_jsonl": rows, "weights": weights(tr)}


def run_resume(out: Path) -> None:
    """Exact resume on several processes: an uninterrupted 3-step run (``full``); the same run stopped
    after step 1 with a checkpoint and continued by a new trainer for steps 2-3 (``resumed``); and a
    new trainer resumed for one step from that checkpoint rewritten in the layout of earlier maskrl
    versions, process 0's streams only (``legacy``). Results: ``OUT/resume{r}.pt``."""
    rank, _ = start_group()
    full = resume_trainer(out / "resume_full")
    init = weights(full)
    result = {"full": record(full, full.train(progress=False, catch_signals=False)), "init": init}
    full.close()
    part = resume_trainer(out / "resume_part")
    part.train(steps=1, progress=False, catch_signals=False)
    ckpt = part.save_checkpoint(part.out_dir / "checkpoints" / "step_1")
    part.close()
    resumed = resume_trainer(out / "resume_part")
    resumed.load_checkpoint(ckpt)
    result["resumed"] = record(resumed, resumed.train(progress=False, catch_signals=False))
    resumed.close()
    result["checkpoint"] = str(ckpt)
    old = out / "resume_old" / "checkpoints" / "step_1"
    if rank == 0:
        import shutil

        shutil.copytree(ckpt, old)
        state = torch.load(old / "trainer_state.pt", weights_only=False)
        torch.save({k: state[k] for k in ("step", "data_gen", "rollout_gen", "config")}, old / "trainer_state.pt")
    resumed.acc.wait_for_everyone()
    legacy = resume_trainer(out / "resume_old")
    legacy.load_checkpoint(old)
    legacy.train(steps=1, progress=False, catch_signals=False)
    legacy.close()
    result["legacy_prompts"] = legacy.drawn_prompts
    torch.save(result, out / f"resume{rank}.pt")
    end_group()


if __name__ == "__main__":
    mode, out_dir = sys.argv[1], Path(sys.argv[2])
    {"single": run_single, "multi": run_multi, "fsdp": run_fsdp, "resume": run_resume}[mode](out_dir)
