"""One process of the 2-process lm-eval run of tests/test_lm_eval.py: ``MODEL TASKS_DIR OUT_DIR``.
Rank 0 writes the gathered completions (doc order) and metrics to OUT_DIR/rank0.json."""
import json
import os
import sys

import lm_eval
from lm_eval.tasks import TaskManager

import maskrl.lm_eval_model  # noqa: F401  (registers "maskrl")

model, tasks, out = sys.argv[1:4]
res = lm_eval.simple_evaluate(model="maskrl", model_args=f"pretrained={model},batch_size=5",
                              tasks=["maskrl_sudoku_parity"], log_samples=True,
                              task_manager=TaskManager(include_path=tasks, include_defaults=False))
if int(os.environ["RANK"]) == 0:
    samples = sorted(res["samples"]["maskrl_sudoku_parity"], key=lambda s: s["doc_id"])
    with open(os.path.join(out, "rank0.json"), "w") as fh:
        json.dump({"completions": [s["resps"][0][0] for s in samples],
                   "cell_acc": res["results"]["maskrl_sudoku_parity"]["cell_acc,none"]}, fh)
else:
    assert res is None  # lm-eval returns results on rank 0 only
