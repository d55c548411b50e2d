"""The trainer's parts apart from the RL step itself (:class:`maskrl.trainer.RLTrainer` composes them).

- :mod:`~maskrl.training.seeds`: every seed the trainer draws from, one named function each;
- :mod:`~maskrl.training.micro_batches`: the micro-batch plan of a step's loss terms (named records);
- :mod:`~maskrl.training.lockstep`: keeping several processes' forwards and collectives in step;
- :mod:`~maskrl.training.checkpoint`: checkpoint files, exact resume, the process count, signals;
- :mod:`~maskrl.training.metrics_log`: ``metrics.jsonl`` and the accelerate trackers;
- :mod:`~maskrl.training.batch_metrics`: the metrics of the step's global batch (sums over processes).

Public names are re-exported by :mod:`maskrl.trainer`; nothing here imports it.
"""
