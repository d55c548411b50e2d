"""``maskrl plan``: memory and time of a recipe per process, before renting GPUs (issue 21).

How each number is obtained -- counted on the library's own code, not from hand formulas:

* **Work** (forward rows, scored positions): the recipe's trainer runs on a *stand-in* -- a
  1-layer, 32-wide built-in model with the recipe's sampler (L, block, steps, schedule, cache) and the
  planned model's block size (a block-diffusion model: the block sampler's cached block steps and the
  block likelihood's doubled x_t ⊕ x_0 rows are what is recorded),
  B, G, μ, objective, likelihood and credit modules, on synthetic prompts of ``prompt_length``
  tokens and random 0/1 rewards (a seeded generator), with early stopping switched off (every
  completion runs to L tokens, the worst case) and each credit module as its
  ``CreditModule.for_planning`` hook gives it (its data-dependent work at the worst case, e.g. DiSPO
  keeping every branched state -- the step term's B·G·Z rows instead of the states whose random
  rewards happen to differ, :func:`credit_rows_bound`). ``RLTrainer.collect`` records every
  decoder and output-layer call of the rollout (phase ``rollout``, the credit modules' observers included) and
  of the credit modules' own no-grad forwards after the rewards (phase ``credit``, e.g. RLDF / DTCA's state
  filter, planned as no-grad forwards of their rows and scored positions); the loss terms come from
  ``RLTrainer.loss_terms`` (DiSPO's branches, SML's strata, RLDF/DTCA's states included) and are
  split with the trainer's own :func:`maskrl.trainer.split_rows` under ``micro_batch_size`` /
  ``max_forward_rows``; each micro-batch's likelihood call runs once on the stand-in (no grad) to
  record its rows R, sequence length S and scored positions M. Phases follow the trainer's rules
  (``optimize``): θ_old when μ > 1 and the objective uses a ratio, the reference when it needs one,
  θ always (forward + backward), each μ times.
* **FLOPs**: ``torch.utils.flop_counter.FlopCounterMode`` on the recipe's real model shape (the family's
  transformers class, head size, logit shift and block-causal attention) built on
  the ``meta`` device (no memory), through the same adapter calls (``log_probs_at`` with and without
  backward, ``decoder_forward`` with a key/value cache, the output layer), at (R, M) = (1, 1), (2, 1),
  (1, 2) per sequence length; every count is affine in R and M (rows and scored positions are batch
  dimensions), which the three points give exactly. Gradient checkpointing's recomputation and
  LoRA's extra matmuls are counted because they run. Two more exact reductions keep a long recipe
  cheap to plan: a call against ``past`` cached keys is affine in ``past`` (only attention's two
  matmuls see the keys), so pasts 1 and 2 give every cached block step of a rollout; and every count
  is affine in the decoder depth (the layers are alike), so it is taken on 1 and 2 layers (past the
  first dense layers of an MoE model) and extrapolated (``tests/test_plan.py`` checks both against
  direct counts). An MoE model (LLaDA2) counts only its active experts: on the meta device each token's
  k slots go to experts by a fixed balanced rule (:mod:`maskrl.plan.moe`), which costs what any routing
  costs (``tests/test_plan_moe.py``: equal to a real routed forward's count).
* **Parameter memory**: ``accelerate.utils.calculate_maximum_sizes`` on the meta model (accelerate's
  ``estimate-memory`` logic), LoRA applied with peft on the meta model; gradients and AdamW states
  from the trainable count, divided by the processes where the strategy shards them (FSDP, ZeRO-3:
  weights, gradients, optimizer; ZeRO-2: gradients, optimizer; DDP: nothing, plus one gradient
  bucket copy).
* **Activation memory** (transient peaks of one forward, one forward + backward, one sampler step):
  measured with torch's CPU profiler (allocation events) on *narrow* real models of the recipe's
  architecture -- the same vocabulary, layer types, head count, LoRA rank, dtype and checkpointing,
  hidden widths 2·heads and 4·heads, 1 and 2 layers -- at the recipe's sequence length. Each peak is
  affine in 1/k (k = the width's reduction; every activation has one width-proportional dimension or
  none) and in the layer count, and affine in R and M; the fit is exact for that structure and is
  evaluated at the full width and depth.

The CPU check (``benchmarks/rehearsal/plan_check.py``) compares this plan with the peak resident memory of real
trainer steps in fresh processes and with ``FlopCounterMode`` on the same steps.
"""
from maskrl.plan.shapes import (GIB, KNOWN_MODELS, STRATEGIES, Hardware, ModelShape, PlanError, model_shape,
                                parse_bytes, strategy_from_accelerate)
from maskrl.plan.work import (Call, credit_rows_bound, dispo_step_rows, dry_run, estimate_prompt_length, record_work,
                              spread_rewards, standin_config, synthetic_trainer)
from maskrl.plan.flops import FlopModel, build_adapter, param_memory, work_table
from maskrl.plan.memory import ActivationModel, _static_memory, narrow_widths, profiled_peak
from maskrl.plan.report import format_plan, make_plan

__all__ = ["GIB", "KNOWN_MODELS", "STRATEGIES", "ActivationModel", "Call", "FlopModel", "Hardware", "ModelShape",
           "PlanError", "build_adapter", "credit_rows_bound", "dispo_step_rows", "dry_run", "estimate_prompt_length",
           "format_plan", "make_plan", "model_shape", "narrow_widths", "param_memory", "parse_bytes",
           "profiled_peak", "record_work", "spread_rewards", "standin_config", "strategy_from_accelerate",
           "synthetic_trainer", "work_table"]
