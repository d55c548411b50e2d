"""Issue 48 item 5: ``maskrl eval`` and the lm-eval model decode a saved block-diffusion model the block
way (its block size, the exact block cache, per-row early stop, one token a step) and score
loglikelihood with the block likelihood; a saved full-attention model keeps LLaDA's defaults."""
from __future__ import annotations

import csv

import pytest
import torch

from maskrl.evaluate import harness_samplers, resolve_prompt_settings, run_harness
from maskrl.models import build_tiny, save_model
from maskrl.models.families import model_block_size


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("block_eval")
    kw = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=3)
    return {b: save_model(build_tiny(block_size=b, **kw), tmp / f"block{b}") for b in (4, None)}


def test_model_block_size_before_loading(folders):
    assert model_block_size(folders[4]) == 4 and model_block_size(folders[None]) is None
    assert model_block_size("Gen-Verse/TraDo-4B-Instruct") == 4
    assert model_block_size("GSAI-ML/LLaDA-8B-Instruct") is None
    from maskrl.config import load_config
    from maskrl.plan import model_shape

    shape = model_shape(load_config([], [f"model.path={folders[4]}"]))  # the planner reads the same folder
    assert (shape.family, shape.block_size, shape.hidden_size) == ("tiny", 4, 32)


def test_eval_defaults_follow_the_block_model(folders):
    """No prompt card: a block model's block size, steps L, cache block, early stop; flags still win."""
    used = resolve_prompt_settings(folders[4], "sudoku4x4", gen_lengths=[16])
    s = harness_samplers([16], used["block_length"]["value"], used["steps"]["value"], used)[16]
    assert (s.block_length, s.steps, s.cache, s.early_stop, s.temperature) == (4, 16, "block", True, 0.0)
    used = resolve_prompt_settings(folders[4], "sudoku4x4", gen_lengths=[16], steps=8)
    assert harness_samplers([16], 4, 8, used)[16].steps == 8
    full = resolve_prompt_settings(folders[None], "sudoku4x4", gen_lengths=[64])
    s = harness_samplers([64], full["block_length"]["value"], full["steps"]["value"], full)[64]
    assert (s.block_length, s.steps, s.cache, s.early_stop) == (32, 32, "none", False)


def _sudoku_csv(tmp_path):
    from maskrl.tasks import default_data_dir

    root = default_data_dir()
    if root is None or not (root / "sudoku4x4" / "4x4_test_sudoku.csv").is_file():
        pytest.skip("no ../shared/data/sudoku4x4")
    with open(root / "sudoku4x4" / "4x4_test_sudoku.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))[:3]
    path = tmp_path / "rows.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["Puzzle", "Solution"])
        w.writeheader()
        w.writerows(rows)
    return path


def test_maskrl_eval_decodes_the_block_way(folders, tmp_path):
    """``maskrl eval`` on the saved block model: its completions are those of the block sampler with the
    cache and early stop (equal, token for token, to the no-cache decoding up to each row's stop)."""
    from maskrl.evaluate import complete
    from maskrl.models import load
    from maskrl.sampling import SamplerConfig

    data = _sudoku_csv(tmp_path)
    summary = run_harness(model=folders[4], task_name="sudoku4x4", gen_lengths=[16], out_dir=tmp_path / "out",
                          data_path=data, device="cpu", prompt_template="{puzzle}=", chat_template=False,
                          progress=False)
    sampler = summary["results"][0]["sampler"]
    assert (sampler["block_length"], sampler["steps"], sampler["cache"], sampler["early_stop"]) == (4, 16, "block", True)
    import json

    rows = [json.loads(x) for x in (tmp_path / "out" / "samples_L16.jsonl").read_text().splitlines()]
    ad = load(folders[4], dtype="float32")
    plain = complete(ad, [r["prompt"] for r in rows], SamplerConfig(gen_length=16, block_length=4, steps=16,
                                                                     temperature=0.0), batch_size=8)
    assert [r["completion"] for r in rows] == plain


@pytest.mark.numerics
def test_block_logits_equal_one_forward_per_block(folders):
    """:func:`block_logits` (one doubled forward) = a slow loop: for each block b, the plain block-causal
    forward of [prompt, clean completion blocks < b, block b masked], its block's logits."""
    from maskrl.likelihood.blocks import block_logits
    from maskrl.models import load

    ad = load(folders[4], dtype="float32")
    g = torch.Generator().manual_seed(0)
    P, L = 6, 10  # P mod 4 = 2: the first block holds 2 prompt tokens and 2 completion positions
    prompt = torch.randint(3, 20, (1, P), generator=g)
    comp = torch.randint(3, 20, (1, L), generator=g)
    masked = torch.full_like(comp, ad.mask_id)
    with torch.no_grad():
        fast = block_logits(ad, prompt, torch.ones_like(prompt, dtype=torch.bool), masked, comp)[0]
        want = torch.empty_like(fast)
        for lo in range(0, P + L, 4):
            cols = [c for c in range(max(lo, P), min(lo + 4, P + L))]
            if not cols:
                continue
            x = torch.cat([prompt, comp], 1)[:, : lo + 4].clone()
            x[:, cols] = ad.mask_id
            attn = torch.ones_like(x, dtype=torch.bool)
            out = ad.logits(x, attn)[0]
            want[[c - P for c in cols]] = out[cols]
    scale = want.abs().max()
    assert (fast - want).abs().max() <= 64 * torch.finfo(torch.float32).eps * scale


def test_lm_eval_model_decodes_and_scores_the_block_way(folders):
    """The lm-eval model on the saved block model: the block sampler by default; loglikelihood's ELBO is
    the block likelihood's and ``is_greedy`` the per-block argmax (:func:`block_logits`)."""
    pytest.importorskip("lm_eval")
    from maskrl.likelihood.blocks import block_logits
    from maskrl.lm_eval_model import MaskrlLM

    lm = MaskrlLM(pretrained=str(folders[4]), gen_length=16, elbo_nodes=2, elbo_draws=2)
    s = lm.sampler
    assert (s.block_length, s.steps, s.cache, s.early_stop) == (4, 16, "block", True)
    ctx = lm.adapter.tokenizer("1234=", add_special_tokens=False).input_ids
    ad = lm.adapter
    p = torch.tensor([ctx])
    with torch.no_grad():  # the per-block argmax continuation: each block's argmax given the clean blocks left of it
        cont = []
        for i in range(6):
            c = torch.tensor([cont + [ad.mask_id] * (6 - len(cont))])
            cont.append(int(block_logits(ad, p, torch.ones_like(p, dtype=torch.bool),
                                         torch.full((1, 6), ad.mask_id), c)[0, i].argmax()))
    ll, greedy = lm.score(ctx, cont)
    assert greedy and ll < 0
    other = list(cont)
    other[0] += 1
    assert lm.score(ctx, other)[1] is False
    full = MaskrlLM(pretrained=str(folders[None]), gen_length=64)
    assert (full.sampler.block_length, full.sampler.cache) == (32, "none")


def _per_block_logits(ad, prompt, noisy, context):
    """Slow reference: block by block, the plain block-causal forward of [prompt, clean context blocks
    before the block, the block as in ``noisy``]; that block's completion logits. ``[L, V]``, one row."""
    P, L, b = prompt.shape[1], noisy.shape[1], ad.block_size
    out = torch.empty((L, ad.model.config.vocab_size))
    for lo in range(0, P + L, b):
        cols = list(range(max(lo, P), min(lo + b, P + L)))
        if not cols:
            continue
        x = torch.cat([prompt, context], 1)[:, : lo + b].clone()
        x[:, cols] = noisy[:, [c - P for c in cols]]
        out[[c - P for c in cols]] = ad.logits(x, torch.ones_like(x, dtype=torch.bool))[0, cols].float()
    return out


@pytest.mark.numerics
def test_sft_loss_on_a_block_model_scores_each_block_over_clean_earlier_blocks(folders):
    """SFT on a block model trains the conditional the block sampler decodes with: each block's noisy
    tokens over the clean earlier blocks (by hand with the same draws and the slow per-block loop)."""
    from maskrl.models import load
    from maskrl.sft import sft_loss

    ad = load(folders[4], dtype="float32")
    g = torch.Generator().manual_seed(1)
    prompt, answer = torch.randint(3, 20, (1, 6), generator=g), torch.randint(3, 20, (1, 10), generator=g)
    with torch.no_grad():
        got = sft_loss(ad, prompt, torch.ones_like(prompt, dtype=torch.bool), answer, torch.Generator().manual_seed(5))
        g = torch.Generator().manual_seed(5)  # the same draws as sft_loss: t, then the masks
        t = 1e-3 + (1 - 1e-3) * torch.rand((1, 1), generator=g)
        masked = torch.rand((1, 10), generator=g) < t
        noisy = torch.where(masked, ad.mask_id, answer)
        ce = torch.nn.functional.cross_entropy(_per_block_logits(ad, prompt, noisy, answer), answer[0], reduction="none")
        want = (ce * masked[0] / t[0]).sum() / 10
        plain = torch.cat([prompt, noisy], 1)  # the plain forward reads earlier blocks' masks: another loss
        ce_plain = torch.nn.functional.cross_entropy(ad.logits(plain)[0, 6:].float(), answer[0], reduction="none")
    assert masked.any() and not masked.all()
    assert abs(float(got) - float(want)) <= 64 * torch.finfo(torch.float32).eps * float(want)
    assert abs(float((ce_plain * masked[0] / t[0]).sum() / 10) - float(want)) > 1e-4
