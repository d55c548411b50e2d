"""Checkpoints, exact resume and stopping on a signal (:meth:`maskrl.trainer.RLTrainer.save_checkpoint`,
:meth:`~maskrl.trainer.RLTrainer.load_checkpoint`, :meth:`~maskrl.trainer.RLTrainer.train`).

A checkpoint is a folder ``<output_dir>/checkpoints/step_K``: accelerate's ``save_state`` (weights as
safetensors, optimizer, scheduler, one ``random_states_<rank>.pkl`` per process) plus
:data:`TRAINER_STATE`, written by the main process: ``{"step": K, "data_gen": ..., "rollout_gen": ...,
"config": {...}}`` (the prompt and sampler generator states, the run's config as
:func:`maskrl.config.to_dict` gives it).
"""
from __future__ import annotations

import contextlib
import logging
import signal
import threading
from pathlib import Path
from typing import Callable

import torch
from accelerate import Accelerator

from maskrl.config import RunConfig, TrainConfig, to_dict

TRAINER_STATE = "trainer_state.pt"
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


# ------------------------------------------------------------------------------------ files
def read_checkpoint_state(path: str | Path) -> dict:
    """The trainer state of a checkpoint folder: ``{"step", "data_gen", "rollout_gen", "config"}``
    (``config`` in :func:`~maskrl.config.to_dict` form: the run's config at that step).

    Raises:
        FileNotFoundError: when ``path`` holds no trainer state.
    """
    path = Path(path)
    if not (path / TRAINER_STATE).is_file():
        raise FileNotFoundError(f"{path} is not a maskrl checkpoint (no {TRAINER_STATE})")
    return torch.load(path / TRAINER_STATE, weights_only=False)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete ``checkpoints/step_K`` folder (one with its trainer state, written last) with the
    largest K under ``run_dir``, or ``None``."""
    ckpts = sorted((p for p in (Path(run_dir) / "checkpoints").glob("step_*")
                    if p.name[5:].isdigit() and (p / TRAINER_STATE).is_file()), key=lambda p: int(p.name[5:]))
    return ckpts[-1] if ckpts else None


def save_checkpoint(acc: Accelerator, path: str | Path, step: int, cfg: RunConfig, data_gen: torch.Generator,
                    rollout_gen: torch.Generator) -> Path:
    """Write the checkpoint folder ``path`` (module docstring) on every process: accelerate's state, then
    :data:`TRAINER_STATE` by the main process. Returns ``path``."""
    path = Path(path)
    acc.wait_for_everyone()
    acc.save_state(str(path), safe_serialization=True)
    if acc.is_main_process:
        torch.save({"step": step, "data_gen": data_gen.get_state(), "rollout_gen": rollout_gen.get_state(),
                    "config": to_dict(cfg)}, path / TRAINER_STATE)
    acc.wait_for_everyone()
    return path


# ------------------------------------------------------------------------------------ resume
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
    inner = getattr(scheduler, "scheduler", scheduler)  # accelerate's wrapper holds it
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
