"""The demo's curves.png: the accuracy panel carries each evaluation's 95 % interval (issue 20 item 5)."""
from __future__ import annotations

from maskrl.demo import accuracy_points, plot_curves


def _history():
    h = [{"step": s, "reward": 0.8 + 0.001 * s} for s in range(1, 21)]
    h[9].update({"eval/accuracy": 0.422, "eval/accuracy_ci95": [0.379, 0.466]})
    h[19].update({"eval/accuracy": 0.44, "eval/accuracy_ci95": [0.397, 0.484]})
    return h


def test_accuracy_points_carry_the_intervals_base_first():
    base = {"accuracy": 0.45, "accuracy_ci95": [0.407, 0.494], "n": 500}
    assert accuracy_points(_history(), base) == [(0, 0.45, 0.407, 0.494), (10, 0.422, 0.379, 0.466),
                                                 (20, 0.44, 0.397, 0.484)]
    # a history without intervals (older runs) gives zero-width bars rather than an error
    assert accuracy_points([{"step": 5, "eval/accuracy": 0.5}], {"accuracy": 0.4})[1] == (5, 0.5, 0.5, 0.5)


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "curves.png"
    plot_curves(_history(), {"accuracy": 0.45, "accuracy_ci95": [0.407, 0.494], "n": 500}, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
