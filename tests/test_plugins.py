"""The plug-in promise (issue "plug-in seams"): a user's likelihood, objective and credit module,
registered in a file outside ``src/`` and named in YAML, run in the trainer with no edit to maskrl;
every registered component honours its protocol; the seam catches a module's shape mistakes."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from maskrl.config import ConfigError, load_config, to_dict
from maskrl.credit import CREDITS, CreditBatch, CreditContext, CreditModule, apply_credit
from maskrl.likelihood import LIKELIHOODS, PerToken, provides, reads
from maskrl.likelihood.base import tensors_of
from maskrl.models import build_tiny
from maskrl.objectives import OBJECTIVES
from maskrl.sampling import SamplerConfig, generate
from maskrl.tasks.base import Example
from maskrl.text import encode_prompts
from maskrl.trainer import RLTrainer
from conftest import OddChars

PLUGIN = Path(__file__).resolve().parent / "plugins" / "toy_plugin.py"


def _examples():
    return [Example(id=i, prompt=f"say {i}") for i in range(4)]


def _tiny():
    a = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    a.model.eval()
    return a


def _plugin_module():
    return next(m for name, m in sys.modules.items() if name.startswith("maskrl_plugin_toy_plugin"))


def test_plugin_components_run_from_yaml_without_editing_maskrl(tmp_path):
    y = tmp_path / "run.yaml"
    y.write_text(f"""
plugins: ["{PLUGIN}"]
output_dir: {tmp_path / 'out'}
rollout: {{gen_length: 8, block_length: 4, steps: 4, temperature: 1.0}}
objective: {{name: toy_obj}}
credit:
  - {{name: toy_credit, scale: 2.0, extra_weight: 0.5}}
train: {{steps: 1, prompts_per_step: 2, group_size: 3, inner_iterations: 2, lr: 1.0e-3}}
""")
    cfg = load_config([y])
    toy = _plugin_module()
    # the objective's own defaults stand (not diffu-GRPO's), and so does its own likelihood
    assert (cfg.objective.clip_eps, cfg.objective.beta) == (0.3, 0.0)
    assert type(cfg.likelihood).__name__ == "ToyLikelihood"
    assert cfg.credit[0].scale == 2.0
    for k in toy.CALLS:
        toy.CALLS[k] = 0
    toy.SEEN.clear()
    tr = RLTrainer(cfg, _tiny(), OddChars(), _examples())
    assert tr.reference is None  # β = 0 in the toy objective and no term needs one
    m = tr.step()
    assert toy.CALLS["observer"] > 0 and toy.CALLS["credit"] == 1
    assert toy.CALLS["likelihood"] >= 2 and toy.CALLS["objective"] >= 2  # μ = 2 iterations
    # the credit module changed the advantages the objective saw: position weights 1 + 2 i / L
    L = 8
    w = 1 + 2.0 * torch.arange(L) / L
    torch.testing.assert_close(toy.SEEN["advantages"], toy.SEEN["before"] * w)
    assert not torch.allclose(toy.SEEN["advantages"], toy.SEEN["before"])
    # the score callback reproduces the task's rewards of the rollout's own completions
    assert toy.SEEN["rescored"].shape == (6,)
    # metrics: the base term, the module's extra term and the module's own metric, namespaced
    assert {"base/policy_loss", "extra/policy_loss", "extra/clip_frac"} <= m.keys()
    assert m["credit/toy_credit/weight_mean"] == pytest.approx(w.mean().item())
    assert "base/kl" not in m
    # the config round-trips through plain data
    assert load_config([], [f"plugins={[str(PLUGIN)]}"]).plugins == [str(PLUGIN)]
    again = to_dict(cfg)
    assert again["objective"] == {"name": "toy_obj", "clip_eps": 0.3, "beta": 0.0, "aggregation": "token_mean",
                                  "normalize": "mean"}
    assert again["credit"] == [{"name": "toy_credit", "scale": 2.0, "extra_weight": 0.5}]


def test_plugin_errors_name_the_plugin(tmp_path):
    with pytest.raises(ConfigError, match=r"plugins\[0\]: cannot import 'no_such_maskrl_plugin'"):
        load_config([], ["plugins=[no_such_maskrl_plugin]"])
    bad = tmp_path / "broken_plugin.py"
    bad.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match=r"plugins\[0\].*RuntimeError: boom"):
        load_config([], plugins=[str(bad)])
    with pytest.raises(ConfigError, match=r"credit\[0\]\.name: unknown credit 'nope'"):
        load_config([], ["credit=[{name: nope}]"])
    load_config([], plugins=[str(PLUGIN)])
    with pytest.raises(ConfigError, match=r"unknown key 'credit\[0\]\.lam'; valid keys under credit\[0\]: "
                                          r"extra_weight, scale"):
        load_config([], ["credit=[{name: toy_credit, lam: 1}]"], plugins=[str(PLUGIN)])


def test_a_plugin_or_reward_file_that_is_not_python_says_so(tmp_path):
    """A YAML file given as --plugin was "AttributeError: 'NoneType' object has no attribute 'loader'"."""
    from maskrl.tasks.file_task import load_reward

    cfg = tmp_path / "recipe.yaml"
    cfg.write_text("train: {lr: 0.1}\n")
    with pytest.raises(ConfigError, match=rf"^plugins\[0\]: cannot import '{cfg}' \(ImportError: {cfg} is not a "
                                          r"Python file \(\.py\)\)$"):
        load_config([], plugins=[str(cfg)])
    with pytest.raises(ValueError, match=rf"^task\.file\.reward: cannot import '{cfg}' \(ImportError: {cfg} is not "
                                         r"a Python file \(\.py\)\)$"):
        load_reward(f"{cfg}:fn")


def test_a_plugins_registrations_are_undone_after_its_test():
    """What conftest's autouse fixture does for every test: the toy plug-in's three entries and its
    module are gone afterwards (another test's registry listings stay the built-ins), and loading it
    again imports and registers it afresh."""
    from conftest import registrations_undone

    builtin = (OBJECTIVES.names(), CREDITS.names(), LIKELIHOODS.names())
    with registrations_undone():
        load_config([], plugins=[str(PLUGIN)])
        assert {"toy_obj", "toy_credit", "toy_lik"} <= set(OBJECTIVES) | set(CREDITS) | set(LIKELIHOODS)
    assert (OBJECTIVES.names(), CREDITS.names(), LIKELIHOODS.names()) == builtin
    assert not any(name.startswith("maskrl_plugin_toy_plugin") for name in sys.modules)
    load_config([], plugins=[str(PLUGIN)])
    assert "toy_obj" in OBJECTIVES and type(load_config([], ["objective.name=toy_obj"]).objective).__name__ \
        == "ToyObjective"


def test_unregister_frees_the_name_and_names_the_valid_ones():
    from maskrl.registry import Registry

    r: Registry = Registry("widget")
    r.register("a")(int)
    r.register("b")(str)
    assert r.unregister("a") is int and r.names() == ["b"] and "a" not in r
    r.register("a")(float)  # the name is free again
    assert r.get("a") is float
    with pytest.raises(KeyError, match="unknown widget 'z'; valid widgets: a, b"):
        r.unregister("z")


# ----------------------------------------------------------------------------------- protocols
def _rollout(adapter, schedule="fixed"):
    ids, mask = encode_prompts(adapter.tokenizer, ["ab", "a longer prompt", "c"])
    cfg = SamplerConfig(gen_length=8, block_length=4, steps=4, temperature=1.0, schedule=schedule)
    return generate(adapter, ids, mask, cfg, generator=torch.Generator().manual_seed(0),
                    group_ids=torch.tensor([0, 0, 1]))


@pytest.mark.parametrize("name", LIKELIHOODS.names())
def test_every_registered_likelihood_honours_its_protocol(tiny, name):
    est = LIKELIHOODS.get(name)()
    if name == "block_elbo":  # EBPO's estimator scores block-diffusion models only (its refusal: test_ebpo_dare)
        tiny = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, block_size=4, seed=1)
    ro = _rollout(tiny)
    N, L = ro.completion_ids.shape
    need = torch.rand(N, L, generator=torch.Generator().manual_seed(1)) < 0.5
    need[1] = False  # a row with nothing to score
    rows = est.rows(ro, need)
    assert rows.shape == (N,) and rows.dtype == torch.long and rows[1] == 0 and (rows[need.any(-1)] > 0).all()
    out = est(tiny, ro, torch.Generator().manual_seed(2), need)
    # one [N, L] float32 tensor, or a PerToken record of the names the class provides (spg_bounds: elbo, eubo)
    got = tensors_of(out)
    assert tuple(got) == provides(est)
    full = tensors_of(est(tiny, ro, torch.Generator().manual_seed(2)))
    for name, t in got.items():
        assert t.shape == (N, L) and t.dtype == torch.float32 and t.device == ro.completion_ids.device, name
        assert (t[~need] == 0).all()
        if name == "eubo":
            pass  # an upper-bound estimate: its sign is not fixed
        elif getattr(est, "masking", "random") == "block" or name == "block_elbo":  # some positions unscored (0)
            assert (t[need] <= 0).all() and (t[need] < 0).any()
        else:
            assert (t[need] < 0).all()
        torch.testing.assert_close(t[need], full[name][need], rtol=1e-5, atol=1e-6)  # a subset changes nothing


@pytest.mark.parametrize("name", OBJECTIVES.names())
def test_every_registered_objective_honours_its_protocol(name):
    obj = OBJECTIVES.get(name)()
    assert obj.default_likelihood in LIKELIHOODS
    g = torch.Generator().manual_seed(0)
    N, L = 6, 5
    logp = (-torch.rand(N, L, generator=g)).requires_grad_()
    assert set(reads(obj)) <= set(provides(LIKELIHOODS.get(obj.default_likelihood)))
    old, ref = logp.detach() - 0.1, logp.detach() + 0.1

    def per_token(x):  # what the objective reads (spg_bounds: PerToken(elbo, eubo)), built from one tensor
        names = reads(obj)
        return x if names == ("logp",) else PerToken(**{n: x * (1.0 - 0.2 * i) for i, n in enumerate(names)})

    adv = obj.advantages(torch.rand(N, generator=g), torch.tensor([0, 0, 0, 1, 1, 1]))
    assert adv.shape == (N,) and adv.dtype == torch.float32
    mask = torch.ones(N, L, dtype=torch.bool)
    out = obj(per_token(logp), per_token(old), per_token(ref) if obj.needs_reference else None,
              adv[:, None].expand(N, L), mask)
    assert out.loss.dim() == 0 and torch.isfinite(out.loss)
    out.loss.backward()
    assert logp.grad is not None and all(isinstance(v, float) for v in out.metrics.values())
    # metrics are shares: two halves with the whole batch's normaliser sum to the whole-batch value
    # (the trainer's rule: the token count for token_mean aggregation, else the sequence count)
    whole = float(N * L) if getattr(obj, "aggregation", "token_mean") == "token_mean" else float(N)
    halves = [obj(per_token(logp.detach()[s]), per_token(old[s]), per_token(ref[s]) if obj.needs_reference else None,
                  adv[s, None].expand(-1, L), mask[s], normalizer=whole) for s in (slice(0, 3), slice(3, 6))]
    for k, v in out.metrics.items():
        assert halves[0].metrics[k] + halves[1].metrics[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k


# ----------------------------------------------------------------------------------- the seam
def _credit_batch(adapter):
    ro = _rollout(adapter)
    rewards = torch.tensor([1.0, 0.0, 0.5])
    adv = torch.tensor([0.5, -0.5, 0.0])
    return CreditBatch(rollout=ro, rewards=rewards, advantages=adv[:, None] * ro.completion_mask.float(),
                       loss_mask=ro.completion_mask.clone())


def _ctx(batch):
    return CreditContext(rewards=batch.rewards, group_ids=batch.rollout.group_ids, sequence_advantages=batch.rewards,
                         score=lambda r, c: torch.zeros(len(r)), reduce=lambda t, op="sum": t,
                         generator=torch.Generator(), policy=None, objective=None, likelihood=None)


@dataclasses.dataclass(frozen=True)
class _Bad(CreditModule):
    what: str = "shape"

    def __call__(self, batch, ctx):
        if self.what == "shape":
            return dataclasses.replace(batch, advantages=batch.advantages[:, :3])
        if self.what == "dtype":
            return dataclasses.replace(batch, advantages=batch.advantages.double())
        if self.what == "nan":
            adv = batch.advantages.clone()
            adv[2, 1] = float("nan")
            return dataclasses.replace(batch, advantages=adv)
        if self.what == "mask":
            return dataclasses.replace(batch, loss_mask=batch.loss_mask.float())
        if self.what == "rollout":
            return dataclasses.replace(batch, rollout=batch.rollout.select(slice(0, 2)))
        if self.what == "term":
            from maskrl.likelihood import MeanField
            from maskrl.objectives import DiffuGRPO
            from maskrl.types import LossTerm
            return dataclasses.replace(batch, terms=(LossTerm("base", 1.0, batch.rollout, batch.advantages,
                                                              batch.loss_mask, DiffuGRPO(), MeanField()),))
        return None


@pytest.mark.parametrize("what, match", [
    ("shape", r"credit module bad: advantages must be \[N, L\] = \(3, 8\), got \(3, 3\)"),
    ("dtype", "advantages must be float32"),
    ("nan", r"non-finite advantages in rows \[2\]"),
    ("mask", "loss_mask must be bool"),
    ("rollout", "replaced the rollout"),
    ("term", "loss term names must be unique and not 'base'"),
    ("none", "returned NoneType"),
])
def test_the_seam_names_the_module_that_broke_its_output(tiny, what, match):
    batch = _credit_batch(tiny)
    with pytest.raises((ValueError, TypeError), match=match):
        apply_credit([("bad", _Bad(what))], batch, [_ctx(batch)])


def test_loss_term_checks_shapes_and_devices(tiny):
    from maskrl.likelihood import MeanField
    from maskrl.objectives import DiffuGRPO
    from maskrl.types import LossTerm

    b = _credit_batch(tiny)
    with pytest.raises(ValueError, match=r"loss term 'step': mask must be a tensor of the rollout's shape \(3, 8\)"):
        LossTerm("step", 1.0, b.rollout, b.advantages, b.loss_mask[:2], DiffuGRPO(), MeanField())
    with pytest.raises(ValueError, match="advantages must be floating point"):
        LossTerm("step", 1.0, b.rollout, b.loss_mask.long(), b.loss_mask, DiffuGRPO(), MeanField())


def test_credit_modules_compose_in_order(tiny):
    @dataclasses.dataclass(frozen=True)
    class Add(CreditModule):
        x: float = 1.0

        def __call__(self, batch, ctx):
            return dataclasses.replace(batch, advantages=batch.advantages + self.x, metrics={"x": self.x})

    @dataclasses.dataclass(frozen=True)
    class Mul(CreditModule):
        x: float = 2.0

        def __call__(self, batch, ctx):
            return dataclasses.replace(batch, advantages=batch.advantages * self.x)

    b = _credit_batch(tiny)
    out = apply_credit([("add", Add()), ("mul", Mul())], b, [_ctx(b), _ctx(b)])
    torch.testing.assert_close(out.advantages, (b.advantages + 1) * 2)
    out2 = apply_credit([("mul", Mul()), ("add", Add())], b, [_ctx(b), _ctx(b)])
    torch.testing.assert_close(out2.advantages, b.advantages * 2 + 1)
    assert out.metrics == {"add/x": 1.0}


def test_the_seam_refuses_advantages_changed_after_the_base_term_is_off(tiny):
    """A module that reshapes advantages after another moved training off the base term would train
    nothing (the [dtca, dps] composition did, silently); the other order composes."""
    @dataclasses.dataclass(frozen=True)
    class Off(CreditModule):
        how: str = "mask"

        def __call__(self, batch, ctx):
            if self.how == "mask":
                return dataclasses.replace(batch, loss_mask=torch.zeros_like(batch.loss_mask))
            return dataclasses.replace(batch, base_weight=0.0)

    @dataclasses.dataclass(frozen=True)
    class Scale(CreditModule):
        def __call__(self, batch, ctx):
            return dataclasses.replace(batch, advantages=batch.advantages * 3.0)

    b = _credit_batch(tiny)
    assert b.loss_mask.any() and b.base_weight == 1.0 and b.advantages.abs().sum() > 0
    for how in ("mask", "weight"):
        with pytest.raises(ValueError, match="credit module scale changes the base term's advantages, but off "
                                             r"\(earlier in `credit:`\) turned the base term off.*list scale before off"):
            apply_credit([("off", Off(how)), ("scale", Scale())], b, [_ctx(b), _ctx(b)])
        out = apply_credit([("scale", Scale()), ("off", Off(how))], b, [_ctx(b), _ctx(b)])
        torch.testing.assert_close(out.advantages, b.advantages * 3.0)
    # a module that leaves the advantages alone may follow (e.g. one adding its own loss term)
    apply_credit([("off", Off()), ("same", Off())], b, [_ctx(b), _ctx(b)])


def test_credit_registry_is_importable_and_names_are_unique():
    assert isinstance(CREDITS.names(), list)
    with pytest.raises(ValueError, match="already registered"):
        OBJECTIVES.register("diffu_grpo")(object)


def test_trainer_names_a_likelihood_that_returns_the_wrong_shape(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class Short:
        def rows(self, rollout, need=None):
            return torch.ones(rollout.batch_size, dtype=torch.long)

        def __call__(self, adapter, rollout, generator, need=None):
            return torch.zeros(rollout.batch_size, 2)

    cfg = load_config([], [f"output_dir={tmp_path}", "rollout.gen_length=8", "rollout.block_length=8",
                           "rollout.steps=8", "rollout.temperature=1.0", "train.prompts_per_step=1",
                           "train.group_size=2", "train.inner_iterations=1"])
    cfg.likelihood = Short()
    tr = RLTrainer(cfg, _tiny(), OddChars(), _examples())
    with pytest.raises(ValueError, match=r"loss term 'base': likelihood Short: per-token 'logp' has shape \(2, 2\) "
                                         r"on cpu; expected \[N, L\] = \(2, 8\)"):
        tr.optimize(tr.collect())


def test_the_seam_checks_each_named_tensor():
    """``per_token_output``: each named tensor's shape, device and dtype, the names the objective
    reads, and a plain tensor passed on unchanged (plug-ins returning one tensor keep working)."""
    from maskrl.likelihood import per_token_output
    from maskrl.objectives import SPG, DiffuGRPO

    need = torch.ones(2, 3, dtype=torch.bool)
    x = torch.zeros(2, 3)
    assert per_token_output(x, need, DiffuGRPO(), "lik") is x
    rec = per_token_output(PerToken(elbo=x, eubo=x + 1, extra=x), need, SPG(), "lik")
    assert rec.names == ("elbo", "eubo") and torch.equal(rec.eubo, x + 1)
    with pytest.raises(ValueError, match=r"lik: per-token 'eubo' has shape \(2, 2\)"):
        per_token_output(PerToken(elbo=x, eubo=x[:, :2]), need, SPG(), "lik")
    with pytest.raises(ValueError, match=r"lik: per-token 'eubo' has dtype torch.complex64"):
        per_token_output(PerToken(elbo=x, eubo=torch.complex(x, x)), need, SPG(), "lik")
    with pytest.raises(ValueError, match=r"lik provides logp per token; objective SPG reads elbo, eubo"):
        per_token_output(x, need, SPG(), "lik")
    with pytest.raises(ValueError, match="expected an \\[N, L\\] tensor or a PerToken"):
        per_token_output([x], need, DiffuGRPO(), "lik")
    with pytest.raises(AttributeError, match="frozen"):
        rec.elbo = x
    with pytest.raises(KeyError, match="this record has elbo, eubo"):
        rec["logp"]


def test_config_refuses_an_objective_whose_tensors_the_likelihood_lacks():
    with pytest.raises(ConfigError, match=r"likelihood: likelihood MeanField provides logp per token, but objective "
                                          r"SPG reads elbo, eubo \(missing: elbo, eubo\)"):
        load_config([], ["objective.name=spg", "likelihood.name=mean_field"])
    assert load_config([], ["objective.name=spg"]).likelihood.masking == "block"
