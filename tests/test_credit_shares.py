"""Credit metrics of the whole batch on several processes (issue 50 §1, :mod:`maskrl.credit.base`): each
kind of share combines into the value of every process's items together, by hand; on one process a
share is its own value; shares survive the pickling the trainer's gather uses."""
import math
import pickle

import pytest
import torch

from maskrl.credit.base import ShareCount, ShareMax, ShareMean, ShareMin, ShareStd, combine
from maskrl.training.batch_metrics import credit_metrics_over_processes


def _shares(kind, parts: list[torch.Tensor]):
    """One share per process over the items ``parts[p]`` (``[n_p]`` float64), as a module reports it."""
    out = []
    for x in parts:
        n = x.numel()
        mean = x.mean().item() if n else 0.0
        out.append({"mean": lambda: ShareMean(mean, n), "count": lambda: ShareCount(n),
                    "min": lambda: ShareMin(x.min().item() if n else 1.0, n),
                    "max": lambda: ShareMax(x.max().item() if n else 1.0, n),
                    "std": lambda: ShareStd(x.std(unbiased=False).item() if n else 0.0, mean, n)}[kind]())
    return out


@pytest.mark.numerics
@pytest.mark.parametrize("kind", ["mean", "count", "min", "max", "std"])
def test_shares_combine_into_the_whole_batchs_value(kind):
    g = torch.Generator().manual_seed(0)
    parts = [torch.randn(5, generator=g, dtype=torch.float64), torch.randn(1, generator=g, dtype=torch.float64) + 3,
             torch.zeros(0, dtype=torch.float64)]  # unequal counts, and a process without items
    whole = torch.cat(parts)
    want = {"mean": whole.mean(), "count": float(whole.numel()), "min": whole.min(), "max": whole.max(),
            "std": whole.std(unbiased=False)}[kind]
    got = combine(_shares(kind, parts))
    assert got == pytest.approx(float(want), rel=64 * torch.finfo(torch.float64).eps)
    if kind in ("mean", "std"):  # the mean of the processes' values would be another number
        assert sum(map(float, _shares(kind, parts))) / 3 != pytest.approx(float(want))


def test_by_hand():
    # kept 3 of 4 states on one process, 0 of 1 on another: 3/5, not (0.75 + 0) / 2
    assert combine([ShareMean(0.75, 4), ShareMean(0.0, 1)]) == 0.6
    assert combine([ShareMean(0.0, 0), ShareMean(0.0, 0)]) == 0.0  # no items anywhere: the default
    assert combine([ShareCount(4), ShareCount(1)]) == 5.0
    assert combine([ShareMin(1.0, 0), ShareMin(0.5, 2)]) == 0.5  # a process without items has no minimum
    # {1, 3} and {5}: mean 3, population variance (4 + 0 + 4) / 3
    assert combine([ShareStd(1.0, 2.0, 2), ShareStd(0.0, 5.0, 1)]) == pytest.approx(math.sqrt(8 / 3), rel=1e-15)
    assert combine([0.2, 0.4]) == pytest.approx(0.3)  # plain floats: the mean over processes
    with pytest.raises(ValueError, match="different kinds"):
        combine([ShareMean(0.5, 1), 0.5])


def test_a_share_reads_as_its_value_and_pickles():
    s = ShareStd(0.5, 2.0, 3)
    assert s == 0.5 and s + 1 == 1.5 and f"{s:.2f}" == "0.50" and s == pytest.approx(0.5)
    back = pickle.loads(pickle.dumps(s))
    assert type(back) is ShareStd and (float(back), back.mean, back.count) == (0.5, 2.0, 3.0)
    for share in (ShareMean(0.25, 4), ShareCount(3), ShareMin(0.1, 2), ShareMax(0.9, 2)):
        back = pickle.loads(pickle.dumps(share))
        assert type(back) is type(share) and float(back) == float(share) and vars(back) == vars(share)


def test_one_process_logs_the_values_themselves():
    class One:
        num_processes = 1

    got = credit_metrics_over_processes(One(), {"credit/dps/delta_mean": ShareMean(0.125, 7), "credit/x/y": 2.0})
    assert got == {"credit/dps/delta_mean": 0.125, "credit/x/y": 2.0}
    assert all(type(v) is float for v in got.values())
