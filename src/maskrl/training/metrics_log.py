"""A run's metrics on disk and in trackers: ``<output_dir>/metrics.jsonl`` (one JSON object per logged
step, keys in the order the step produced them) and the ``train.report_to`` trackers through
accelerate (TensorBoard under ``<output_dir>/tb``, W&B, MLflow, ...). Main process only.

A resumed run is one run in each tracker that can continue one: ``metrics.jsonl`` keeps its rows up to
the checkpoint, TensorBoard purges later events, and W&B continues the run whose id the run folder
keeps in :data:`TRACKER_RUNS` (``wandb.init(id=..., resume="allow")`` through accelerate's
``init_trackers(init_kwargs=...)``; :func:`tracker_resume_kwargs`). Trackers that accelerate starts
without a run id to continue (MLflow, Comet, Aim, ...) start a new run on resume, and the user is told.
"""
from __future__ import annotations

import json
import logging
import secrets
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


#: the run folder's record of its tracker runs (JSON ``{"wandb": {"id": ...}}``), read on resume
TRACKER_RUNS = "trackers.json"
#: trackers a resumed run continues: TensorBoard (the same folder, later events purged) and W&B (the id)
CONTINUED_TRACKERS = ("tensorboard", "wandb")
log = logging.getLogger("maskrl.trainer")  # the trainer's messages, under the trainer's logger name


def _read_runs(path: Path) -> dict:
    """:data:`TRACKER_RUNS` as a dict (``{}`` when missing; unreadable: ``{}`` and a warning naming it)."""
    if not path.is_file():
        return {}
    try:
        runs = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        runs = e
    if not isinstance(runs, dict) or not isinstance(runs.get("wandb", {}), dict):
        log.warning("%s is not a JSON object of tracker runs (%s): it is rewritten", path, runs)
        return {}
    return runs


def tracker_resume_kwargs(report_to: list[str], out_dir: Path, resumed_step: int | None,
                          dropped_steps: int = 0) -> dict:
    """accelerate ``init_trackers`` ``init_kwargs`` that make W&B log to this run folder's W&B run.

    A fresh run (``resumed_step`` ``None``) draws a new W&B run id and records it in
    ``out_dir/``:data:`TRACKER_RUNS`; a resumed one reads it and continues that run (``resume="allow"``:
    it also works for a run W&B has not synced, e.g. offline). A resume warns (one line each) when the
    folder records no W&B id (a run started by an earlier maskrl: a new W&B run), when W&B already holds
    steps after the resume point (``dropped_steps`` > 0: W&B only appends, so it keeps the earlier
    values of those steps and ignores the resumed ones; ``metrics.jsonl`` and TensorBoard hold the
    resumed ones), and for every other tracker of ``report_to`` that starts a new run.

    Args:
        report_to: ``train.report_to``.
        out_dir: the run folder.
        resumed_step: the step the run resumed at (``None``: not resumed).
        dropped_steps: the ``metrics.jsonl`` rows after ``resumed_step`` that the resume dropped.

    Returns:
        ``{"wandb": {"id": ..., "resume": "allow"}}`` with W&B in ``report_to``, else ``{}``.
    """
    resumed = resumed_step is not None
    if resumed:
        for name in report_to:
            if name not in CONTINUED_TRACKERS:
                log.warning("train.report_to: %s starts a new run on this resume at step %d (maskrl continues "
                            "TensorBoard and W&B runs only); metrics.jsonl holds the whole run", name, resumed_step)
    if "wandb" not in report_to:
        return {}
    path = out_dir / TRACKER_RUNS
    runs = _read_runs(path)
    run_id = runs.get("wandb", {}).get("id") if resumed else None
    if resumed and run_id is None:
        log.warning("resuming %s at step %d: the folder records no W&B run id (%s; a run started before maskrl "
                    "kept it), so W&B starts a new run; metrics.jsonl holds the whole run", out_dir, resumed_step,
                    TRACKER_RUNS)
    if run_id is None:
        run_id = secrets.token_hex(8)
        path.write_text(json.dumps({**runs, "wandb": {"id": run_id}}) + "\n", encoding="utf-8")
    elif dropped_steps:
        log.warning("resuming W&B run %s at step %d: W&B already holds %d later step(s) from before the stop and "
                    "only appends, so it keeps those values and ignores the resumed run's steps up to the last "
                    "logged one; metrics.jsonl and TensorBoard hold the resumed values", run_id, resumed_step,
                    dropped_steps)
    return {"wandb": {"id": run_id, "resume": "allow"}}


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
        purge = resumed = None
        dropped = 0
        if self._fh is None:
            if self.resumed_step is not None:  # a resumed run: no row or event of a later step is kept
                from maskrl.rundir import truncate_metrics

                dropped = truncate_metrics(out_dir / "metrics.jsonl", self.resumed_step)
                resumed, self.resumed_step = self.resumed_step, None  # once: later rows are this run's
                purge = resumed + 1
            self._fh = open(out_dir / "metrics.jsonl", "a", encoding="utf-8")
        if not self._trackers_started and self.acc.log_with:
            names = [str(getattr(t, "value", t)) for t in self.acc.log_with]  # as check_trackers names them
            kwargs = tracker_resume_kwargs(names, out_dir, resumed, dropped)
            if purge is not None:
                kwargs["tensorboard"] = {"purge_step": purge}  # SummaryWriter's
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
