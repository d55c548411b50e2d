"""Checkpoints, exact resume and stopping on a signal (:meth:`maskrl.trainer.RLTrainer.save_checkpoint`,
:meth:`~maskrl.trainer.RLTrainer.load_checkpoint`, :meth:`~maskrl.trainer.RLTrainer.train`).

A checkpoint is a folder ``<output_dir>/checkpoints/step_K``: accelerate's ``save_state`` (weights as
safetensors, optimizer, one ``random_states_<rank>.pkl`` per process), the learning-rate schedule's
``state_dict`` as :data:`SCHEDULER_FILE` (the file and format accelerate writes for a prepared scheduler;
the trainer does not prepare its schedule, see :class:`~maskrl.trainer.RLTrainer`) and
:data:`TRAINER_STATE`, written by the main process::

    {"step": K,                      # RL steps done
     "data_gen": ..., "rollout_gen": ...,   # process 0's prompt and sampler streams
     "config": {...},                # the run's config (maskrl.config.to_dict)
     "num_processes": P,             # processes that trained it
     "streams": [{"data_gen", "rollout_gen"}] * P,   # every process's own streams, by rank
     "frozen": {"entries": n, "fingerprint": sha256}}  # the frozen weights it was trained on

The weights file holds the *trainable* parameters and the buffers only (:func:`trainable_state`): a
frozen parameter never changes, so a LoRA run's checkpoint carries its adapter, not a second copy of the
base (16 GiB for LLaDA-8B in bf16, which the resume would also have read into memory beside the loaded
model). The resume reads the frozen weights from ``model.path`` as the run did and checks them against
the recorded fingerprint (:func:`frozen_fingerprint`). Checkpoints written with every weight still load.
Under FSDP and DeepSpeed accelerate writes the model itself; those checkpoints stay whole.

Each process resumes its own streams, so a resumed run on P processes equals the uninterrupted one
bit for bit. Checkpoints of earlier maskrl versions lack ``num_processes`` and ``streams`` (they hold
process 0's streams only): their process count is unknown (a warning), process 0 resumes the saved
streams and any other process streams re-derived from the seed, its rank and the step
(:func:`~maskrl.training.seeds.resumed_data_seed`).
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Callable

import torch
from accelerate import Accelerator

from maskrl.config import RunConfig, TrainConfig, to_dict
from maskrl.files import first_line, unreadable_file, usual_file_modes
from maskrl.training.seeds import resumed_data_seed, resumed_rollout_seed

TRAINER_STATE = "trainer_state.pt"
#: the learning-rate schedule's ``state_dict`` (torch.save), accelerate's name for a prepared scheduler's
SCHEDULER_FILE = "scheduler.bin"
log = logging.getLogger("maskrl.trainer")  # the trainer's messages, under the trainer's logger name


class TrainingInterrupted(KeyboardInterrupt):
    """:meth:`RLTrainer.train` stopped on SIGINT / SIGTERM at a step boundary, after saving a checkpoint.

    Attributes:
        step: the last completed RL step (the checkpoint's).
        checkpoint: the checkpoint folder written (``<output_dir>/checkpoints/step_<step>``).
        signum: the signal received (``signal.SIGINT`` or ``signal.SIGTERM``).
    """

    def __init__(self, step: int, checkpoint: Path, signum: int) -> None:
        self.step, self.checkpoint, self.signum = step, checkpoint, signum
        super().__init__(f"{signal.Signals(signum).name} after step {step}: checkpoint saved to {checkpoint}")


class FrozenWeightsError(ValueError):
    """A resume whose frozen (not checkpointed) weights are not the ones the checkpoint was trained on:
    ``model.path`` now holds another base, or the trainable set changed (e.g. another LoRA target list)."""


class ProcessCountError(ValueError):
    """A resume on another process count than the checkpoint's, without ``force`` (the global batch,
    ``train.prompts_per_step`` × processes, would change)."""


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read (cut short, corrupt); the message is one line naming the
    file and the latest earlier checkpoint of the run whose files read, if any."""


# ------------------------------------------------------------------------------------ files
def damaged_checkpoint(path: Path, file: Path, why: str) -> CheckpointError:
    """The error for checkpoint ``path`` whose ``file`` does not read: names the file and the latest
    earlier complete checkpoint of the same run whose files read (:func:`unreadable_file`)."""
    step = int(path.name[5:]) if path.name[5:].isdigit() else None
    earlier = sorted((p for p in path.parent.glob("step_*") if p.name[5:].isdigit() and (p / TRAINER_STATE).is_file()
                      and (step is None or int(p.name[5:]) < step)), key=lambda p: -int(p.name[5:]))
    good = next((p for p in earlier if unreadable_file(p) is None), None)
    then = (f"the earlier checkpoint {good} reads: resume from it with --resume {good}" if good else
            "no earlier checkpoint of this run reads: start the run again (--overwrite)")
    return CheckpointError(f"{file}: cannot be read ({why}); checkpoint {path.name} is damaged (cut short or "
                           f"corrupt): {then}")


def read_checkpoint_state(path: str | Path) -> dict:
    """The trainer state of a checkpoint folder (module docstring): ``{"step", "data_gen",
    "rollout_gen", "config"}``, and ``"num_processes"``, ``"streams"`` when a maskrl version that
    records them wrote it (``config`` in :func:`~maskrl.config.to_dict` form: the run's config at that step).

    Raises:
        FileNotFoundError: when ``path`` holds no trainer state.
        CheckpointError: the trainer state cannot be read (:func:`damaged_checkpoint`).
    """
    path = Path(path)
    if not (path / TRAINER_STATE).is_file():
        raise FileNotFoundError(f"{path} is not a maskrl checkpoint (no {TRAINER_STATE})")
    try:
        return torch.load(path / TRAINER_STATE, weights_only=False)
    except Exception as e:  # noqa: BLE001 - a damaged file: one line naming it and what would work
        raise damaged_checkpoint(path, path / TRAINER_STATE, first_line(e)) from None


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete ``checkpoints/step_K`` folder (one with its trainer state, written last) with the
    largest K under ``run_dir``, or ``None``."""
    ckpts = sorted((p for p in (Path(run_dir) / "checkpoints").glob("step_*")
                    if p.name[5:].isdigit() and (p / TRAINER_STATE).is_file()), key=lambda p: int(p.name[5:]))
    return ckpts[-1] if ckpts else None


def trainable_state(models: list[torch.nn.Module], weights: list[dict], _output_dir: str | None = None) -> None:
    """Accelerate's save-state pre-hook (``Accelerator.register_save_state_pre_hook``): drop from each
    model's state dict (``weights[i]``, keys as ``models[i].state_dict()`` names them) every frozen
    parameter, in place, keeping trainable parameters (under every name a tied one has) and buffers.
    Under FSDP / DeepSpeed accelerate passes no state dicts and this does nothing."""
    for model, state in zip(models, weights):
        frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
        for key in [k for k in state if k in frozen]:
            del state[key]


def frozen_fingerprint(model: torch.nn.Module) -> dict:
    """What a checkpoint records of the frozen weights it leaves out: ``{"entries": int, "fingerprint":
    str}`` -- the number of frozen entries and a sha256 over every frozen parameter's name, shape, dtype
    and first 4,096 entries (cheap at 8B: a few MiB read, no full hash of 16 GiB). Names are the
    unwrapped model's (no DDP ``module.`` prefix), so the fingerprint does not depend on the process count."""
    import hashlib

    h, entries = hashlib.sha256(), 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                continue
            entries += p.numel()
            head = p.detach().reshape(-1)[:4096].to("cpu", torch.float32).contiguous()
            h.update(f"{name}|{tuple(p.shape)}|{p.dtype}|".encode())
            h.update(head.numpy().tobytes())
    return {"entries": entries, "fingerprint": h.hexdigest()}


def check_frozen(path: Path, state: dict, model: torch.nn.Module, model_path: str | None, force: bool,
                 main: bool) -> None:
    """Refuse a resume whose frozen weights differ from the checkpoint's record (:func:`frozen_fingerprint`),
    unless ``force`` (then warned). Checkpoints without the record (older maskrl) are not checked.

    Raises:
        FrozenWeightsError: the frozen weights differ (``model.path`` and both entry counts named).
    """
    saved = state.get("frozen")
    if saved is None:
        return
    now = frozen_fingerprint(model)
    if now == saved:
        return
    msg = (f"resume from {path}: the checkpoint holds the trainable weights only, and the frozen weights read from "
           f"model.path {model_path!r} are not the ones it was trained on ({saved['entries']} frozen entries then, "
           f"{now['entries']} now; fingerprint {saved['fingerprint'][:12]} vs {now['fingerprint'][:12]}). Point "
           "model.path at the run's base model and keep model.lora_* as trained")
    if not force:
        raise FrozenWeightsError(msg + ", or pass --force to resume anyway")
    if main:
        log.warning("%s; resuming anyway (--force)", msg)


def whole_checkpoints(acc: Accelerator) -> bool:
    """FSDP and DeepSpeed: accelerate writes and reads the model itself (every weight)."""
    from accelerate.utils import DistributedType

    return acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)


def load_trainable(models: list[torch.nn.Module], input_dir: str) -> None:
    """Accelerate's load-state pre-hook (``Accelerator.register_load_state_pre_hook``): load each model's
    weights file (``model.safetensors``, ``model_1.safetensors``, ... as ``save_state`` names them) into it
    without requiring the frozen parameters (:func:`trainable_state` left them out), then take the model
    off ``models`` so accelerate does not load it again. A file with every weight (older checkpoints)
    loads as before.

    Raises:
        ValueError: the file lacks a trainable parameter or holds a key the model does not have (named).
    """
    from safetensors.torch import load_model

    for i, model in enumerate(list(models)):
        file = Path(input_dir) / f"model{'' if i == 0 else f'_{i}'}.safetensors"
        device = next(model.parameters()).device
        missing, unexpected = load_model(model, str(file), strict=False, device=str(device))
        trainable = {n for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}
        lost = sorted(set(missing) & trainable)
        if lost or unexpected:
            raise ValueError(f"resume from {input_dir}: {file.name} does not match the model: "
                             + (f"trainable parameters missing: {lost[:5]}{' ...' if len(lost) > 5 else ''}; " if lost else "")
                             + (f"unknown keys: {sorted(unexpected)[:5]}" if unexpected else "")
                             + " (another LoRA rank or target list than the run's?)")
    models.clear()


def load_checkpoint_state(acc: Accelerator, path: Path, scheduler=None) -> None:
    """``acc.load_state(path)`` with :func:`load_trainable` as the model loader (see the module docstring),
    and ``scheduler``'s state from :data:`SCHEDULER_FILE` when the checkpoint has one (the resume then sets
    the rate from the step, :func:`follow_schedule`).

    Raises:
        CheckpointError: a file of the checkpoint does not read (cut short, corrupt): one line naming
            it and the earlier checkpoint that would work (:func:`damaged_checkpoint`).
    """
    handle = acc.register_load_state_pre_hook(load_trainable)
    try:
        acc.load_state(str(path))
    except Exception:
        bad = unreadable_file(path)
        if bad is None:
            raise
        raise damaged_checkpoint(Path(path), *bad) from None
    finally:
        handle.remove()
    if scheduler is not None and (path / SCHEDULER_FILE).is_file():
        scheduler.load_state_dict(torch.load(path / SCHEDULER_FILE, weights_only=True))


def save_checkpoint(acc: Accelerator, path: str | Path, step: int, cfg: RunConfig, data_gen: torch.Generator,
                    rollout_gen: torch.Generator, model: torch.nn.Module | None = None, scheduler=None) -> Path:
    """Write the checkpoint folder ``path`` (module docstring) on every process: accelerate's state with
    the trainable parameters and buffers only (:func:`trainable_state`), then by the main process
    ``scheduler``'s state (:data:`SCHEDULER_FILE`, when given) and :data:`TRAINER_STATE` with every
    process's ``data_gen`` / ``rollout_gen`` state (one object all-gather on several processes) and the
    frozen weights' fingerprint of ``model`` (the unwrapped policy; ``None`` or FSDP / DeepSpeed, whose
    checkpoints stay whole: not recorded). Returns ``path``."""
    path = Path(path)
    acc.wait_for_everyone()
    handle = acc.register_save_state_pre_hook(trainable_state)
    try:
        acc.save_state(str(path), safe_serialization=True)
    finally:
        handle.remove()
    frozen = frozen_fingerprint(model) if model is not None and not whole_checkpoints(acc) else None
    own = {"data_gen": data_gen.get_state(), "rollout_gen": rollout_gen.get_state()}
    if acc.num_processes > 1:
        from accelerate.utils import gather_object

        streams = gather_object([own])  # [P] by rank
    else:
        streams = [own]
    if acc.is_main_process:
        if scheduler is not None:
            torch.save(scheduler.state_dict(), path / SCHEDULER_FILE)
        torch.save({"step": step, "data_gen": own["data_gen"], "rollout_gen": own["rollout_gen"], "config": to_dict(cfg),
                    "num_processes": acc.num_processes, "streams": streams, "frozen": frozen}, path / TRAINER_STATE)
    acc.wait_for_everyone()
    if acc.is_main_process:  # accelerate writes model.safetensors through a 0600 temporary file
        usual_file_modes(path)
    return path


# ------------------------------------------------------------------------------------ resume
def launched_processes() -> int:
    """Processes of this launch before any ``Accelerator`` exists: ``WORLD_SIZE`` as ``torchrun`` /
    ``accelerate launch`` set it, else 1 (what ``maskrl train`` checks before loading a model)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def process_count_change(state: dict, num_processes: int, prompts_per_step: int) -> str | None:
    """What resuming ``state`` (:func:`read_checkpoint_state`) on ``num_processes`` processes with
    ``train.prompts_per_step = prompts_per_step`` changes, as one line naming both process counts and
    global batches; ``None`` when the count is the same or the checkpoint does not record it."""
    old = state.get("num_processes")
    if old is None or int(old) == num_processes:
        return None
    old = int(old)
    per_old = int(state.get("config", {}).get("train", {}).get("prompts_per_step", prompts_per_step))
    return (f"process count {old} -> {num_processes}: the global batch (train.prompts_per_step x processes) "
            f"{per_old} x {old} = {per_old * old} -> {prompts_per_step} x {num_processes} = "
            f"{prompts_per_step * num_processes} prompts per step")


def check_process_count(path: Path, state: dict, num_processes: int, prompts_per_step: int, force: bool,
                        main_process: bool = True) -> None:
    """Refuse a resume on another process count unless ``force``; warn (main process) when forced and
    when the checkpoint records no count.

    Raises:
        ProcessCountError: the counts differ and ``force`` is false; the message names both counts and
            global batches.
    """
    change = process_count_change(state, num_processes, prompts_per_step)
    step = int(state["step"])
    if change and not force:
        raise ProcessCountError(f"resuming {path} (step {step}): {change}. Launch {state['num_processes']} processes, "
                                f"or pass force=True (maskrl train --force) to go on with the new global batch")
    if not main_process:
        return
    if change:
        log.warning("resuming %s (step %d) forced: %s", path, step, change)
    if state.get("num_processes") is None:
        log.warning("checkpoint %s records no process count (an earlier maskrl version wrote it): the global "
                    "batch cannot be checked (now %d process(es) x train.prompts_per_step %d)", path, num_processes,
                    prompts_per_step)


def restore_streams(state: dict, rank: int, seed: int, data_gen: torch.Generator, rollout_gen: torch.Generator,
                    main_process: bool = True, num_processes: int = 1) -> None:
    """Set process ``rank``'s prompt and sampler streams from ``state`` (its own saved ones; process 0's
    alone in a checkpoint of an earlier version), or, for a process the checkpoint holds none for,
    re-derive them from ``seed``, ``rank`` and the step (:func:`~maskrl.training.seeds.resumed_data_seed`,
    warned on the main process)."""
    streams = state.get("streams") or [{"data_gen": state["data_gen"], "rollout_gen": state["rollout_gen"]}]
    step = int(state["step"])
    if rank < len(streams):
        data_gen.set_state(streams[rank]["data_gen"])
        rollout_gen.set_state(streams[rank]["rollout_gen"])
    else:
        data_gen.manual_seed(resumed_data_seed(seed, rank, step))
        rollout_gen.manual_seed(resumed_rollout_seed(seed, rank, step))
    if main_process and num_processes > len(streams):
        log.warning("the checkpoint holds the prompt and sampler streams of %d process(es); processes %d..%d draw "
                    "from streams re-derived from train.seed, their rank and step %d", len(streams), len(streams),
                    num_processes - 1, step)


def follow_schedule(scheduler, optimizer: torch.optim.Optimizer, tc: TrainConfig, step: int, saved: dict,
                    main_process: bool = True) -> None:
    """After a resume at ``step``, make the learning rate that of *this* run's schedule there.

    The optimizer state restores the last rate of the saved run (0.0 at the end of a ``linear``
    schedule) and the scheduler's counter, while the schedule function is this run's (``tc``: its
    ``train.steps``, ``warmup_steps``, ``lr``, ``lr_scheduler``). Without this, the first resumed
    step would run at the saved run's last rate. The schedule's base rate is set to this run's
    ``train.lr``; a change of these settings against ``saved`` (the checkpoint's ``train`` section)
    is logged.
    """
    inner = getattr(scheduler, "scheduler", scheduler)  # (a scheduler prepared by accelerate: its wrapper holds it)
    inner.base_lrs = [tc.lr for _ in inner.base_lrs]
    inner.last_epoch = step * tc.inner_iterations  # μ scheduler steps per RL step
    for group, base, fn in zip(optimizer.param_groups, inner.base_lrs, inner.lr_lambdas):
        group["initial_lr"] = base
        group["lr"] = base * fn(inner.last_epoch)
    changed = [f"train.{k} {saved[k]!r} -> {getattr(tc, k)!r}"
               for k in ("steps", "lr", "lr_scheduler", "warmup_steps", "inner_iterations")
               if k in saved and saved[k] != getattr(tc, k)]
    if changed and main_process:
        log.warning("resumed at step %d with other schedule settings (%s): the learning rate follows this "
                    "run's schedule from step %d (lr %.3g)", step, "; ".join(changed), step + 1,
                    optimizer.param_groups[0]["lr"])


# ------------------------------------------------------------------------------------ signals
@contextlib.contextmanager
def stop_at_step_end(enabled: bool, on_signal: Callable[[int], None]):
    """While inside: the first SIGINT / SIGTERM only calls ``on_signal(signum)`` (the training loop then
    stops at the end of its step); the previous handlers are back for a second signal and afterwards.
    Does nothing when not ``enabled`` or off the main thread (Python delivers signals there only)."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = [signal.SIGINT] + ([signal.SIGTERM] if hasattr(signal, "SIGTERM") else [])
    previous = {s: signal.getsignal(s) for s in sigs}

    def handler(signum, _frame):
        for s, h in previous.items():  # a second signal: the usual behaviour
            signal.signal(s, h)
        on_signal(signum)

    for s in sigs:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
