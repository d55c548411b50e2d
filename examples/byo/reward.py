"""A user reward for examples/byo (TRL's shape): ``reward(prompts, completions, **columns) -> list[float]``.

1.0 for the exact sum; otherwise partial credit for each digit in the right place, so that early
policies get a signal. ``answer`` is the data file's column of that name (one value per completion).
"""


def sum_reward(prompts, completions, answer, **columns):
    out = []
    for completion, want in zip(completions, answer):
        got = completion.strip()
        if got == want:
            out.append(1.0)
            continue
        hits = sum(g == w for g, w in zip(got, want))
        out.append(0.5 * hits / max(len(want), len(got), 1))
    return out
