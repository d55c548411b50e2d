"""``maskrl plan`` (issue 21): FLOPs equal to torch's counter on real trainer steps, the memory arithmetic
of the sharding strategies, option checks, and every 8B recipe planned on 1x80 GB and 8x80 GB and
dry-run on the stand-in model."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import WAIT_CAP_S
import torch

from maskrl.config import load_config
from maskrl.plan import (GIB, FlopModel, Hardware, PlanError, _static_memory, dispo_step_rows, dry_run, make_plan,
                         model_shape, param_memory, parse_bytes, record_work, strategy_from_accelerate,
                         synthetic_trainer, work_table)
from maskrl.plan.report import merges_lora

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RECIPES_8B = sorted(CONFIGS.glob("llada8b_*.yaml")) + sorted(CONFIGS.glob("dream7b_*.yaml")) + sorted(
    p for pat in ("trado4b_*.yaml", "trado8b_*.yaml", "sdar8b_*.yaml", "llada2_mini_*.yaml") for p in CONFIGS.glob(pat))
TINY = ["model.tiny.hidden_size=32", "model.tiny.num_layers=2", "model.tiny.num_heads=2",
        "model.tiny.intermediate_size=64", "rollout.gen_length=8", "rollout.block_length=4", "rollout.steps=4",
        "rollout.temperature=0.9", "train.prompts_per_step=1", "train.group_size=2"]


@pytest.mark.parametrize("extra", [
    ["train.inner_iterations=2"],  # θ_old, reference and θ passes, full fine-tuning
    ["train.inner_iterations=1", "model.lora_rank=4", "model.gradient_checkpointing=true", "likelihood.name=state",
     "train.max_forward_rows=3"],  # LoRA + recomputation, one row per commit step, split rows
    ["train.inner_iterations=1", "model.lora_rank=4", "rollout.merge_lora=false"],  # the peft model samples
    ["train.inner_iterations=1", "model.tiny.block_size=4"],  # block-diffusion: doubled x_t ⊕ x_0 rows
    ["train.inner_iterations=1", "model.tiny.block_size=4", "rollout.cache=block"],  # + the exact block cache
], ids=["full_mu2", "lora_ckpt_state", "lora_unmerged", "block4", "block4_cache"])
def test_plan_flops_equal_flop_counter_on_real_steps(extra):
    """The plan's FLOPs of one step (stand-in work, meta-model counts) equal FlopCounterMode around a real
    ``RLTrainer.step`` of the same config (SDPA's math backend so that attention is counted)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    cfg = load_config([], TINY + extra)
    calls = record_work(cfg, prompt_length=6)
    fm = FlopModel(model_shape(cfg), torch.float32, {"rank": 4, "alpha": 32.0, "targets": "all-linear"}
                   if cfg.model.lora_rank else None, cfg.model.gradient_checkpointing)
    merged = cfg.model.lora_rank > 0 and cfg.rollout.merge_lora  # the rollout samples from a merged copy
    _, planned, _ = work_table(calls, fm, cfg.model.gradient_checkpointing, merged_rollout=merged)
    trainer = synthetic_trainer(cfg, 6)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        trainer.step()
    assert planned == fc.get_total_flops() > 0


def test_plan_phases_follow_the_trainer_rules():
    """θ_old only for μ > 1 with a ratio objective, the reference only with β > 0, θ always; μ each."""
    calls = record_work(load_config([], TINY + ["train.inner_iterations=3"]), prompt_length=6)
    phases = {c.phase: c.count for c in calls}
    assert phases == {"rollout": 1, "theta_old": 3, "reference": 3, "theta": 3}
    assert sum(c.phase == "rollout" for c in calls) == 4  # one forward per denoising step
    calls = record_work(load_config([], TINY + ["train.inner_iterations=1", "objective.beta=0"]), prompt_length=6)
    assert {c.phase for c in calls} == {"rollout", "theta"}
    theta = [c for c in calls if c.phase == "theta"]
    assert [(c.rows, c.seq, c.scored) for c in theta] == [(2, 6 + 8, 16)]  # mean-field: 1 row, L scored per sequence


#: DiSPO on the tiny recipe: B 2, G 2 (4 trajectories), Z 3, μ 2, 5 sequences per micro-batch, T 4, no cache
DISPO = TINY + ["train.prompts_per_step=2", "train.group_size=2", "train.inner_iterations=2",
                "train.micro_batch_size=5", "credit=[{name: dispo, z: 3, timing: late}]"]


def _dispo_counts(seed: int) -> tuple[int, int]:
    calls = record_work(load_config([], DISPO), prompt_length=6, seed=seed)
    return sum(c.count for c in calls), sum(c.rows * c.count for c in calls if c.phase == "theta" and c.term == "step")


def test_dispo_forwards_are_the_recipes_worst_case_not_a_sample():
    """DiSPO's step term is planned at its bound (docs/spec.md §4: one state per trajectory, each kept state Z
    rows, all kept), the same for every stand-in seed and process, not the states whose random rewards
    happened to differ. By hand: rollout T = 4 forwards (one per step; the branch logits come with
    them); base term 4 sequences -> 1 micro-batch; step term B·G·Z = 2·2·3 = 12 rows -> 3 micro-batches
    (5, 5, 2); each micro-batch θ_old (μ > 1, ratio), reference (β 0.04), θ, μ = 2 times each:
    4 + (1 + 3)·3·2 = 28 forwards, and θ's step rows 12·μ = 24."""
    import subprocess
    import sys

    cfg = load_config([], DISPO)
    assert dispo_step_rows(cfg) == 12
    expected = (4 + (1 + 3) * 3 * 2, 12 * 2)
    assert _dispo_counts(0) == _dispo_counts(1) == expected
    code = ("import sys; sys.path.insert(0, 'tests'); "  # test_plan imports conftest by name, as pytest allows
            "from tests.test_plan import _dispo_counts; print(*_dispo_counts(7))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert tuple(int(v) for v in out.stdout.split()) == expected  # a fresh process, another seed


def test_static_memory_by_strategy():
    """Weights / gradients / AdamW states per process: replicated (DDP, plus its gradient buckets),
    states sharded (ZeRO-2), everything sharded (FSDP, ZeRO-3), the unsharded reference copy of full
    fine-tuning with β > 0."""
    cfg = load_config([], TINY)
    pm = param_memory(model_shape(cfg), torch.float32, None)
    model = synthetic_trainer(cfg, 4).policy.model
    n = sum(p.numel() for p in model.parameters())
    w = 4 * n + sum(b.numel() * b.element_size() for b in model.buffers())  # accelerate counts buffers too
    assert pm["params"] == pm["trainable"] == n and pm["total_bytes"] == w
    ddp = _static_memory(cfg, pm, Hardware(gpus=4, strategy="ddp"), torch.float32, True)
    assert ddp == {"weights": w, "gradients": 4 * n, "optimizer": 8 * n, "ddp_buckets": 4 * n, "reference_copy": w}
    z2 = _static_memory(cfg, pm, Hardware(gpus=4, strategy="zero2"), torch.float32, False)
    assert z2 == {"weights": w, "gradients": n, "optimizer": 2 * n}
    fsdp = _static_memory(cfg, pm, Hardware(gpus=4, strategy="fsdp"), torch.float32, False)
    assert fsdp["weights"] == w / 4 and fsdp["gradients"] == n and fsdp["optimizer"] == 2 * n
    assert fsdp["gathered_layers"] == 2 * pm["largest_layer_bytes"] > 0


def test_known_8b_shapes():
    """LLaDA-8B by hand: 2 x 126464 x 4096 (embedding, head) + 32 x (4 x 4096² + 3 x 4096 x 12288 + 2 x 4096)
    + 4096 = 8,015,581,184; Dream-7B: 7.62 B (Qwen2-7B shape, untied head)."""
    llada = model_shape(load_config([CONFIGS / "llada8b_gsm8k_diffu_grpo.yaml"]))
    dream = model_shape(load_config([CONFIGS / "dream7b_gsm8k_diffu_grpo.yaml"]))
    assert param_memory(llada, torch.bfloat16, None)["params"] == 8_015_581_184
    assert round(param_memory(dream, torch.bfloat16, None)["params"] / 1e9, 2) == 7.62


def test_header_counts_base_and_adapter_apart_with_their_dtypes():
    """LoRA rank 4 on q,v of the tiny bf16 model: the base keeps the no-LoRA count in bfloat16, the adapter
    (fp32 master weights) is r x (in + out) per adapted matrix, 2 layers x (q: 32 -> 32, v: 32 -> 32)
    = 2 x 2 x 4 x 64 = 1,024; the header names both with their dtypes, not one bf16 total."""
    from maskrl.plan import format_plan

    cfg = load_config([], TINY + ["model.dtype=bfloat16", "model.lora_rank=4", "model.lora_target_modules=q_proj,v_proj"])
    shape = model_shape(cfg)
    plain = param_memory(shape, torch.bfloat16, None)
    pm = param_memory(shape, torch.bfloat16, {"rank": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj"]})
    assert pm["base_params"] == plain["params"] and pm["base_dtypes"] == ["bfloat16"]
    assert pm["adapter_params"] == 2 * 2 * 4 * (32 + 32) and pm["adapter_dtypes"] == ["float32"]
    assert pm["params"] == pm["base_params"] + pm["adapter_params"] and pm["trainable"] == pm["adapter_params"]
    assert plain["adapter_params"] == 0 and plain["adapter_dtypes"] == []
    plan = make_plan(cfg, Hardware(gpus=1, gpu_memory=80 * GIB), prompt_length=8, search=False)
    head = format_plan(plan).splitlines()[0]
    base = plain["params"] / 1e3
    assert head.startswith(f"model: tiny {base:.2f} k base params (bfloat16) + LoRA rank 4 adapter 1.02 k params "
                           "(float32), trainable 1.02 k"), head


def test_plan_reports_each_phase_on_stderr():
    """Every phase of a plan says when it starts and how many seconds it took, in order, on the stream
    given (``maskrl plan`` gives stderr); the plans of ``what to change`` are marked with the change."""
    import io

    from maskrl.plan.progress import Progress

    stream = io.StringIO()
    cfg = load_config([], TINY)
    make_plan(cfg, Hardware(gpus=1, gpu_memory=GIB // 4096), prompt_length=8, progress=Progress(stream))
    lines = stream.getvalue().splitlines()
    phases = ["the model's shape", "parameters and FLOP counter", "one RL step", "FLOPs of the step",
              "activation peaks"]
    starts = [next(i for i, ln in enumerate(lines) if ln.startswith(f"maskrl plan: {p}") and ln.endswith(" ..."))
              for p in phases]
    assert starts == sorted(starts)
    for p in phases:
        assert any(ln.startswith(f"maskrl plan: {p}") and ln.endswith(" s") for ln in lines), p
    assert any("does not fit" in ln for ln in lines)
    assert any(ln.startswith("maskrl plan [micro_batch_size=1]: one RL step") for ln in lines), lines


def _qwen3_params(d: int, layers: int, heads: int, kv: int, head_dim: int, ffn: int, vocab: int) -> int:
    """Qwen3 by hand: untied embedding and head, per layer q/o (d x heads·hd), k/v (d x kv·hd), the
    gated MLP (3 x d x ffn), two RMSNorms (d) and the per-head q/k norms (hd each), a final norm (d)."""
    layer = 2 * d * heads * head_dim + 2 * d * kv * head_dim + 3 * d * ffn + 2 * d + 2 * head_dim
    return 2 * vocab * d + layers * layer + d


def test_known_block_model_shapes():
    """SDAR-8B / TraDo-8B and TraDo-4B (published SDAR-*-Chat config.json): Qwen3 with GQA, head_dim 128
    (so 32 heads x 128 = 4096 query columns on the 2560-wide 4B), untied head, block 4, no shift; the
    parameter counts by hand; the narrowed stand-ins keep head_dim proportional to the width."""
    from maskrl.plan.memory import narrow_widths

    base = ["model.path=Gen-Verse/TraDo-8B-Instruct"]
    s8 = model_shape(load_config([], base))
    assert (s8.family, s8.block_size, s8.head_dim, s8.num_kv_heads, s8.shift, s8.tie) == ("sdar", 4, 128, 8, False, False)
    assert param_memory(s8, torch.bfloat16, None)["params"] == _qwen3_params(4096, 36, 32, 8, 128, 12288, 151936)
    s4 = model_shape(load_config([], ["model.path=Gen-Verse/TraDo-4B-Instruct"]))
    assert param_memory(s4, torch.bfloat16, None)["params"] == _qwen3_params(2560, 36, 32, 8, 128, 9728, 151936)
    assert type(s4.hf_config()).__name__ == "Qwen3Config" and s4.hf_config().head_dim == 128
    assert narrow_widths(s4) == (160, 320) and s4.hf_config(160, 1).head_dim == 8  # 128 x 160 / 2560
    assert narrow_widths(s8) == (256, 512) and s8.hf_config(512, 1).head_dim == 16
    assert model_shape(load_config([], ["model.path=Dream-org/Dream-v0-Instruct-7B"])).shift


@pytest.mark.parametrize("lora", [None, {"rank": 4, "alpha": 8.0, "targets": "all-linear"}], ids=["full", "lora"])
def test_rollout_flops_interpolated_in_the_cached_length_equal_direct_counts(lora):
    """A cached call's FLOPs are affine in the cached length ``past``: the plan counts pasts 1 and 2 and
    interpolates; FlopCounterMode counted directly at other pasts (and rows / scored positions) gives the
    same integers, for the rollout through the LoRA branch and on the merged copy, on a small Qwen3 block
    model (the SDAR family's class, GQA, stated head_dim)."""
    from maskrl.plan import ModelShape

    shape = ModelShape("sdar", 64, 2, 4, 2, 96, 100, head_dim=16, block_size=4)
    fm = FlopModel(shape, torch.float32, lora, False)
    for kind in ("rollout", "rollout_merged"):
        for seq, rows, scored, past in [(4, 3, 12, 3), (8, 5, 7, 17), (4, 1, 1, 200), (8, 2, 3, 2003)]:
            assert fm.flops(kind, rows, seq, scored, past) == fm._count(kind, rows, seq, scored, past) > 0
    direct = [fm._count("rollout", 1, 4, 1, p) for p in (1, 2, 3)]
    assert direct[2] - direct[1] == direct[1] - direct[0] > 0  # the per-key cost: attention's two matmuls
    assert direct[1] - direct[0] == 2 * 2 * 2 * 4 * 4 * 16  # layers x matmuls x 2 FLOPs x heads x queries x head


@pytest.mark.parametrize("lora", [None, {"rank": 4, "alpha": 8.0, "targets": "all-linear"}], ids=["full", "lora"])
def test_flops_extrapolated_in_depth_equal_the_full_depth_count(lora):
    """The plan counts 1 and 2 decoder layers and extrapolates to the model's depth; counted directly on the
    5-layer meta model (checkpointing on, so the train count includes the recomputation) every kind of call and
    the LoRA merge give the same integers."""
    from maskrl.plan import ModelShape

    shape = ModelShape("sdar", 64, 5, 4, 2, 96, 100, head_dim=16, block_size=4)
    fast, direct = FlopModel(shape, torch.float32, lora, True), FlopModel(shape, torch.float32, lora, True, extrapolate=False)
    assert fast.depths == (1, 2) and direct.depths == (5,)
    for kind in ("train", "forward", "reference", "rollout", "rollout_merged"):
        for rows, seq, scored, past in [(3, 12, 5, 0), (2, 4, 3, 9)] if kind.startswith("rollout") else [(3, 12, 5, 0)]:
            assert fast.flops(kind, rows, seq, scored, past) == direct.flops(kind, rows, seq, scored, past) > 0
    assert param_memory(shape, torch.bfloat16, lora) == param_memory(shape, torch.bfloat16, lora, extrapolate=False)
    # B @ A of every adapted matrix (q, o 64x64; k, v 32x64; gate, up, down 64x96), 2 x rank FLOPs an entry, 5 layers
    assert fast.merge_flops() == direct.merge_flops() == (5 * 2 * 4 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 96) if lora else 0)


def test_block_model_work_is_the_doubled_row():
    """A block-diffusion model's likelihood rows are x_t ⊕ x_0 (likelihood/blocks.py): P = 6, L = 8,
    block 4 -> the context copy P + L = 14 columns, the noisy copy from the first block holding a
    completion position (position 4) to the end, 10 columns: 24; full attention: 14. The stand-in
    carries the planned model's block size."""
    from maskrl.plan import standin_config

    one = TINY + ["train.inner_iterations=1", "objective.beta=0"]
    full = [c for c in record_work(load_config([], one), prompt_length=6) if c.phase == "theta"]
    block = [c for c in record_work(load_config([], one + ["model.tiny.block_size=4"]), prompt_length=6)
             if c.phase == "theta"]
    assert [(c.rows, c.seq, c.scored) for c in full] == [(2, 14, 16)]
    assert [(c.rows, c.seq, c.scored) for c in block] == [(2, 24, 16)]
    cached = record_work(load_config([], one + ["model.tiny.block_size=4", "rollout.cache=block",
                                                "rollout.early_stop=true"]), prompt_length=6)
    roll = [c for c in cached if c.phase == "rollout"]  # the block cache: one prefill, then cached block steps
    assert roll[0].past == 0 and all(c.past > 0 and c.seq <= 2 * 4 for c in roll[1:]) and len(roll) > 1
    sdar = load_config([], ["model.path=JetLM/SDAR-8B-Chat"])
    assert standin_config(sdar).model.tiny.block_size == 4 and standin_config(sdar).model.path == ""


@pytest.mark.parametrize("make, message", [
    (lambda: parse_bytes("nanGB"), r"^--gpu-memory: must be a finite number > 0, got 'nanGB'"),
    (lambda: parse_bytes("infGB"), r"^--gpu-memory: must be a finite number > 0, got 'infGB'"),
    (lambda: Hardware(gpu_memory=float("nan")), r"^--gpu-memory: must be a finite number > 0"),
    (lambda: Hardware(tflops=float("inf")), r"^--tflops: must be a finite number > 0, got inf"),
    (lambda: Hardware(bandwidth=float("nan")), r"^--bandwidth: must be a finite number > 0, got nan"),
    (lambda: Hardware(tflops=-1.0), r"^--tflops: must be a finite number > 0, got -1.0"),
])
def test_plan_numbers_must_be_finite_and_positive(make, message):
    """--gpu-memory nanGB and --tflops inf were planned ('compute 0 s' per step), silently."""
    with pytest.raises(PlanError, match=message):
        make()


@pytest.mark.parametrize("length", [-5, 0])
def test_plan_refuses_a_prompt_length_below_one(length, capsys):
    """``maskrl plan --prompt-length -5`` planned 8537 TFLOP a step instead of 16900 (rows of L - 5 tokens)."""
    with pytest.raises(PlanError, match=rf"^--prompt-length: must be >= 1 token, got {length}$"):
        make_plan(load_config([], []), Hardware(), prompt_length=length, search=False)
    from maskrl.cli import main

    if length < 0:
        assert main(["plan", "--prompt-length", str(length)]) == 2
        assert f"--prompt-length: must be >= 1 token, got {length}" in capsys.readouterr().err


def test_plan_options_are_checked(tmp_path):
    assert parse_bytes("80GB") == parse_bytes("80 GiB") == 80 * GIB
    with pytest.raises(PlanError, match="--gpu-memory"):
        parse_bytes("eighty")
    with pytest.raises(PlanError, match="--mfu"):
        Hardware(mfu=1.5)
    with pytest.raises(PlanError, match="--gpus"):
        Hardware(gpus=0)
    acc = CONFIGS / "accelerate"
    assert strategy_from_accelerate(str(acc / "fsdp.yaml"), 8) == "fsdp"
    assert strategy_from_accelerate(str(acc / "deepspeed_zero3.yaml"), 8) == "zero3"
    assert strategy_from_accelerate(str(acc / "deepspeed_zero2.yaml"), 8) == "zero2"
    assert strategy_from_accelerate(str(acc / "ddp.yaml"), 8) == "ddp"
    assert strategy_from_accelerate(None, 1) == "single"
    cfg = load_config([], ["model.path=" + str(tmp_path)])
    with pytest.raises(PlanError, match="model.path"):
        model_shape(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("path", RECIPES_8B, ids=lambda p: p.name)
def test_8b_recipe_plans_and_dry_runs(path):
    """Every 8B recipe: planned on 1x80 GB and 8x80 GB (FSDP), numbers sane; and one full step on the
    stand-in model (the recipe's sampler, batch, μ, objective, likelihood and credit modules)."""
    # block-diffusion recipes (TraDo / SDAR: L up to 2,000 in blocks of 4; LLaDA2's EBPO: 16 doubled rows a sequence) are
    # planned at L 64: at L 2,000 the FLOP counts take seconds (pasts 1 and 2, depths 1 and 2: exact, tested above),
    # but recording one step of the stand-in took 771 s on the loaded 2-core CI machine (docs/scaling.md); the
    # machinery is the same
    short = [f"{s}.{k}=64" for s in ("rollout", "eval") for k in ("gen_length", "steps")]
    long_l = path.name.startswith(("trado", "sdar")) or path.name == "llada2_mini_gsm8k_ebpo.yaml"
    cfg = load_config([path], short if long_l else [])
    one = make_plan(cfg, Hardware(gpus=1, gpu_memory=80 * GIB), prompt_length=200, search=False)
    eight = make_plan(cfg, Hardware(gpus=8, gpu_memory=80 * GIB, strategy="fsdp"), prompt_length=200, search=False)
    assert one["memory_gib"]["peak"] > one["memory_gib"]["static"]["weights"] > 5  # GiB: TraDo-4B holds 9.2
    assert eight["memory_gib"]["static"]["weights"] == pytest.approx(one["memory_gib"]["static"]["weights"] / 8)
    # per process: B prompts each, the same work but for the rollout, which samples from the merged LoRA
    # copy on one GPU (no LoRA branch, plus the merge) and through the peft model under FSDP (merges_lora)
    phases = lambda plan: {k: v["flops"] for k, v in plan["work"]["by_phase_term"].items() if k != "rollout"}  # noqa: E731
    assert phases(one) == phases(eight) and eight["work"]["flops"] > 1e14  # LLaDA2-mini's EBPO step: 0.5 PFLOP
    rollout = [p["work"]["by_phase_term"]["rollout"]["flops"] for p in (one, eight)]
    assert rollout[0] < rollout[1] if merges_lora(cfg, Hardware(gpus=1, gpu_memory=80 * GIB)) else rollout[0] == rollout[1]
    assert one["work"]["by_phase_term"]["rollout"]["forwards"] >= cfg.rollout.gen_length // cfg.rollout.block_length
    assert one["time"]["seconds_per_step"] > 0
    if cfg.credit and type(cfg.credit[0]).__name__ == "DiSPO":
        assert any(k.startswith("theta/step") for k in one["work"]["by_phase_term"])
    metrics = dry_run(cfg, prompt_length=16)
    assert metrics["step"] == 1


#: every shipped run recipe (configs/**.yaml but accelerate's launch configs), the 8B ones aside (planned above)
RECIPES_SMALL = sorted(p for p in CONFIGS.rglob("*.yaml") if "accelerate" not in p.parts and p not in RECIPES_8B)


def test_every_shipped_recipe_is_covered():
    """Issue 21: ``maskrl plan`` runs on every shipped recipe -- the two lists together are every YAML
    under configs/ that is not an accelerate launch config."""
    every = {p for p in CONFIGS.rglob("*.yaml") if "accelerate" not in p.parts}
    assert set(RECIPES_SMALL) | set(RECIPES_8B) == every and len(RECIPES_8B) >= 16
    assert CONFIGS / "table" / "sudoku.yaml" in RECIPES_SMALL


@pytest.mark.slow
@pytest.mark.parametrize("path", RECIPES_SMALL, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_maskrl_plan_runs_on_every_small_recipe(path, tmp_path, capsys):
    """``maskrl plan`` (the command itself) on each shipped tiny-model recipe: it prints a plan and
    writes its JSON with a positive peak and FLOPs (the 8B recipes: test_8b_recipe_plans_and_dry_runs)."""
    import json

    from maskrl.cli import main

    out = tmp_path / "plan.json"
    assert main(["plan", "--config", str(path), "--gpus", "1", "--gpu-memory", "24GB", "--prompt-length", "32",
                 "--json", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["memory_gib"]["peak"] > plan["memory_gib"]["static_total"] > 0
    assert plan["work"]["flops"] > 0 and plan["work"]["by_phase_term"]["rollout"]["forwards"] > 0
    assert "PEAK" in capsys.readouterr().out


def test_the_planner_asks_each_credit_module_for_its_worst_case(tmp_path, monkeypatch):
    """The stand-in runs each credit module as its ``for_planning`` hook says and counts the rows its
    ``planned_rows`` states, without knowing any module by class: DiSPO keeps every branched state
    (B·G·Z rows with a step term, none without), DTCA keeps max_steps states of every sequence and
    drops its POS table (it only reweights), the others run as configured, and a new module (a
    plug-in defined here) is planned by its own hooks."""
    import dataclasses
    import json

    from maskrl.credit import CreditModule
    from maskrl.plan import credit_rows_bound
    from maskrl.plan import standin_config

    table = tmp_path / "pos.json"
    table.write_text(json.dumps({"NOUN": 2.0}))
    (tmp_path / "plan_stub_tagger.py").write_text("def tag(tokenizer, ids, mask):\n    return [['NOUN'] * ids.shape[1]] * ids.shape[0]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config([], TINY + ["train.prompts_per_step=3", "train.group_size=2",
                                  f"credit=[{{name: dispo, z: 4}}, {{name: dps}}, {{name: dtca, pos_weights: {table}, "
                                  "tagger: 'plan_stub_tagger:tag'}]"])
    dispo, dps, dtca = standin_config(cfg).credit
    assert dispo == dataclasses.replace(cfg.credit[0], skip_equal=False) and cfg.credit[0].skip_equal
    assert dps == cfg.credit[1]
    assert dtca == dataclasses.replace(cfg.credit[2], pos_weights=None, tagger=None, min_steps=cfg.credit[2].max_steps)
    assert cfg.credit[2].min_steps == 2 and dtca.min_steps == dtca.max_steps == 32
    assert credit_rows_bound(cfg) == 3 * 2 * 4 + 3 * 2 * 32
    assert dispo_step_rows(load_config([], TINY + ["train.prompts_per_step=3", "train.group_size=2",
                                                   "credit=[{name: dispo, z: 4}]"])) == 3 * 2 * 4
    sample = load_config([], TINY + ["credit=[{name: dtca, selection: sample, k: 3}]"]).credit[0]
    assert sample.for_planning() == sample and sample.planned_rows(4) == 12  # k steps each, already the bound
    assert credit_rows_bound(load_config([], TINY + ["credit=[{name: dispo, alpha_step: 0}]"])) == 0
    assert credit_rows_bound(load_config([], TINY)) == 0

    @dataclasses.dataclass(frozen=True)
    class Probe(CreditModule):  # data-dependent work of its own, declared through the hooks only
        extra: int = 1

        def for_planning(self):
            return dataclasses.replace(self, extra=99)

        def planned_rows(self, sequences):
            return sequences * self.extra

    @dataclasses.dataclass(frozen=True)
    class Plain:  # a module without the optional hooks runs as configured and states no bound
        k: int = 3

    cfg.credit = [Probe(), Plain()]
    assert standin_config(cfg).credit == [Probe(extra=99), Plain()]
    assert credit_rows_bound(cfg) == 6


def test_profiler_log_lines_are_held_back_and_other_output_kept(capfd):
    """What torch's profiler writes to file descriptor 2 by itself (kineto's start / stop / stage lines,
    c10's note on blocks allocated before profiling) is dropped; anything else written there meanwhile
    comes through afterwards, in order."""
    import os
    import sys

    from maskrl.plan.memory import quiet_profiler_log

    noise = [b"USDT:2026-12-02 04:40:23 14883:14883 SyncActivityProfilerHandler.cpp:52] profiler_start\n",
             b"STAGE:2026-12-02 04:40:52 15391:15391 SyncActivityProfilerHandler.cpp:51] Completed Stage: Warm Up\n",
             b"[W1202 04:42:42.004664454 CPUAllocator.cpp:245] Memory block of unknown size was allocated before the "
             b"profiling started, profiler results will not include the deallocation event\n"]
    print("before", file=sys.stderr)
    with quiet_profiler_log():
        os.write(2, noise[0])
        os.write(2, b"a real warning\n")
        os.write(2, noise[1] + noise[2])
        os.write(2, b"from c\n")
        os.write(2, b"ERROR:2026-12-02 04:40:52 1:1 Foo.cpp:3] kept too\n")
    assert capfd.readouterr().err == "before\na real warning\nfrom c\nERROR:2026-12-02 04:40:52 1:1 Foo.cpp:3] kept too\n"
    with pytest.raises(RuntimeError, match="boom"), quiet_profiler_log():  # restored on an error, output kept
        os.write(2, noise[0] + b"last words\n")
        raise RuntimeError("boom")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "last words\nafter\n"


@pytest.mark.slow  # minutes of CPU: CI's slow stage (make test-slow)
def test_maskrl_plan_prints_its_report_without_profiler_noise(tmp_path):
    """``maskrl plan`` in a fresh process (where torch's profiler starts and logs): stdout is the
    report, stderr holds no profiler line -- while a bare ``torch.profiler.profile`` in the same kind
    of process does print them here (the control that shows what is being held back)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**__import__("os").environ, "PYTHONPATH": str(root / "src")}
    args = ["plan", "--prompt-length", "8", "--no-search"] + [a for o in TINY for a in ("--set", o)]
    run = subprocess.run([sys.executable, "-c", f"from maskrl.cli import main; raise SystemExit(main({args!r}))"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=WAIT_CAP_S)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("prompt length 8 tokens (--prompt-length)\nmodel: tiny") and "PEAK" in run.stdout
    assert "maskrl plan: activation peaks" in run.stderr  # the phases, on stderr (the report alone on stdout)
    from maskrl.plan.memory import PROFILER_LOG

    assert not [line for line in run.stderr.splitlines() if PROFILER_LOG.match(line)], run.stderr
    assert "profiler_start" not in run.stderr and "Memory block of unknown size" not in run.stderr
    bare = ("import torch\nfrom torch.profiler import ProfilerActivity, profile\n"
            "with profile(activities=[ProfilerActivity.CPU], profile_memory=True):\n    torch.ones(8).sum()\n")
    control = subprocess.run([sys.executable, "-c", bare], capture_output=True, text=True, timeout=WAIT_CAP_S)
    if not any(PROFILER_LOG.match(line) for line in control.stderr.splitlines()):
        pytest.skip("this torch build's profiler logs nothing by itself (nothing to hold back)")


#: RLDF's state term on the tiny recipe at one block of 8 (8 commit steps), threshold schedule
STATES = TINY + ["rollout.gen_length=8", "rollout.block_length=8", "rollout.steps=8", "rollout.schedule=threshold",
                 "objective.name=rldf", "likelihood={name: state}", "train.prompts_per_step=2", "train.inner_iterations=1"]


@pytest.mark.parametrize("credit", ["{name: rldf_steps, k: 4}", "{name: dtca, max_steps: 8}"])
def test_credit_forwards_are_planned_as_what_they_are_and_split_as_on_the_full_model(credit):
    """The credit modules' own forwards after the rewards (RLDF / DTCA's state filter) are phase
    ``credit``, not sampler steps (planned as proposals they made DTCA's plan +26 % of the measured
    peak), and their split into forwards follows the full model's vocabulary
    (:func:`~maskrl.credit.rldf.state_chunk_rows`), not the stand-in's: at a vocabulary of 2^21 ids a
    forward of [r, 8, V] float32 logits keeps r <= 2, at the stand-in's own it takes 16 rows."""
    from maskrl.credit.rldf import STATE_MAX_ELEMENTS, state_chunk_rows

    cfg = load_config([], STATES + [f"credit=[{credit}]"])
    own = record_work(cfg, prompt_length=6)
    wide = record_work(cfg, prompt_length=6, vocab_size=2 ** 21)
    for calls in (own, wide):
        assert [c.phase for c in calls[:8]] == ["rollout"] * 8  # one sampler forward per commit step (2 x 2 rows)
        assert all(c.rows == 4 for c in calls[:8])
        assert {c.phase for c in calls[8:]} == {"credit", "reference", "theta"}
    k = lambda c: c.scored // c.rows  # noqa: E731 - needed positions of the forward's widest row
    own_c = [c for c in own if c.phase == "credit"]
    wide_c = [c for c in wide if c.phase == "credit"]
    assert sum(c.rows for c in own_c) == sum(c.rows for c in wide_c) >= 4 * 2  # the same states either way
    assert all(c.rows <= 16 for c in own_c) and own_c[0].rows == 16
    assert len(wide_c) > len(own_c) and all(c.rows <= state_chunk_rows(k(c), 2 ** 21) for c in wide_c)
    assert state_chunk_rows(8, 2 ** 21) == STATE_MAX_ELEMENTS // (8 * 2 ** 21) == 2
    assert state_chunk_rows(8, 50) == 16 and state_chunk_rows(10 ** 6, 10 ** 6) == 1


def test_token_stats_give_the_probability_and_entropy_by_hand():
    """p = softmax(logits)[target] and H = -Σ q log q (nats), in float32 from bf16 logits too."""
    from maskrl.credit.rldf import token_stats

    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 2.0, 3.0]])
    p, h = token_stats(logits, torch.tensor([2, 3]), entropy=True)
    q = torch.tensor([1.0, torch.e, torch.e ** 2, torch.e ** 3]) / (1 + torch.e + torch.e ** 2 + torch.e ** 3)
    assert torch.allclose(p, torch.tensor([0.25, float(q[3])]), atol=1e-6)
    assert torch.allclose(h, torch.tensor([float(torch.log(torch.tensor(4.0))), float(-(q * q.log()).sum())]), atol=1e-6)
    pb, hb = token_stats(logits.bfloat16(), torch.tensor([2, 3]), entropy=False)
    assert hb is None and pb.dtype == torch.float32 and torch.allclose(pb, p, atol=1e-6)  # these logits are exact in bf16


def test_spread_rewards_give_every_group_both_values():
    """The plan's synthetic rewards train every group (a group of equal rewards trains nothing, so coin
    flips would make a planned or counted step's work a matter of luck: half the groups of 2)."""
    import torch

    from maskrl.plan import spread_rewards

    gen = torch.Generator().manual_seed(0)
    for g in (2, 3, 6):
        for _ in range(200):
            r = torch.tensor(spread_rewards(4 * g + 1, g, gen))
            assert set(r.tolist()) <= {0.0, 1.0}
            groups = r[:4 * g].view(4, g)
            assert bool((groups.max(1).values > groups.min(1).values).all())
    flips = [spread_rewards(5, 1, gen) for _ in range(50)]  # G = 1: plain coin flips, both values occur
    assert {v for f in flips for v in f} == {0.0, 1.0}
    a = spread_rewards(12, 6, torch.Generator().manual_seed(3))
    assert a == spread_rewards(12, 6, torch.Generator().manual_seed(3))  # the generator alone decides
