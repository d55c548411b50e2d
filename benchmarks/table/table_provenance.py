"""Provenance for the controlled table's records made before records carried it
(``--backfill-provenance``): an explicit ``test_reads``, the commit that first recorded each run, and the SFT
checkpoint's weights hash where the checkpoint present re-scores the record's step 0 exactly."""
from __future__ import annotations

import json
from pathlib import Path

from ablation_runs import ROOT, load_results, update_results
from maskrl.config import to_dict
from table_protocol import BASES, GEN_KW
from table_runs import Setup


def first_commits(path: Path) -> dict[str, str]:
    """For each run key of record file ``path``, the first git commit whose version of the file holds it
    (``git log`` / ``git show``; empty outside git)."""
    import subprocess

    if not path.resolve().is_relative_to(ROOT):
        return {}
    rel = str(path.resolve().relative_to(ROOT))
    try:
        commits = subprocess.run(["git", "-C", str(ROOT), "log", "--format=%H", "--reverse", "--", rel],
                                 capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return {}
    seen: dict[str, str] = {}
    for c in commits:
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{c}:{rel}"], capture_output=True, text=True)
        if shown.returncode:
            continue
        try:
            for key in json.loads(shown.stdout).get("runs", {}):
                seen.setdefault(key, c)
        except json.JSONDecodeError:
            continue
    return seen


def backfill_provenance(paths: list[Path], verify: bool = True) -> dict:
    """Give every record of ``paths`` made before records carried provenance an explicit ``test_reads``
    (1 when it holds a ``test`` score, else 0) and a ``provenance`` block marked ``backfilled``: the SFT
    settings key its overrides give over the task's base recipe (``sft_cache_key``), the test file's path
    and today's sha256, the selection split (seed :data:`ablation_runs.SELECTION_SEED`, its recorded size)
    and the training rows' seed and size, the commit that first recorded it (``recorded_in``; the code it
    ran is that commit or an earlier one), its CPU kernel set and threads; ``torch`` and the code commit
    are unknown (None). With ``verify``, for each SFT checkpoint present under ``runs/table`` whose fresh
    step-0 scores on the selection split equal a record's (all metrics, exactly), that record gets the
    weights' sha256 (``sft.verified``: the same checkpoint and data; else ``sha256`` None).
    Returns counts ``{"records", "backfilled", "verified"}``."""
    from maskrl.config import load_config
    from maskrl.demo import sft_cache_key
    from ablation_runs import SELECTION_SEED, checkpoint_sha256, file_sha256

    fresh: dict[tuple, dict] = {}  # (task, sft key, eval settings) -> the present checkpoint's step-0 metrics, hash
    counts = {"records": 0, "backfilled": 0, "verified": 0}
    for path in paths:
        data = load_results(path, must_exist=True)
        first = first_commits(path)
        todo = {k: r for k, r in data["runs"].items() if "provenance" not in r}
        counts["records"] += len(data["runs"])
        if not todo:
            continue
        filled = {}
        for key, r in todo.items():
            task = r["task"]
            cfg = load_config([BASES[task]], r.get("overrides", []))
            skey = sft_cache_key(cfg)
            folder = ROOT / "runs" / "table" / f"{task}_sft" / skey
            sft = {"path": str(folder.relative_to(ROOT)), "settings_key": skey, "sha256": None, "verified": False}
            ident = (task, skey, json.dumps(to_dict(cfg.eval), sort_keys=True, default=str))
            if verify and (folder / "maskrl_sft.json").is_file():
                if ident not in fresh:
                    setup = Setup(task, BASES[task], r.get("overrides", []), "table", r["val_size"], gen_kw=GEN_KW.get(task),
                                  require_file=True)
                    fresh[ident] = {"val": setup.sft_val(setup.policy(), setup.cfg), "sha256": checkpoint_sha256(folder)}
                f = fresh[ident]
                if r["val_curve"][0][1] == f["val"]:
                    sft.update(sha256=f["sha256"], verified=True)
                    counts["verified"] += 1
            task_obj = __import__("maskrl.tasks", fromlist=["get_task"]).get_task(cfg.task.name, cfg.task.prompt_template or None)
            test = task_obj.resolve_path(cfg.task.data_path or None)
            filled[key] = {
                "test_reads": 1 if "test" in r else 0,
                "provenance": {"backfilled": True, "sft": sft,
                               "data": {"source": "file", "path": str(test), "sha256": file_sha256(test), "checked": "today"},
                               "splits": {"train": {"source": "generated", "seed": cfg.task.train_seed, "size": cfg.task.train_size},
                                          "selection": {"source": "generated", "seed": SELECTION_SEED, "size": r["val_size"]},
                                          "confirmation": None},
                               "code": {"commit": None, "recorded_in": first.get(key)},
                               "torch": None, "cpu_capability": r.get("cpu_capability"), "threads": r.get("threads")}}
        counts["backfilled"] += len(filled)

        def change(d, filled=filled):
            for key, extra in filled.items():
                if key in d["runs"] and "provenance" not in d["runs"][key]:
                    d["runs"][key].update(extra)
        update_results(path, change)
    return counts
