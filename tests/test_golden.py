"""Pinned values of the sampler and the trainer (tests/golden/pin.py): every Rollout field over a
matrix of sampler settings, and the weights and metrics after two RL steps of six recipes, must
equal the recorded digests. A key that could not re-record after a change meant to move values
keeps only the cases that did not move (the others dropped, never left stale: a warning says how
many are not pinned there, and the twins cover them). The bit-exact tests elsewhere compare
two code paths in one process; a change that moves both passes them, and fails here.

Recorded per machine key (torch version, ATen CPU kernel set, threads, processor: maskrl.machine;
``$MASKRL_FLOAT_KEY`` stands in for it, to see what runs elsewhere): MKL's and oneDNN's kernels
differ across processors even at one kernel set, so on a key that was never recorded the bit-exact
tests skip and say so. Their twins (``tests/golden/twin.py``, ``portable.py``) run on every machine:
the same runs' values (``tests/golden/portable.json``), decoded rows compared exactly outside ties
(rows that float noise of the logits' dtype moves on the machine at hand, reported), probabilities,
statistics, metrics and weight updates within tolerances that follow float32's eps and each
quantity's scale. Re-record only for a change that is meant to move values:
``python tests/golden/pin.py`` and ``python tests/golden/portable.py``.
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "golden"))
import pin  # noqa: E402
import portable  # noqa: E402
import twin  # noqa: E402

EPS = torch.finfo(torch.float32).eps
#: float tolerances in float32 ulps of the quantity's scale. Sampler floats: logits of another
#: kernel set differ by at most 3.5 eps of the largest |logit| (measured, twin.NOISE_ULPS), the
#: tolerance is 64 of them. Trainer: AdamW's m/sqrt(v) turns gradient noise into update noise;
#: measured (AVX-512 against the portable kernels and 2 threads) at most 533 eps of ||update|| and
#: 250 eps of a metric's size; the tolerance is 2^13.
SAMPLER_ULPS, TRAINER_ULPS = 64, 2 ** 13
#: a metric's scale is its own size, at least this (losses of ~1e-4 are differences of O(0.01) terms)
METRIC_FLOOR = 1e-2


def _recorded(part: str, twin_test: str):
    """The ``part`` (``sampler`` / ``trainer``) digests of this machine key; elsewhere, or where none of
    the part is recorded for it, a skip that names the twin that runs instead."""
    data = json.loads(pin.DIGESTS.read_text())
    key = pin.machine_key()
    if not data.get(key, {}).get(part):
        pytest.skip(f"no golden {part} digests for {key} (recorded: {sorted(data)}); float kernels differ across "
                    f"CPUs. The twin {twin_test} ran instead (tests/golden/portable.json)")
    return data[key][part]


def _diff(want: dict, got: dict) -> list[str]:
    return [f"{case}: {sorted(k for k in set(want[case]) | set(got.get(case, {})) if want[case].get(k) != got.get(case, {}).get(k))}"
            for case in want if want[case] != got.get(case)]


def _compare(part: str, want: dict, got: dict) -> None:
    """Every recorded case equal. A key may hold fewer cases than are computed (the cases a change moved
    are dropped from the keys that could not re-record them, never left stale): warned, with the
    twin covering them; a recorded case that is no longer computed fails."""
    assert set(want) <= set(got), sorted(set(want) - set(got))
    if set(got) - set(want):
        warnings.warn(f"golden {part}: {len(set(got) - set(want))} of {len(got)} cases not pinned on this machine key "
                      "(the twins cover them)")
    assert not _diff(want, got), _diff(want, got)


def test_sampler_outputs_equal_the_pinned_digests():
    want = _recorded("sampler", "test_sampler_twin_holds_on_any_cpu")
    _compare("sampler", want, pin.sampler_digests())


def test_trainer_weights_and_metrics_equal_the_pinned_digests():
    want = _recorded("trainer", "test_trainer_twin_holds_on_any_cpu")
    _compare("trainer", want, pin.trainer_digests())


def test_a_partial_key_compares_what_it_holds_and_never_a_stale_or_missing_case():
    got = {"a": {"x": "1"}, "b": {"x": "2"}}
    with pytest.warns(UserWarning, match="1 of 2 cases not pinned"):
        _compare("sampler", {"a": {"x": "1"}}, got)
    with pytest.raises(AssertionError, match="a: \\['x'\\]"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _compare("sampler", {"a": {"x": "9"}}, got)  # a recorded digest that moved fails
    with pytest.raises(AssertionError, match="gone"):
        _compare("sampler", {"gone": {"x": "1"}, **got}, got)  # a recorded case no longer computed fails


# ------------------------------------------------------------------------------------------- twins
PORTABLE = json.loads(portable.PORTABLE.read_text())


def _logit_scale(adapter) -> float:
    """The largest finite |logit| of ``adapter`` on pin.PROMPTS followed by 16 masks (one forward)."""
    from maskrl.text import encode_prompts
    ids, mask = encode_prompts(adapter.tokenizer, pin.PROMPTS)
    x = torch.cat([ids, torch.full((ids.shape[0], 16), adapter.mask_id)], 1)
    with torch.no_grad():
        z = adapter.model(input_ids=x).logits.float()
    return float(z[z.isfinite()].abs().max())


def sampler_twin(records: dict) -> twin.Tally:
    """Every pin.py sampler case against ``records`` (portable.json's ``sampler``): the tally."""
    models = portable.sampler_models()
    scale = {name: _logit_scale(ad) for name, ad in models.items()}
    tally = twin.Tally()
    for case in pin.sampler_cases():
        name, model, kw, _ = case
        want = records[name]
        ro = portable.run_case(models, case)
        got = portable.decisions(ro)
        diff = twin.differing_rows(got, torch.tensor(want["decisions"]))
        ties = twin.noise_sensitive(models[model].model, lambda: portable.decisions(portable.run_case(models, case)),
                                    got, diff) if diff else set()
        tol = twin.float_tol(torch.float32, scale[model], SAMPLER_ULPS)
        for r in range(got.shape[0]):
            if r in ties:
                tally.ties.append(f"{name} row {r}")
            elif r in diff:
                tally.failures.append(f"{name} row {r}: decoded differently, and float noise does not move it")
            else:
                bad = [k for k, v in portable.floats(ro).items()
                       if not twin.close(v[r], torch.tensor(want["floats"][k][r]),
                                         tol * (1 if k == "commit_prob" else kw["gen_length"])).all()]
                tally.compared += 1
                if bad:
                    tally.failures.append(f"{name} row {r}: {bad} beyond {tol:.3g} (x L for step sums)")
    return tally


@pytest.mark.numerics
def test_sampler_twin_holds_on_any_cpu():
    """Every case's rows equal the recorded ones outside ties; their floats within tolerance."""
    tally = sampler_twin(PORTABLE["sampler"])
    if tally.ties:
        warnings.warn(f"sampler twin: {tally.summary()}")
    tally.check()


def test_sampler_twin_fails_on_moved_values():
    """The twin can fail: a recorded row shifted by one token, and a commit probability moved by
    far more than the tolerance, are both reported as failures, not ties."""
    records = json.loads(json.dumps(PORTABLE["sampler"]))
    case = "tiny-none-fixed-t0.0-obs0"  # greedy: no row of it is a tie on the machines measured
    records[case]["decisions"][0][0] += 1
    records[case]["floats"]["commit_prob"][1][0] += 1e-3
    only = {case: records[case]}
    cases = [c for c in pin.sampler_cases() if c[0] == case]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pin, "sampler_cases", lambda: cases)
        tally = sampler_twin(only)
    assert [f.split(":")[0] for f in tally.failures] == [f"{case} row 0", f"{case} row 1"], tally.failures


def trainer_mismatches(want: dict, got: dict, tol_ulps: float = TRAINER_ULPS) -> list[str]:
    """What of ``got`` (portable.train_recipe's result) lies beyond tolerance of ``want``."""
    out = []
    tol = tol_ulps * EPS
    if [sorted(m) for m in got["metrics"]] != [sorted(m) for m in want["metrics"]]:
        out.append("metric keys differ")
    for s, (mw, mg) in enumerate(zip(want["metrics"], got["metrics"])):
        for k, a in mw.items():
            b = mg.get(k)
            if isinstance(a, float) and isinstance(b, float):
                if not twin.close(torch.tensor(b), torch.tensor(a), tol * max(abs(a), METRIC_FLOOR)):
                    out.append(f"step {s} {k}: {b!r} vs recorded {a!r}")
            elif a != b:
                out.append(f"step {s} {k}: {b!r} vs recorded {a!r}")
    for k, a in want["update"].items():
        b = got["update"].get(k)
        if b is None or not twin.close(torch.tensor(b), torch.tensor(a), tol * a[0]).all():
            out.append(f"update of {k}: [norm, projections] {b} vs recorded {a}")
    return out


@pytest.mark.numerics
def test_trainer_twin_holds_on_any_cpu():
    """Every recipe's metrics and weight update within tolerance of the recorded ones; a recipe that
    misses is a tie (reported) only when float noise of the logits moves its own result beyond
    tolerance on this machine too."""
    tally = twin.Tally()
    for name, sets in pin.RECIPES.items():
        got = portable.train_recipe(sets)
        bad = trainer_mismatches(PORTABLE["trainer"][name], got)
        if not bad:
            tally.compared += 1
            continue
        moved = any(trainer_mismatches(got, portable.train_recipe(sets, hook=lambda m, s=seed: twin.logit_noise(m, s)))
                    for seed in range(3))
        (tally.ties if moved else tally.failures).append(f"{name}: {bad[:3]}")
    if tally.ties:
        warnings.warn(f"trainer twin: {tally.summary()}")
    tally.check()


def test_float_key_override_stands_in_for_the_machine(monkeypatch):
    """``$MASKRL_FLOAT_KEY`` replaces the machine key the pins are looked up by (to see what runs on a
    processor that recorded nothing); unset, the key is maskrl.machine.float_key()."""
    from maskrl.machine import float_key

    monkeypatch.delenv("MASKRL_FLOAT_KEY", raising=False)
    assert pin.machine_key() == float_key()
    monkeypatch.setenv("MASKRL_FLOAT_KEY", "another-processor")
    assert pin.machine_key() == "another-processor"
    with pytest.raises(pytest.skip.Exception, match="another-processor.*test_sampler_twin_holds_on_any_cpu ran instead"):
        test_sampler_outputs_equal_the_pinned_digests()
