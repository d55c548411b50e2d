"""Does a plain ``AutoModelForCausalLM.from_pretrained`` of a maskrl export load silently (issue 23)?

Saves the built-in tiny model (default shape, seed 0) with ``maskrl.models.save_model`` and tries a
plain causal load; when it loads, records the largest |logit| difference from maskrl's bidirectional
forward on 4 random rows of 40 tokens. JSON to ``--out`` (and stdout).

    PYTHONPATH=src python benchmarks/fidelity/causal_load_check.py --out runs/causal_load_check.json
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from maskrl.models import build_tiny, save_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args()
    tiny = build_tiny()
    ids = torch.randint(5, 90, (4, 40), generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as d:
        save_model(tiny, d)
        try:
            causal = AutoModelForCausalLM.from_pretrained(d).eval()
        except (ValueError, OSError) as e:
            res = {"plain_causal_load": f"raised {type(e).__name__}", "message": str(e).splitlines()[0]}
        else:
            with torch.no_grad():
                diff = (causal(input_ids=ids).logits - tiny.logits(ids)).abs().max().item()
            res = {"plain_causal_load": "loaded silently", "max_abs_logit_diff": diff}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
