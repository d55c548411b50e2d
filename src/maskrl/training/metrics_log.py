"""A run's metrics on disk and in trackers: ``<output_dir>/metrics.jsonl`` (one JSON object per logged
step, keys in the order the step produced them) and the ``train.report_to`` trackers through
accelerate (TensorBoard under ``<output_dir>/tb``, W&B, MLflow, ...). Main process only."""
from __future__ import annotations

import json
from pathlib import Path

from accelerate import Accelerator

from maskrl.config import RunConfig, to_dict


def tracker_kwargs(cfg: RunConfig) -> dict:
    """``Accelerator`` keyword arguments for the ``train.report_to`` trackers: ``log_with`` and a
    :class:`~accelerate.utils.ProjectConfiguration` whose logging dir is ``<output_dir>/tb``
    (TensorBoard writes ``<output_dir>/tb/<train.tracker_project>``; W&B, MLflow, ... their own places)."""
    from accelerate.utils import ProjectConfiguration

    out = Path(cfg.output_dir)
    return {"log_with": list(cfg.train.report_to) or None,
            "project_config": ProjectConfiguration(project_dir=str(out), logging_dir=str(out / "tb"))}


def check_trackers(cfg: RunConfig, acc: Accelerator) -> None:
    """Every ``train.report_to`` tracker is active on ``acc`` (accelerate drops trackers whose package
    is missing with only a warning; here that is an error naming the tracker).

    Raises:
        ConfigError: a requested tracker is not installed, or an accelerator passed in lacks it.
    """
    from maskrl.config import ConfigError

    active = {str(getattr(t, "value", t)) for t in (acc.log_with or [])}
    missing = [n for n in cfg.train.report_to if n not in active]
    if missing:
        raise ConfigError(f"train.report_to: tracker(s) {', '.join(missing)} not available (package not installed, "
                          f"e.g. `pip install 'maskrl[track]'`, or an Accelerator passed without them in log_with); "
                          f"set train.report_to to the ones you have, or []")


def hyperparameters(cfg: RunConfig) -> dict:
    """The resolved config flattened to ``{"train.lr": 1e-05, ...}`` with ``bool``/``int``/``float``/``str``
    values (lists and ``None`` as text), the form every accelerate tracker accepts as hyper-parameters."""
    flat: dict = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (bool, int, float, str)):
            flat[prefix] = value
        else:
            flat[prefix] = json.dumps(value)

    walk("", to_dict(cfg))
    return flat


class MetricsLog:
    """The open ``metrics.jsonl`` and the started trackers of one trainer (main process only).

    Attributes:
        resumed_step: set after a resume at step K: the first :meth:`write` drops the rows of
            ``metrics.jsonl`` after step K and opens TensorBoard with ``purge_step=K + 1``, so a
            resumed run's logs hold each step once; then ``None``.
    """

    def __init__(self, acc: Accelerator) -> None:
        self.acc = acc
        self.resumed_step: int | None = None
        self._fh = None
        self._trackers_started = False

    def write(self, metrics: dict, out_dir: Path, cfg: RunConfig, project: str) -> None:
        """Append ``metrics`` to ``<out_dir>/metrics.jsonl`` and send its numeric values (but ``step``)
        to the trackers at step ``metrics["step"]``; the first call starts the trackers (``project``,
        :func:`hyperparameters` of ``cfg``). A no-op off the main process."""
        if not self.acc.is_main_process:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        purge = None
        if self._fh is None:
            if self.resumed_step is not None:  # a resumed run: no row or event of a later step is kept
                from maskrl.rundir import truncate_metrics

                truncate_metrics(out_dir / "metrics.jsonl", self.resumed_step)
                purge, self.resumed_step = self.resumed_step + 1, None  # once: later rows are this run's
            self._fh = open(out_dir / "metrics.jsonl", "a", encoding="utf-8")
        if not self._trackers_started and self.acc.log_with:
            kwargs = {"tensorboard": {"purge_step": purge}} if purge is not None else {}  # SummaryWriter's
            self.acc.init_trackers(project, config=hyperparameters(cfg), init_kwargs=kwargs)
            self._trackers_started = True
        self._fh.write(json.dumps(metrics) + "\n")
        self._fh.flush()
        if self._trackers_started:
            scalars = {k: v for k, v in metrics.items() if k != "step" and isinstance(v, (int, float))}
            self.acc.log(scalars, step=int(metrics["step"]))

    def close(self) -> None:
        """Close ``metrics.jsonl`` and finish the trackers (each tracker's ``finish()``, what
        ``Accelerator.end_training`` does first; the process group is the launcher's and is left alone)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._trackers_started:
            for tracker in self.acc.trackers:
                tracker.finish()
            self._trackers_started = False
