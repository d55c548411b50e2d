"""Record DARE's EBPO on small tensors, as the reference of tests/test_ebpo_dare.py.

DARE (github.com/yjyddq/DARE, commit 83ae8a3) is the open EBPO implementation for LLaDA2.x and SDAR.
This script reads three of its files from a local git mirror at that commit (it copies nothing into
the project) and runs them with verl / ray stubbed out:

- ``verl/trainer/ppo/dllm_core_algos.py``: ``_forward_process_ebpo`` (the per-block masks and their
  rates p) under seeded global RNG, with the offset u of its stratified noise levels recorded;
- ``verl/workers/actor/ebpo_actor_mixin.py``: ``EBPOActorMixin.update_policy`` itself, on a stand-in
  actor whose "model" returns a leaf tensor of per-(draw, token) ELBO contributions ``θ [B, D, R]``
  (DARE's ``loss_per_token``: ``log p / p`` at the hidden positions): the composite ELBO, the sequence
  advantage, the log-domain clip, the KL, the micro-batch scaling and DARE's proxy-gradient replay
  all run as DARE wrote them; the gradient it leaves on θ and its logged ``pg_loss`` / ``kl_loss`` are
  recorded.

Usage (from the repository root; the mirror is a bare or normal clone of yjyddq/DARE holding 83ae8a3):

    python benchmarks/references/dare_ebpo_reference.py --dare-git /path/to/DARE.git \
        --out tests/data/dare_ebpo_reference.json
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import torch

COMMIT = "83ae8a3"
ALGOS = "verl/trainer/ppo/dllm_core_algos.py"
MIXIN = "verl/workers/actor/ebpo_actor_mixin.py"


def _source(git_dir: str, path: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, "show", f"{COMMIT}:{path}"], check=True,
                          capture_output=True, text=True).stdout


class Batch(dict):
    """The face of a TensorDict the mixin uses: row chunks (``split``) and ``to(device)``."""

    def split(self, size: int) -> list["Batch"]:
        n = len(next(iter(self.values())))
        return [Batch({k: v[i: i + size] for k, v in self.items()}) for i in range(0, n, size)]

    def to(self, device) -> "Batch":
        return self


class DataProto:
    """The face of verl's DataProto the mixin uses (``select``, ``batch``, ``meta_info``)."""

    def __init__(self, batch: Batch, meta_info: dict):
        self.batch, self.meta_info, self.non_tensor_batch = batch, meta_info, {}

    def select(self, batch_keys=None, non_tensor_batch_keys=None) -> "DataProto":
        return DataProto(Batch({k: self.batch[k] for k in batch_keys}), self.meta_info)


def _stub_modules() -> None:
    """verl's modules the two files import, reduced to what they call."""
    def module(name: str, **attrs) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    def append_to_dict(data: dict, new: dict) -> None:
        for k, v in new.items():
            data.setdefault(k, []).append(v)

    class GPUMemoryLogger:  # a decorator that logs memory: here, nothing
        def __init__(self, role=None, logger=None):
            pass

        def __call__(self, fn):
            return fn

    module("verl", DataProto=DataProto)
    module("verl.trainer")
    module("verl.trainer.ppo")
    module("verl.trainer.ppo.core_algos")  # star-imported; EBPO's functions use none of it
    module("verl.trainer.ppo.mdpo_algos", compute_mdpo_policy_loss=None)  # re-exported at the end; unused
    module("verl.utils")
    module("verl.utils.debug", GPUMemoryLogger=GPUMemoryLogger)
    module("verl.utils.device", get_torch_device=lambda: SimpleNamespace(current_device=lambda: "cpu"))
    module("verl.utils.py_functional", append_to_dict=append_to_dict)
    module("verl.utils.seqlen_balancing", rearrange_micro_batches=None)


def load_dare(git_dir: str) -> tuple[types.ModuleType, type]:
    """``(dllm_core_algos, EBPOActorMixin)`` executed from the mirror at :data:`COMMIT`."""
    _stub_modules()
    algos = types.ModuleType("verl.trainer.ppo.dllm_core_algos")
    sys.modules[algos.__name__] = algos
    exec(compile(_source(git_dir, ALGOS), ALGOS, "exec"), algos.__dict__)
    mixin = types.ModuleType("verl.workers.actor.ebpo_actor_mixin")
    mixin.__file__ = MIXIN  # names its logger
    exec(compile(_source(git_dir, MIXIN), MIXIN, "exec"), mixin.__dict__)
    return algos, mixin.EBPOActorMixin


class _Optimizer:
    """Keeps the gradient DARE leaves on θ before each optimizer step."""

    def __init__(self, theta: torch.Tensor):
        self.theta, self.grads = theta, []

    def zero_grad(self) -> None:
        self.theta.grad = None


def run_update(mixin_cls: type, case: dict) -> dict:
    """DARE's ``update_policy`` on one case; returns its logged losses and the gradient on θ."""
    theta = case["theta"].clone().requires_grad_(True)  # [B, D, R]
    b, d, r = theta.shape
    opt = _Optimizer(theta)

    class Actor(mixin_cls):
        def _forward_micro_batch(self, micro_batch, temperature, n_l, mc_num, calculate_entropy=False,
                                 call_fn_name=""):
            rows = micro_batch["input_ids"][:, 0]  # the row index travels in column 0
            draws = micro_batch["perturbed_seq"][0, :, 0]  # the draw index in column 0
            return None, None, theta[rows][:, draws]

        def _optimizer_step(self):
            opt.grads.append(theta.grad.detach().clone())
            return torch.tensor(0.0)

    actor = Actor()
    actor.config = SimpleNamespace(**case["config"])
    actor.mc_num, actor.actor_module, actor.actor_optimizer = d, torch.nn.Module(), opt
    p = 3
    valid = case["valid"]
    input_ids = torch.zeros((b, p + r), dtype=torch.long)
    input_ids[:, 0] = torch.arange(b)
    perturbed = torch.zeros((b, d, p + r), dtype=torch.long)
    perturbed[:, :, 0] = torch.arange(d)
    batch = Batch(responses=torch.zeros((b, r), dtype=torch.long), input_ids=input_ids,
                  attention_mask=torch.cat([torch.ones((b, p), dtype=torch.long), valid.long()], 1),
                  position_ids=torch.zeros((b, p + r), dtype=torch.long), old_loss_per_sample=case["old"],
                  advantages=case["advantages"], perturbed_seq=perturbed, mask_indices=perturbed.bool(),
                  p_mask=torch.ones((b, d, p + r)))
    if case["config"]["use_kl_loss"]:
        ref = (case["ref"] * valid[:, None]).sum(-1).mean(1)  # the reference's composite ELBO
        batch["ref_log_probs"] = ref[:, None].expand(b, r).clone()  # as DARE's log_prob: expanded
    metrics = actor.update_policy(DataProto(batch, {"temperature": 1.0}))
    assert len(opt.grads) == 1, "one optimizer step per case"
    pg, kl = metrics["actor/pg_loss"], metrics.get("actor/kl_loss", [0.0] * len(metrics["actor/pg_loss"]))
    coef = case["config"]["kl_loss_coef"]
    return {"grad": opt.grads[0].tolist(), "loss": sum(a + coef * k for a, k in zip(pg, kl)) / len(pg),
            "pg_loss": sum(pg) / len(pg), "kl_loss": sum(kl) / len(kl)}


def _config(**over) -> dict:
    base = dict(entropy_coeff=0.0, ppo_mini_batch_size=6, ppo_micro_batch_size_per_gpu=2, ppo_epochs=1,
                use_dynamic_bsz=False, clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.2,
                loss_agg_mode="token-mean", use_kl_loss=False, kl_loss_type="low_var_kl", kl_loss_coef=0.0)
    base.update(over)
    return base


def loss_cases(seed: int = 0) -> list[dict]:
    """Three cases of 6 sequences, 4 draws, 10 positions (valid prefixes of 10, 7, 3, 9, 5, 1), with
    log-ratios spread over ±0.6 so that the clip binds on some sequences of both signs."""
    g = torch.Generator().manual_seed(seed)
    b, d, r = 6, 4, 10
    valid = torch.arange(r)[None] < torch.tensor([10, 7, 3, 9, 5, 1])[:, None]
    old = -torch.rand((b, d, r), generator=g, dtype=torch.float64) * 4 * valid[:, None]
    shift = torch.tensor([0.5, -0.4, 0.1, -0.05, 0.3, -0.6], dtype=torch.float64)  # composite log-ratios
    noise = (torch.rand((b, d, r), generator=g, dtype=torch.float64) - 0.5) * 0.2 * valid[:, None]
    theta = old + noise + (shift / valid.sum(-1))[:, None, None] * valid[:, None]
    ref = old + (torch.rand((b, d, r), generator=g, dtype=torch.float64) - 0.5) * 0.5 * valid[:, None]
    seq_adv = torch.tensor([1.2, -0.7, 0.0, 0.9, -1.5, 0.4], dtype=torch.float64)
    tok_adv = (seq_adv[:, None] + torch.randn((b, r), generator=g, dtype=torch.float64)) * valid
    f32 = lambda x: x.float().double()  # noqa: E731  values a float32 holds (DARE casts advantages and ref to it)
    theta, old, ref, seq_adv, tok_adv = f32(theta), f32(old), f32(ref), f32(seq_adv), f32(tok_adv)
    common = dict(theta=theta, old=old, ref=ref, valid=valid)
    return [
        dict(name="sequence_advantages", advantages=seq_adv, config=_config(), **common),
        dict(name="asymmetric_clip_and_kl", advantages=seq_adv, config=_config(
            clip_ratio_high=0.28, use_kl_loss=True, kl_loss_coef=0.05), **common),
        dict(name="token_advantages", advantages=tok_adv, config=_config(), **common),
    ]


def mask_cases(algos: types.ModuleType) -> list[dict]:
    """``_forward_process_ebpo`` on rows with left-padded prompts (3 and 6 real tokens) and valid
    completions of 11 and 6 tokens (right padding), block 4, 5 draws (``n_l``), under seeds 0 and 1."""
    out = []
    p, r, draws, block = 6, 12, 5, 4
    for seed, (prompt_len, comp_len) in enumerate([(3, 11), (6, 6)]):
        attn = torch.zeros(p + r, dtype=torch.long)
        attn[p - prompt_len: p + comp_len] = 1
        ids = torch.arange(10, 10 + p + r)[None].repeat(draws, 1)
        torch.manual_seed(seed)
        offset = float(torch.rand(()))  # the first draw _forward_process_ebpo makes (t=None)
        torch.manual_seed(seed)
        _, hide, rate = algos._forward_process_ebpo(ids, attn, p, block_length=block, MASK_TOKEN_ID=1,
                                                    block_origin="global")
        out.append({"prompt_mask": attn[:p].bool().tolist(), "valid": attn[p:].bool().tolist(), "draws": draws,
                    "block_length": block, "offset": offset, "hide": hide[:, p:].tolist(),
                    "rate": rate[:, p:].tolist()})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dare-git", required=True, help="git dir of a yjyddq/DARE clone holding commit 83ae8a3")
    ap.add_argument("--out", default="tests/data/dare_ebpo_reference.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    algos, mixin_cls = load_dare(args.dare_git)
    cases = []
    for c in loss_cases():
        rec = run_update(mixin_cls, c)
        cases.append({"name": c["name"], "config": c["config"], "theta": c["theta"].tolist(), "old": c["old"].tolist(),
                      "ref": c["ref"].tolist(), "valid": c["valid"].tolist(), "advantages": c["advantages"].tolist(),
                      **rec})
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from maskrl.records import write_record
    write_record(Path(args.out), {"source": f"yjyddq/DARE {COMMIT}: {ALGOS}, {MIXIN}", "torch": torch.__version__,
                                  "loss_cases": cases, "mask_cases": mask_cases(algos)}, indent=None)


if __name__ == "__main__":
    main()
