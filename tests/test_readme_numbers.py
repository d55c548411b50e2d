"""The README's demo numbers are those of the committed demo records (``results/demo_spread/``), not typed
copies: a re-run record that changes them fails here until the README says the same."""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "results" / "demo_spread"
WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


def _readme() -> str:
    return " ".join((ROOT / "README.md").read_text().split())  # line breaks of the prose do not matter


def _ci(x: dict, sign: str = "") -> str:
    return f"[{x['ci95'][0]:{sign}.3f}, {x['ci95'][1]:{sign}.3f}]"


def test_demo_table_and_paired_gain_are_the_seed0_record():
    rec = json.loads((RECORDS / "native_s0.json").read_text())
    text = _readme()
    assert (rec["seed"], rec["capability"], rec["threads"], rec["status"]) == (0, "AVX512", 2, "done")
    assert "Seed 0, AVX-512 kernels, 2 threads ([results/demo_spread/native_s0.json]" in text
    b, f, p = rec["base"], rec["final"], rec["paired"]
    assert f"| SFT base | {b['accuracy']:.3f} {_ci(b)} | {rec['cell_accuracy']['base']:.3f} |" in text
    assert (f"| after diffu-GRPO (state likelihood, 60 steps) | {f['accuracy']:.3f} {_ci(f)} | "
            f"{rec['cell_accuracy']['final']:.3f} |") in text
    assert (f"Paired on the same puzzles: {p['gain']:+.3f} [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}], "
            f"McNemar p = {p['mcnemar_p']:.2g}.") in text


def test_demo_spread_sentence_is_the_range_over_the_finished_records():
    done = [r for r in (json.loads(p.read_text()) for p in sorted(RECORDS.glob("*.json"))) if r.get("status") == "done"]
    fa = [r["final"]["accuracy"] for r in done]
    ga = [r["paired"]["gain"] for r in done]
    assert (f"Over the {WORDS[len(done)]} finished runs across CPU kernel sets and RL seeds the final accuracy is "
            f"{min(fa):.3f}–{max(fa):.3f}, a paired gain of {min(ga):+.3f} to {max(ga):+.3f}") in _readme()
