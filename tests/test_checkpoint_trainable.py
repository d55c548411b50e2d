"""Checkpoints hold the trainable weights only; the frozen base is re-read and fingerprinted; the LoRA
export's float32 copy is made on the CPU (maskrl.training.checkpoint, maskrl.models.export)."""
from __future__ import annotations

import copy

import pytest
import torch
from safetensors import safe_open

from maskrl.models import apply_lora
from maskrl.models.export import cpu_float32_copy
from maskrl.tasks.base import Example
from maskrl.training.checkpoint import FrozenWeightsError, TRAINER_STATE
from maskrl.trainer import RLTrainer
from conftest import OddChars
from conftest import fresh_tiny as _tiny
from conftest import small_cfg as _cfg


def _examples(n=6):
    return [Example(id=i, prompt=f"say a {i}") for i in range(n)]


def _lora(dtype=torch.float32):
    a = _tiny()
    for p in a.model.parameters():
        p.data = p.data.to(dtype)
    return apply_lora(a, rank=4, alpha=8.0, target_modules="all-linear", seed=0)


def _keys(ckpt):
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        return set(f.keys())


def _trainer(tmp_path, name, adapter, **over):
    return RLTrainer(_cfg(tmp_path / name, **over), adapter, OddChars(), _examples())


def test_lora_checkpoint_holds_the_adapter_not_the_base_and_resumes_bit_for_bit(tmp_path):
    init = _lora(torch.bfloat16)
    a = _trainer(tmp_path, "a", copy.deepcopy(init))
    a.step()
    ckpt = a.save_checkpoint(tmp_path / "a" / "checkpoints" / "step_1")
    trainable = {n for n, p in a.policy.model.named_parameters() if p.requires_grad}
    frozen = {n for n, p in a.policy.model.named_parameters() if not p.requires_grad}
    assert trainable and frozen
    keys = _keys(ckpt)
    assert trainable <= keys and not (keys & frozen), sorted(keys & frozen)[:3]
    assert all("lora_" in k for k in keys)
    state = torch.load(ckpt / TRAINER_STATE, weights_only=False)
    assert state["frozen"]["entries"] == sum(p.numel() for p in a.policy.model.parameters() if not p.requires_grad)
    m2 = a.step()

    b = _trainer(tmp_path, "b", copy.deepcopy(init))
    b.load_checkpoint(ckpt)
    n2 = b.step()
    assert n2["base/policy_loss"] == m2["base/policy_loss"] and n2["reward"] == m2["reward"]
    for (n, p), q in zip(a.policy_eval.model.named_parameters(), b.policy_eval.model.parameters()):
        assert torch.equal(p, q), n


def test_full_finetune_checkpoint_keeps_every_weight(tmp_path):
    a = _trainer(tmp_path, "a", _tiny())
    ckpt = a.save_checkpoint(tmp_path / "a" / "checkpoints" / "step_0")
    names = {n for n, _ in a.policy.model.named_parameters()}
    assert names <= _keys(ckpt)
    assert torch.load(ckpt / TRAINER_STATE, weights_only=False)["frozen"]["entries"] == 0


def test_checkpoint_with_every_weight_still_loads(tmp_path):
    """Checkpoints of earlier versions hold the frozen base too; they load as before."""
    init = _lora()
    a = _trainer(tmp_path, "a", copy.deepcopy(init))
    a.step()
    ckpt = tmp_path / "a" / "checkpoints" / "step_1"
    a.save_checkpoint(ckpt)
    a.acc.save_state(str(ckpt), safe_serialization=True)  # overwrite the weights file the old way: every weight
    assert {n for n, _ in a.policy.model.named_parameters()} <= _keys(ckpt)
    b = _trainer(tmp_path, "b", copy.deepcopy(init))
    b.load_checkpoint(ckpt)
    for p, q in zip(a.policy_eval.model.parameters(), b.policy_eval.model.parameters()):
        assert torch.equal(p, q)


def test_resume_on_another_base_is_refused_unless_forced(tmp_path, caplog):
    init = _lora()
    a = _trainer(tmp_path, "a", copy.deepcopy(init))
    ckpt = a.save_checkpoint(tmp_path / "a" / "checkpoints" / "step_0")
    other = copy.deepcopy(init)
    with torch.no_grad():
        next(p for p in other.model.parameters() if not p.requires_grad).view(-1)[0] += 1.0
    b = _trainer(tmp_path, "b", other)
    with pytest.raises(FrozenWeightsError, match="model.path .* not the ones it was trained on"):
        b.load_checkpoint(ckpt)
    with caplog.at_level("WARNING", logger="maskrl.trainer"):
        b.load_checkpoint(ckpt, force=True)
    assert "resuming anyway" in caplog.text


def test_resume_with_another_lora_rank_names_the_missing_weights(tmp_path):
    a = _trainer(tmp_path, "a", _lora())
    ckpt = a.save_checkpoint(tmp_path / "a" / "checkpoints" / "step_0")
    narrower = apply_lora(_tiny(), rank=2, alpha=4.0, target_modules=["q_proj"], seed=0)
    b = _trainer(tmp_path, "b", narrower)
    with pytest.raises(FrozenWeightsError, match="keep model.lora_\\* as trained"):
        b.load_checkpoint(ckpt)  # another trainable set: the frozen set differs too
    with pytest.raises((ValueError, RuntimeError), match="does not match the model|size mismatch"):
        b.load_checkpoint(ckpt, force=True)


def test_cpu_float32_copy_never_deep_copies_a_parameter_on_its_device(monkeypatch):
    live = _lora(torch.bfloat16).model
    before = {n: p.detach().clone() for n, p in live.named_parameters()}
    ref = copy.deepcopy(live).to(device="cpu", dtype=torch.float32)

    def refuse(self, memo):
        raise AssertionError("a parameter was deep-copied where it lives")

    monkeypatch.setattr(torch.nn.Parameter, "__deepcopy__", refuse)
    out = cpu_float32_copy(live)
    monkeypatch.undo()
    got, want = dict(out.named_parameters()), dict(ref.named_parameters())
    assert got.keys() == want.keys()
    for n, p in got.items():
        assert p.dtype == torch.float32 and p.device.type == "cpu" and torch.equal(p, want[n]), n
        assert p.requires_grad == want[n].requires_grad, n
    for n, p in live.named_parameters():  # the live policy is untouched (still bf16 base, same values)
        assert torch.equal(p, before[n]) and p.dtype == before[n].dtype
    assert {b.dtype for b in out.buffers() if b.is_floating_point()} <= {torch.float32}


def test_cpu_float32_copy_keeps_ties():
    a = _tiny()
    lm, emb = a.model.get_output_embeddings(), a.model.get_input_embeddings()
    lm.weight = emb.weight  # tie them
    out = cpu_float32_copy(a.model)
    assert out.get_output_embeddings().weight is out.get_input_embeddings().weight
    assert out.get_input_embeddings().weight is not emb.weight


@pytest.mark.parametrize("lora", [True, False])
def test_plan_files_match_the_checkpoint_and_export_written(tmp_path, lora):
    """``maskrl plan``'s ``files_gib`` (checkpoint size, export size) against the folders a run writes."""
    from maskrl.models import save_model
    from maskrl.plan import GIB
    from maskrl.plan.memory import files_gib

    adapter = _lora(torch.bfloat16) if lora else _tiny()
    over = {"model.lora_rank": 4} if lora else {}
    tr = _trainer(tmp_path, "a", adapter, **over)
    tr.step()
    ckpt = tr.save_checkpoint(tmp_path / "a" / "checkpoints" / "step_1")
    params = list(tr.policy_eval.model.parameters())
    pm = {"params": sum(p.numel() for p in params), "trainable": sum(p.numel() for p in params if p.requires_grad),
          "total_bytes": sum(p.numel() * p.element_size() for p in params)}
    plan = files_gib(tr.cfg, pm)
    written = (ckpt / "model.safetensors").stat().st_size + (ckpt / "optimizer.bin").stat().st_size
    assert written == pytest.approx(plan["checkpoint"] * GIB, rel=0.05, abs=64 * 1024)
    out = save_model(tr.policy_eval, tmp_path / "model")
    weights = sum(f.stat().st_size for f in out.rglob("*.safetensors"))
    assert weights == pytest.approx(plan["export_disk"] * GIB, rel=0.05, abs=64 * 1024)


def test_update_fidelity_in_row_slices_counts_as_whole_matrices(monkeypatch):
    """update_fidelity's float64 work runs in row slices (bounded memory at 8B); any slicing gives the
    same equal-entry count and the same error (sums in another order: float64 rounding only)."""
    from maskrl.models import export as ex

    live = _lora(torch.bfloat16).model
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in live.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 1e-2)
    merged = cpu_float32_copy(live).merge_and_unload()
    whole = ex.update_fidelity(live, merged, torch.bfloat16)
    monkeypatch.setattr(ex, "FIDELITY_SLICE", 7)  # slices of a row or less, with remainders
    sliced = ex.update_fidelity(live, merged, torch.bfloat16)
    assert sliced["adapted_entries"] == whole["adapted_entries"] and sliced["equal_to_base"] == whole["equal_to_base"]
    assert 0 < whole["update_rel_error"] and sliced["update_rel_error"] == pytest.approx(whole["update_rel_error"], rel=1e-12)
