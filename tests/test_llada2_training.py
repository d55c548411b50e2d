"""RL on the MoE block-diffusion model (issue 52 items 3 and 4): one trainer step of EBPO, and of EBPO with each
registered credit module, on a tiny LLaDA2 model (maskrl's LLaDA2 module: 2 layers, the first dense, 8 experts,
2 active + 1 shared, block 4) -- full fine-tuning and the default LoRA -- with finite metrics, a changed model
and the expert bias untouched."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import OddChars
from maskrl.credit import CREDITS
from maskrl.models import ModelAdapter, apply_lora
from maskrl.models.llada2_moe import LLaDA2MoeConfig, LLaDA2MoeModelLM
from maskrl.models.tokenizer import build_char_tokenizer
from maskrl.tasks.base import Example
from maskrl.trainer import RLTrainer
from test_block_shapes import PROMPTS, _config


def tiny_llada2(lora: bool = False) -> ModelAdapter:
    tok = build_char_tokenizer()
    cfg = LLaDA2MoeConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=8, n_group=4,
                          topk_group=2, num_experts_per_tok=2, num_shared_experts=1, moe_intermediate_size=16,
                          first_k_dense_replace=1, use_bias=False, pad_token_id=tok.pad_token_id)
    model = LLaDA2MoeModelLM(cfg).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # every weight drawn from an explicit generator (not the module's global-RNG init)
        for name, t in model.state_dict().items():
            if name.endswith("expert_bias"):
                t.copy_(0.2 * torch.randn(t.shape, generator=g))
            elif name.endswith("norm.weight"):
                t.fill_(1.0)
            else:
                t.copy_(torch.randn(t.shape, generator=g) / t.shape[-1] ** 0.5)
    ad = ModelAdapter(model=model, mask_id=tok.mask_token_id, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                      family="llada2", tokenizer=tok, block_size=4)
    return apply_lora(ad, rank=4) if lora else ad


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("credit", [None] + CREDITS.names())
def test_one_ebpo_step_on_tiny_llada2(tmp_path, credit, lora):
    credits = (credit,) if credit else ()
    cfg = _config(tmp_path, "ebpo", credits)
    adapter = tiny_llada2(lora)
    tr = RLTrainer(cfg, adapter, OddChars(), [Example(id=i, prompt=p) for i, p in enumerate(PROMPTS)])
    bias = [b.detach().clone() for n, b in tr.policy.model.named_buffers() if n.endswith("expert_bias")]
    before = [p.detach().clone() for p in tr.policy.model.parameters()]
    metrics = tr.step()
    bad = {k: v for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)}
    assert not bad, bad
    after = list(tr.policy.model.parameters())
    assert any(not torch.equal(p0, p1.detach()) for p0, p1 in zip(before, after)), "the step changed no parameter"
    now = [b for n, b in tr.policy.model.named_buffers() if n.endswith("expert_bias")]
    assert len(now) == 1 and all(torch.equal(b0, b1) for b0, b1 in zip(bias, now))
