"""maskrl's block decoding against SDAR's own ``block_diffusion_generate``, token for token (issue 48 item 2;
docs/sampler.md, "Block-diffusion models").

SDAR's function is run itself: ``generate.py`` of JetAstra/SDAR at commit ``c2041a8333333d685f6e15122c84f60f51f85ebd``
(``git show <commit>:generate.py`` of a clone, ``--sdar-repo``), imported as a module, never copied here. It
calls its model as ``model(x, attention_mask=<[1, q, K + q] 0/1 block mask>, position_ids=..., past_key_values=
DynamicCache, use_cache=True, store_kv=<bool>)`` and reads ``.logits``; :class:`SdarShim` gives the tiny
block model (:func:`tiny_block_model`, a stock Llama) exactly that call: the 0/1 mask made additive, the
DynamicCache used by the model, and cropped back (``crop``) after a forward with ``store_kv=False`` (SDAR's model
writes keys/values only when ``store_kv`` is True).

Its greedy limit: SDAR samples candidates with ``torch.multinomial``; here its module-level
``sample_with_temperature_topk_topp`` is replaced, for the call only, by candidate = argmax, confidence = its
softmax probability -- maskrl's ``temperature: 0`` (``maskrl.sampling.commit.block_candidates``). The
model's ``[MASK]`` logit is held at -20 (its output row zeroed, a bias of -20 there), as a trained SDAR's
lies far below the others: SDAR's softmax keeps it, maskrl's never proposes it.

Shapes: one prompt per call (SDAR's function takes batch 1 unpadded), blocks of 4; SDAR decodes up to the
next block boundary, maskrl exactly ``gen_length``: the positions left of maskrl's last block (cut at L
when P mod 4 != 0; earlier blocks never see later ones) are compared. Settings avoid SDAR's count quirk
(a step's count above the masks left in the block makes its top-k overwrite a filled position): ``static``
and ``dynamic`` run 4 steps per block (one token per step), ``sequential`` 2 (it cannot overwrite).
``stop`` rows end at a stop id (the model's eos logit raised): SDAR leaves the later blocks ``[MASK]``,
maskrl (``early_stop: true``) pads them.

SDAR's ``entropy_bounded`` branch is not run: at this commit it uses ``transfer_index`` before assigning
it on a block's first step (an UnboundLocalError) and sums ``x0_p`` over the block instead of entropies
over the vocabulary; maskrl's ``entropy_bounded`` is the EB-sampler rule (docs/sampler.md).

    PYTHONPATH=src python benchmarks/sdar_generate_reference.py --sdar-repo /path/to/JetAstra/SDAR \\
        --out tests/golden/sdar_reference.json
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "c2041a8333333d685f6e15122c84f60f51f85ebd"
PROMPTS = ["a", "ab", "abc", "abcd", "x + y = 3", "the cat sat on", "12 * 7", "hello world!"]
#: name -> (remasking, steps per block, threshold, eos logit bias, output-layer scale, gen_length)
SETTINGS = {
    "sequential": ("sequential", 2, 0.9, 0.0, 20.0, 32),
    "static": ("low_confidence_static", 4, 0.9, 0.0, 20.0, 32),
    "dynamic": ("low_confidence_dynamic", 4, 0.9, 0.0, 40.0, 32),
    "dynamic_0.5": ("low_confidence_dynamic", 4, 0.5, 0.0, 40.0, 32),
    "stop": ("low_confidence_dynamic", 4, 0.9, 1.5, 20.0, 32),
}


def tiny_block_model(eos_bias: float = 0.0, scale: float = 8.0, block_size: int = 4):
    """The tiny block model of the record (``build_tiny(block_size=4)`` at 32 wide, 2 layers, seed 0, eval):
    output layer times ``scale``, ``[MASK]`` logit -20, eos logit plus ``eos_bias``, attention sharpened
    (queries and keys x30, output projection x4): an untrained model's near-uniform attention gives a
    block's masks nearly equal confidences (gaps ~1e-5, inside float noise), these weights gaps of 1e-4..1e-2."""
    from maskrl.models import build_tiny

    adapter = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0,
                         block_size=block_size)
    model = adapter.model.eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(30.0)
            layer.self_attn.k_proj.weight.mul_(30.0)
            layer.self_attn.o_proj.weight.mul_(4.0)
    head = model.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight * scale)
        biased.weight[adapter.mask_id] = 0.0
        biased.bias.zero_()
        biased.bias[adapter.mask_id] = -20.0
        biased.bias[adapter.eos_id] = eos_bias
    model.lm_head = biased.eval()
    return adapter


class SdarShim(torch.nn.Module):
    """The model call SDAR's ``block_diffusion_generate`` makes, on a maskrl adapter's transformers model."""

    def __init__(self, adapter):
        super().__init__()
        self.inner = adapter.model

    @property
    def device(self):
        return next(self.inner.parameters()).device

    def forward(self, input_ids, attention_mask, position_ids, past_key_values, use_cache, store_kv):
        before = past_key_values.get_seq_length()
        dtype = next(self.inner.parameters()).dtype
        additive = torch.zeros(attention_mask.shape, dtype=dtype).masked_fill(attention_mask == 0,
                                                                              torch.finfo(dtype).min)
        out = self.inner(input_ids=input_ids, attention_mask=additive[:, None], position_ids=position_ids,
                         past_key_values=past_key_values, use_cache=use_cache)
        added = past_key_values.get_seq_length() - before
        if not store_kv and added:
            past_key_values.crop(-added)  # transformers >= 5: the tokens to remove, negative
        return out


def load_sdar_generate(repo: Path):
    """SDAR's ``generate.py`` at :data:`COMMIT`, imported from a clone (``git show``), with its sampler in the
    greedy limit."""
    text = subprocess.run(["git", "-C", str(repo), "show", f"{COMMIT}:generate.py"], check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "sdar_generate.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("sdar_generate", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def greedy(logits, temperature=1.0, top_k=0, top_p=1.0):
        probs = torch.softmax(logits.float(), dim=-1)
        token = logits.argmax(-1)
        return token, probs.gather(-1, token[..., None]).squeeze(-1)

    mod.sample_with_temperature_topk_topp = greedy
    return mod


def encode(adapter, prompt: str) -> torch.Tensor:
    from maskrl.text import encode_prompts

    ids, _ = encode_prompts(adapter.tokenizer, [prompt])
    return ids


def run_sdar(mod, adapter, name: str, prompt: str) -> list[int]:
    """SDAR's tokens after the prompt (``[MASK]`` where it stopped before decoding)."""
    rule, spb, thr, _, _, gen = SETTINGS[name]
    ids = encode(adapter, prompt)
    x = mod.block_diffusion_generate(SdarShim(adapter), {"input_ids": ids}, adapter.mask_id, gen_length=gen,
                                     block_length=adapter.block_size, denoising_steps=spb, temperature=0.0,
                                     remasking_strategy=rule, confidence_threshold=thr,
                                     stopping_criteria_idx=[adapter.eos_id] if name == "stop" else None)
    return x[0, ids.shape[1]:].tolist()


def maskrl_config(name: str, cache: str = "none"):
    from maskrl.sampling import SamplerConfig

    rule, spb, thr, _, _, gen = SETTINGS[name]
    return SamplerConfig(gen_length=gen, block_length=4, steps=spb * gen // 4, remasking=rule, threshold=thr,
                         cache=cache, early_stop=name == "stop")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdar-repo", type=Path, default=Path("/work/.mirror/JetAstra+SDAR/repo"))
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "golden" / "sdar_reference.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    mod = load_sdar_generate(args.sdar_repo)
    record = {"source": f"JetAstra/SDAR generate.py @ {COMMIT}", "prompts": PROMPTS, "settings": {}}
    for name, spec in SETTINGS.items():
        adapter = tiny_block_model(eos_bias=spec[3], scale=spec[4])
        with torch.no_grad():
            rows = [run_sdar(mod, adapter, name, p) for p in PROMPTS]
        record["settings"][name] = {"remasking": spec[0], "steps_per_block": spec[1], "threshold": spec[2],
                                    "eos_bias": spec[3], "scale": spec[4], "gen_length": spec[5], "tokens": rows}
        print(name, [sum(t != adapter.mask_id for t in r) for r in rows], file=sys.stderr)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
