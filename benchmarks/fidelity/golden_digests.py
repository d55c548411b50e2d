"""The golden digests (``tests/golden/pin.py``) of a checkout on *this* machine, whatever its key, and a
comparison of two such files: how to show a change leaves every pinned value bit for bit where
``tests/test_golden.py`` skips (a machine key that was never recorded).

    PYTHONPATH=src python benchmarks/fidelity/golden_digests.py --out after.json             # this checkout
    PYTHONPATH=/old/src python benchmarks/fidelity/golden_digests.py --root /old --out before.json
    python benchmarks/fidelity/golden_digests.py --compare before.json after.json        # exit 1 when they differ
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[2]), help="checkout whose tests/golden/pin.py runs")
    ap.add_argument("--out", help="write {key, digests} here")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        if a["key"] != b["key"]:
            print(f"different machine keys: {a['key']} / {b['key']}")
            return 1
        diff = [f"{part}/{case}" for part in a["digests"] for case in a["digests"][part]
                if a["digests"][part][case] != b["digests"].get(part, {}).get(case)]
        n = sum(len(v) for v in a["digests"].values())
        print(f"{n - len(diff)} of {n} cases equal" + (": differ " + ", ".join(diff) if diff else ""))
        return 1 if diff else 0
    sys.path.insert(0, str(Path(args.root) / "tests" / "golden"))
    import pin

    Path(args.out).write_text(json.dumps({"key": pin.machine_key(), "digests": pin.compute()}, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
