"""Every shipped config loads: maskrl recipes through ``load_config``, accelerate launch configs through
accelerate's own loader and plugins (no GPU needed; the GPU runs themselves are not tested here)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from maskrl.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RECIPES = sorted(CONFIGS.glob("*.yaml"))
LAUNCH = sorted((CONFIGS / "accelerate").glob("*.yaml"))


def test_configs_exist():
    names = {p.name for p in LAUNCH}
    assert {"ddp.yaml", "fsdp.yaml", "deepspeed_zero2.yaml", "deepspeed_zero3.yaml"} <= names
    assert "llada8b_gsm8k_diffu_grpo.yaml" in {p.name for p in RECIPES}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_loads(path):
    cfg = load_config([path])
    assert cfg.rollout.gen_length > 0  # sampler settings are valid too


def test_llada_recipe_values():
    cfg = load_config([CONFIGS / "llada8b_gsm8k_diffu_grpo.yaml"])
    assert cfg.task.name == "gsm8k" and type(cfg.objective).__name__ == "DiffuGRPO"
    assert type(cfg.likelihood).__name__ == "MeanField" and cfg.likelihood.p_mask_prompt == 0.15
    assert cfg.model.lora_rank > 0 and cfg.model.dtype == "bfloat16" and cfg.model.gradient_checkpointing
    ro = cfg.rollout
    assert (ro.gen_length, ro.block_length, ro.steps) == (256, 32, 128)
    assert cfg.train.group_size * cfg.train.prompts_per_step % cfg.train.micro_batch_size == 0


@pytest.mark.parametrize("name", ["trado4b_math500_tracerl", "trado8b_math500_tracerl", "sdar8b_math500_tracerl"])
def test_trado_recipe_values(name):
    """TraDo's RL recipe (dLLM-RL configs/rl_trado.yaml): block 4, 4 steps a block, low_confidence_dynamic
    at 0.9, 64 prompts (8 per process on 8) x 16 rollouts, 2,000 tokens, lr 1e-6, ε 0.2, β 0.01 (k3 to
    θ_old), TraceRL on the trace states; decoded with the exact block cache and early stop; the model
    an SDAR-shaped Hub id the planner knows."""
    from maskrl.plan import KNOWN_MODELS

    cfg = load_config([CONFIGS / f"{name}.yaml"])
    ro = cfg.rollout
    assert (ro.gen_length, ro.block_length, ro.steps) == (2000, 4, 2000)
    assert (ro.remasking, ro.threshold, ro.temperature, ro.cache, ro.early_stop) == (
        "low_confidence_dynamic", 0.9, 1.0, "block", True)
    assert (cfg.train.prompts_per_step * 8, cfg.train.group_size, cfg.train.lr) == (64, 16, 1e-6)
    ob = cfg.objective
    assert (type(ob).__name__, ob.clip_eps, ob.beta, ob.kl_to) == ("TraceRL", 0.2, 0.01, "old")
    assert type(cfg.likelihood).__name__ == "State" and cfg.eval.cache == "block"
    assert KNOWN_MODELS[cfg.model.path]["family"] == "sdar" and KNOWN_MODELS[cfg.model.path]["block_size"] == 4


def test_llada_recipe_training_data():
    """``maskrl train`` reads the GSM8K train split (7473 rows), none of them a test question."""
    from maskrl.pipeline import eval_examples, train_examples
    from maskrl.tasks import get_task
    from maskrl.tasks.base import default_data_dir

    root = default_data_dir()
    if root is None or not (root / "gsm8k" / "train.jsonl").is_file():
        pytest.skip("no gsm8k data (set MASKRL_DATA_DIR)")
    cfg = load_config([CONFIGS / "llada8b_gsm8k_diffu_grpo.yaml"])
    task = get_task(cfg.task.name)
    held_out, _ = eval_examples(cfg, task)
    train = train_examples(cfg, task, held_out)
    assert len(held_out) == 1319 and len(train) == 7473
    assert not {ex.prompt for ex in train} & {ex.prompt for ex in held_out}
    assert train[0].fields["answer"] == "72"  # first train row: Natalia's clips, 48 + 24


def _launch_arg_names() -> set[str]:
    from accelerate.commands.launch import launch_command_parser

    return set(vars(launch_command_parser().parse_args(["script.py"])))


@pytest.mark.parametrize("path", LAUNCH, ids=lambda p: p.name)
def test_accelerate_config_loads(path):
    from accelerate.commands.config import load_config_from_file

    cfg = load_config_from_file(str(path))  # raises on unknown top-level keys
    assert cfg.num_processes == 8 and cfg.num_machines == 1
    # nested keys become `accelerate launch` arguments; accelerate does not check them itself
    known = _launch_arg_names()
    for section in ("fsdp_config", "deepspeed_config"):
        unknown = set(getattr(cfg, section)) - known
        assert not unknown, f"{path.name}: {section} keys not known to accelerate launch: {unknown}"


def test_fsdp_config_wraps_llama_and_qwen2_layers():
    """FSDP2 FULL_SHARD; the layer classes come from the model's ``_no_split_modules`` (Llama for
    LLaDA, Qwen2 for Dream), also under peft."""
    import peft
    import torch
    from accelerate.commands.config import load_config_from_file
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cfg = load_config_from_file(str(CONFIGS / "accelerate" / "fsdp.yaml"))
    assert cfg.distributed_type.value == "FSDP" and cfg.mixed_precision == "bf16"
    fc = cfg.fsdp_config
    assert fc["fsdp_version"] == 2 and fc["fsdp_reshard_after_forward"] is True  # FULL_SHARD
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=fc["fsdp_version"], reshard_after_forward=fc["fsdp_reshard_after_forward"],
        auto_wrap_policy=fc["fsdp_auto_wrap_policy"], state_dict_type=fc["fsdp_state_dict_type"],
        cpu_ram_efficient_loading=fc["fsdp_cpu_ram_efficient_loading"])
    shape = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2)
    with torch.random.fork_rng(devices=[]):
        models = {"LlamaDecoderLayer": LlamaForCausalLM(LlamaConfig(**shape)),
                  "Qwen2DecoderLayer": Qwen2ForCausalLM(Qwen2Config(**shape))}
        models["peft"] = peft.get_peft_model(LlamaForCausalLM(LlamaConfig(**shape)),
                                             peft.LoraConfig(r=2, target_modules="all-linear"))
    for name, model in models.items():
        policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
        wrapped = {type(m).__name__ for m in model.modules() if policy(m)}
        assert wrapped == ({"LlamaDecoderLayer"} if name == "peft" else {name}), name


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_configs(stage):
    from accelerate.commands.config import load_config_from_file
    from accelerate.utils import DeepSpeedPlugin

    cfg = load_config_from_file(str(CONFIGS / "accelerate" / f"deepspeed_zero{stage}.yaml"))
    assert cfg.distributed_type.value == "DEEPSPEED"
    ds_file = cfg.deepspeed_config["deepspeed_config_file"]
    root = CONFIGS.parent
    data = json.loads((root / ds_file).read_text())
    # the trainer prepares no DataLoader, so accelerate needs this as an integer
    assert isinstance(data["train_micro_batch_size_per_gpu"], int)
    plugin = DeepSpeedPlugin(hf_ds_config=str(root / ds_file))
    assert plugin.zero_stage == stage
    assert plugin.deepspeed_config["bf16"]["enabled"] is True
