"""`maskrl eval` harness (docs/spec.md §5): files, rewards, resume, argument errors, CLI end to end.

Everything runs on a tiny randomly initialised model saved to a tmp folder and six generated 4x4
Sudoku puzzles written as a d1-style CSV, so nothing depends on the shared data directory.
"""
from __future__ import annotations

import csv
import json
import math
import re
import shutil

import pytest
import torch

import maskrl.evaluate as ev
from maskrl.cli import main
from maskrl.evaluate import evaluate_examples, run_harness
from maskrl.models import build_tiny, load, save_model
from maskrl.sampling import SamplerConfig
from maskrl.scoring import sha256_file
from maskrl.stats import wilson_interval
from maskrl.tasks import get_task

N_ROWS = 6
LENGTHS = (32, 64)
KEYS = {"id", "gen_length", "prompt", "completion", "reward", "correct"}
REAL_COMPLETE = ev.complete  # before any test patches it
# a short template on which the random tiny model's completions depend on the puzzle
TEMPLATE = "sudoku 4x4, 0=blank: {puzzle}\nsolution: "


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny matmuls on a shared 2-core machine are ~500x faster single-threaded."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def task():
    return get_task("sudoku4x4", TEMPLATE)


@pytest.fixture(scope="module")
def examples(task):
    return task.generate(N_ROWS, seed=0)


@pytest.fixture(scope="module")
def data_csv(tmp_path_factory, examples):
    path = tmp_path_factory.mktemp("data") / "sudoku.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["Puzzle", "Solution"])
        for ex in examples:
            w.writerow([ex.fields["puzzle"], ex.fields["solution"]])
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # this seed gives prompt-dependent completions with some digits, so rewards vary (checked below)
    torch.set_num_threads(1)
    adapter = build_tiny(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, seed=8)
    return save_model(adapter, tmp_path_factory.mktemp("model") / "tiny")


class Interrupted(Exception):
    """Stands in for the process being killed mid-run."""


class Spy:
    """Wraps (or replaces) ``maskrl.evaluate.complete``; records each call's prompts and sampler."""

    def __init__(self, fake=None, fail_on_call: int | None = None, watch=None):
        self.calls: list[tuple[list[str], SamplerConfig]] = []
        self.fake, self.fail_on_call, self.watch = fake, fail_on_call, watch
        self.lines_on_disk: list[int] = []  # complete lines in that length's JSONL when each call starts

    def __call__(self, adapter, prompts, sampler, batch_size=64, generator=None, progress=False, desc=""):
        if self.fail_on_call is not None and len(self.calls) + 1 == self.fail_on_call:
            raise Interrupted("simulated interruption")
        if self.watch is not None:
            path = self.watch / f"samples_L{sampler.gen_length}.jsonl"
            self.lines_on_disk.append(path.read_bytes().count(b"\n") if path.exists() else -1)
        self.calls.append((list(prompts), sampler))
        if self.fake is not None:
            return [self.fake(p) for p in prompts]
        return REAL_COMPLETE(adapter, prompts, sampler, batch_size=batch_size, generator=generator)

    def prompts(self, gen_length: int) -> list[str]:
        return [p for ps, s in self.calls if s.gen_length == gen_length for p in ps]


def harness(model_dir, data_csv, out, **kw):
    kw.setdefault("gen_lengths", LENGTHS)
    kw.setdefault("batch_size", 2)
    kw.setdefault("prompt_template", TEMPLATE)
    return run_harness(model=model_dir, task_name="sudoku4x4", out_dir=out, data_path=data_csv, device="cpu",
                       progress=False, **kw)


def rows_of(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, model_dir, data_csv):
    """An uninterrupted run at L = 32, 64 with batch size 2; returns (out dir, summary, spy)."""
    out = tmp_path_factory.mktemp("reference") / "out"
    spy = Spy(watch=out)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ev, "complete", spy)
        torch.set_num_threads(1)
        summary = harness(model_dir, data_csv, out)
    return out, summary, spy


def test_writes_rows_with_task_rewards_and_summary(reference, task, examples, model_dir, data_csv):
    out, summary, spy = reference
    assert {p.name for p in out.iterdir()} == {"samples_L32.jsonl", "samples_L64.jsonl", "settings.json",
                                               "summary.json", "summary.md"}
    adapter = load(model_dir)
    for L in LENGTHS:
        rows = rows_of(out / f"samples_L{L}.jsonl")
        assert [r["id"] for r in rows] == list(range(N_ROWS))
        assert all(set(r) == KEYS and r["gen_length"] == L for r in rows)
        assert [r["prompt"] for r in rows] == [ex.prompt for ex in examples]  # the tiny tokenizer has no template
        completions = [r["completion"] for r in rows]
        # the test has power only if completions and rewards differ between rows
        assert len(set(completions)) >= 3 and len({r["reward"] for r in rows}) >= 2
        assert [r["reward"] for r in rows] == task.score_examples(examples, completions)
        assert [r["correct"] for r in rows] == [task.is_correct(r["reward"]) for r in rows]
        # greedy, steps L/2, block 32, batched by 2, through the training sampler
        expected = SamplerConfig(gen_length=L, block_length=32, steps=L // 2, temperature=0.0)
        calls = [(ps, s) for ps, s in spy.calls if s.gen_length == L]
        assert [len(ps) for ps, _ in calls] == [2, 2, 2] and all(s == expected for _, s in calls)
        assert evaluate_examples(adapter, task, examples, expected).completions == completions

        res = next(r for r in summary["results"] if r["gen_length"] == L)
        k = sum(r["correct"] for r in rows)
        assert res["n"] == N_ROWS and res["accuracy"] == k / N_ROWS
        assert res["accuracy_ci95"] == list(wilson_interval(k, N_ROWS))
        assert math.isclose(res["mean_reward"], sum(r["reward"] for r in rows) / N_ROWS)
        assert res["sampler"]["steps"] == L // 2 and res["sampler"]["temperature"] == 0.0
        assert (res["generated"], res["resumed"], res["samples"]) == (N_ROWS, 0, f"samples_L{L}.jsonl")

    # every batch is on disk (flushed) before the next one is generated
    assert spy.lines_on_disk == [0, 2, 4] * len(LENGTHS)

    stored = json.loads((out / "summary.json").read_text())
    assert stored == {k: v for k, v in summary.items() if k != "markdown"}
    assert stored["task"] == "sudoku4x4" and stored["model"] == str(model_dir.resolve())
    assert stored["data"] == {"path": str(data_csv.resolve()), "sha256": sha256_file(data_csv)}
    assert [r["gen_length"] for r in stored["results"]] == list(LENGTHS)
    md = (out / "summary.md").read_text()
    assert md == summary["markdown"]
    table = [ln for ln in md.splitlines() if re.match(r"\| \d+ \|", ln)]
    assert [ln.split(" | ")[:3] for ln in table] == [["| 32", "16", "6"], ["| 64", "32", "6"]]
    # the per-sample files are named by their path, not their bare name (issue 20 item 5)
    assert f"`{out / 'samples_L32.jsonl'}`, `{out / 'samples_L64.jsonl'}`" in md


def test_rewards_and_accuracy_follow_the_stored_completion(tmp_path, monkeypatch, model_dir, data_csv, examples):
    """Known completions (solved for even ids, empty for odd ones) pin rewards to the right rows."""
    solution = {ex.fields["puzzle"]: ex.fields["solution"] for ex in examples}
    even = {ex.fields["puzzle"] for ex in examples if ex.id % 2 == 0}

    def fake(prompt):
        puzzle = re.search(r"blank: (\d{16})", prompt).group(1)
        return f"<answer>{solution[puzzle]}</answer>" if puzzle in even else ""

    monkeypatch.setattr(ev, "complete", Spy(fake))
    summary = harness(model_dir, data_csv, tmp_path / "out", gen_lengths=[32], batch_size=4)
    rows = rows_of(tmp_path / "out" / "samples_L32.jsonl")
    assert [(r["reward"], r["correct"]) for r in rows] == [(1.0, True), (0.0, False)] * 3
    res = summary["results"][0]
    assert res["accuracy"] == 0.5 and res["accuracy_ci95"] == list(wilson_interval(3, 6))
    assert res["mean_reward"] == 0.5 and res["cell_accuracy"] == 0.5


def test_resume_after_interruption_equals_uninterrupted_run(tmp_path, monkeypatch, reference, model_dir, data_csv):
    ref_out, ref_summary, _ = reference
    out = tmp_path / "out"
    # interrupted in the second batch of L = 32: the first batch is on disk, flushed
    monkeypatch.setattr(ev, "complete", Spy(fail_on_call=2))
    with pytest.raises(Interrupted):
        harness(model_dir, data_csv, out)
    path = out / "samples_L32.jsonl"
    ref_lines = (ref_out / "samples_L32.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    assert path.read_text(encoding="utf-8") == "".join(ref_lines[:2])
    assert not (out / "samples_L64.jsonl").exists() and not (out / "summary.json").exists()
    # and killed half-way through writing the next line
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(ref_lines[2][:40])

    spy = Spy()
    monkeypatch.setattr(ev, "complete", spy)
    summary = harness(model_dir, data_csv, out, resume=True)
    ids = {ex_prompt: i for i, ex_prompt in enumerate(r["prompt"] for r in rows_of(ref_out / "samples_L32.jsonl"))}
    assert [ids[p] for p in spy.prompts(32)] == [2, 3, 4, 5]  # the truncated row is redone, 0 and 1 are not
    assert len(spy.prompts(64)) == N_ROWS
    for L in LENGTHS:
        assert (out / f"samples_L{L}.jsonl").read_bytes() == (ref_out / f"samples_L{L}.jsonl").read_bytes()
    volatile = {"seconds", "generated", "resumed"}
    for got, want in zip(summary["results"], ref_summary["results"]):
        assert {k: v for k, v in got.items() if k not in volatile} == {k: v for k, v in want.items() if k not in volatile}
    assert [(r["generated"], r["resumed"]) for r in summary["results"]] == [(4, 2), (6, 0)]


def test_resume_skips_finished_ids(tmp_path, monkeypatch, reference, model_dir, data_csv):
    ref_out, _, _ = reference
    out = tmp_path / "out"
    shutil.copytree(ref_out, out)
    ref32, ref64 = (rows_of(ref_out / f"samples_L{L}.jsonl") for L in LENGTHS)
    # delete rows 1 and 4 of L = 32; cut the last line of L = 64 short
    p32 = out / "samples_L32.jsonl"
    p32.write_text("".join(json.dumps(r) + "\n" for r in ref32 if r["id"] not in (1, 4)), encoding="utf-8")
    p64 = out / "samples_L64.jsonl"
    p64.write_bytes(p64.read_bytes()[:-25])

    spy = Spy()
    monkeypatch.setattr(ev, "complete", spy)
    harness(model_dir, data_csv, out, resume=True)
    assert spy.prompts(32) == [ref32[1]["prompt"], ref32[4]["prompt"]]
    assert spy.prompts(64) == [ref64[5]["prompt"]]
    for L in LENGTHS:
        assert (out / f"samples_L{L}.jsonl").read_bytes() == (ref_out / f"samples_L{L}.jsonl").read_bytes()

    # a finished folder generates nothing on resume; --overwrite redoes everything
    spy = Spy()
    monkeypatch.setattr(ev, "complete", spy)
    harness(model_dir, data_csv, out, resume=True)
    assert spy.calls == []
    harness(model_dir, data_csv, out, overwrite=True)
    assert len(spy.prompts(32)) == len(spy.prompts(64)) == N_ROWS


def test_rerun_without_resume_keeps_finished_samples(tmp_path, monkeypatch, reference, model_dir, data_csv, capsys):
    """The same evaluation again into the same folder, without --resume: refused, naming each file
    and its rows, before any generation; nothing is touched. An interrupted first run (some rows on
    disk) is protected the same way. Another length into the same folder is not blocked by them."""
    out = tmp_path / "out"
    shutil.copytree(reference[0], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    spy = Spy(fake=lambda p: "")
    monkeypatch.setattr(ev, "complete", spy)
    with pytest.raises(ValueError) as err:
        harness(model_dir, data_csv, out)
    msg = str(err.value)
    assert f"{out / 'samples_L32.jsonl'} (6 rows), {out / 'samples_L64.jsonl'} (6 rows)" in msg
    assert "--resume to keep them" in msg and "--overwrite to discard them" in msg and "another --out" in msg
    assert spy.calls == [] and {p.name: p.read_bytes() for p in out.iterdir()} == before
    # an interrupted run: 2 rows of L = 32 on disk
    part = tmp_path / "part"
    monkeypatch.setattr(ev, "complete", Spy(fail_on_call=2))
    with pytest.raises(Interrupted):
        harness(model_dir, data_csv, part)
    with pytest.raises(ValueError, match=r"samples_L32\.jsonl \(2 rows\); pass --resume"):
        harness(model_dir, data_csv, part)
    assert len(rows_of(part / "samples_L32.jsonl")) == 2
    # through the CLI: one line, exit 2
    argv = ["eval", "--model", str(model_dir), "--task", "sudoku4x4", "--gen-length", "32,64", "--batch-size", "2",
            "--data", str(data_csv), "--out", str(out), "--device", "cpu", "--prompt-template", TEMPLATE]
    capsys.readouterr()
    assert main(argv) == 2
    assert "already holds finished samples" in capsys.readouterr().err
    # a length not evaluated there yet goes ahead and leaves the others alone
    monkeypatch.setattr(ev, "complete", Spy(fake=lambda p: ""))
    harness(model_dir, data_csv, out, gen_lengths=[96])
    assert (out / "samples_L32.jsonl").read_bytes() == before["samples_L32.jsonl"]


def test_length_errors_say_where_each_value_came_from(tmp_path, data_csv):
    """No --gen-length and no prompt card (or one for another task): the message names the default
    lengths as the default, never as a flag the user did not give."""
    from maskrl.pipeline import save_prompt_card

    small = save_model(build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_positions=300),
                       tmp_path / "small")
    kw = dict(task_name="sudoku4x4", data_path=data_csv, device="cpu", progress=False, prompt_template=TEMPLATE)
    with pytest.raises(ValueError) as err:
        run_harness(model=small, out_dir=tmp_path / "a", **kw)
    msg = str(err.value)
    assert "gen_length 512 leaves no room" in msg and "--gen-length 512" not in msg
    assert "the largest of the default lengths 128,256,512 (no --gen-length was given; the model has no prompt card)" in msg
    save_prompt_card(small, get_task("countdown"), False, SamplerConfig(16, 16, 16))
    with pytest.raises(ValueError, match=r"default lengths 128,256,512 \(no --gen-length was given; prompt card: "
                                         r".*maskrl_prompt.json \(for task 'countdown': ignored\)\)"):
        run_harness(model=small, out_dir=tmp_path / "b", **kw)
    with pytest.raises(ValueError, match=r"gen_length 512 was given with --gen-length$"):
        run_harness(model=small, out_dir=tmp_path / "c", gen_lengths=[512], block_length=32, **kw)
    # sampler settings: each value with its origin
    with pytest.raises(ValueError, match=r"gen_length 128 \(default\), block_length 48 \(--block-length\), "
                                         r"steps 64 \(default; prompt card: .*ignored\)\): gen_length \(=128\) must "
                                         r"be a multiple"):
        run_harness(model=small, out_dir=tmp_path / "d", block_length=48, **kw)
    assert not any((tmp_path / d).exists() for d in "abcd")


@pytest.mark.parametrize("case, match", [
    ("settings", r"other settings \(steps: 0 -> 8\)"),
    ("limit", r"id 3 is not among the 3 rows .*--limit"),
    ("middle line", r"samples_L32\.jsonl:2: not a valid JSON line"),
    ("prompt", r"samples_L32\.jsonl:1: the stored prompt of id 0 differs"),
])
def test_resume_refuses_samples_of_another_evaluation(tmp_path, monkeypatch, reference, model_dir, data_csv,
                                                       case, match):
    out = tmp_path / "out"
    shutil.copytree(reference[0], out)
    kw = {"gen_lengths": [32], "resume": True}
    p32 = out / "samples_L32.jsonl"
    lines = p32.read_text(encoding="utf-8").splitlines(keepends=True)
    if case == "settings":
        kw["steps"] = 8
    elif case == "limit":
        kw["limit"] = 3
    elif case == "middle line":
        p32.write_text(lines[0] + lines[1][:20] + "\n" + "".join(lines[2:]), encoding="utf-8")
    else:
        row = json.loads(lines[0])
        row["prompt"] = "something else"
        p32.write_text(json.dumps(row) + "\n" + "".join(lines[1:]), encoding="utf-8")
    spy = Spy(fake=lambda p: "")
    monkeypatch.setattr(ev, "complete", spy)
    with pytest.raises(ValueError, match=match):
        harness(model_dir, data_csv, out, **kw)
    assert spy.calls == []


@pytest.mark.parametrize("kw, match", [
    ({"gen_lengths": "48"}, r"gen_length 48 \(--gen-length\), block_length 32 .*multiple of block_length"),
    ({"gen_lengths": [64], "steps": 3}, r"steps \(=3\) must be a positive multiple .* = 2"),
    ({"gen_lengths": [6], "block_length": 3}, r"steps \(=3\).*steps defaults to gen_length/2 = 3"),
    ({"gen_lengths": [32], "block_length": 0}, r"block_length \(=0\)"),
    ({"gen_lengths": "32,abc"}, r"gen_lengths \(--gen-length\) '32,abc': expected comma-separated integers"),
    ({"gen_lengths": "32,32"}, r"gen_lengths .*repeated"),
    ({"gen_lengths": [0]}, r"gen_lengths .*positive"),
    ({"gen_lengths": [], }, r"gen_lengths .*no lengths"),
    ({"gen_lengths": [32], "batch_size": 0}, r"batch_size \(--batch-size\)"),
    ({"gen_lengths": [32], "limit": -1}, r"limit \(--limit\)"),
])
def test_bad_arguments_raise_before_loading_the_model(tmp_path, kw, match):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=match):  # not FileNotFoundError: checked before the model is read
        run_harness(model=tmp_path / "no-such-model", task_name="sudoku4x4", out_dir=out, **kw)
    assert not out.exists()


def test_chat_template_and_default_output_folder(tmp_path, monkeypatch, data_csv, examples):
    adapter = build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    adapter.tokenizer.chat_template = ("{% for m in messages %}<u>{{ m['content'] }}</u>{% endfor %}"
                                       "{% if add_generation_prompt %}<a>{% endif %}")
    model_dir = save_model(adapter, tmp_path / "chat-model")
    spy = Spy(fake=lambda p: "1234")
    monkeypatch.setattr(ev, "complete", spy)
    monkeypatch.chdir(tmp_path)
    summary = run_harness(model=model_dir, task_name="sudoku4x4", gen_lengths=[32], data_path=data_csv,
                          limit=2, device="cpu", progress=False, prompt_template=TEMPLATE)
    want = [f"<u>{ex.prompt}</u><a>" for ex in examples[:2]]
    assert spy.prompts(32) == want and summary["chat_template"] is True
    out = tmp_path / summary["out"]  # runs/eval/<task>/<key of weights and settings>
    assert out.parent == tmp_path / "runs" / "eval" / "sudoku4x4" and len(out.name) == 12
    assert [r["prompt"] for r in rows_of(out / "samples_L32.jsonl")] == want
    assert (out / "summary.md").read_text() == summary["markdown"]

    spy.calls.clear()
    summary = run_harness(model=model_dir, task_name="sudoku4x4", gen_lengths=[32], data_path=data_csv,
                          limit=2, device="cpu", progress=False, chat_template=False,
                          prompt_template=TEMPLATE)
    assert spy.prompts(32) == [ex.prompt for ex in examples[:2]] and summary["chat_template"] is False


def test_cli_eval_end_to_end(tmp_path, monkeypatch, capsys, model_dir, data_csv):
    out = tmp_path / "out"
    argv = ["eval", "--model", str(model_dir), "--task", "sudoku4x4", "--gen-length", "32,64", "--limit", "3",
            "--batch-size", "2", "--data", str(data_csv), "--out", str(out), "--device", "cpu",
            "--prompt-template", TEMPLATE]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == (out / "summary.md").read_text().strip()
    assert "| 32 | 16 | 3 |" in printed and "| 64 | 32 | 3 |" in printed
    for L in LENGTHS:
        assert [r["id"] for r in rows_of(out / f"samples_L{L}.jsonl")] == [0, 1, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["limit"] == 3 and summary["n"] == 3 and summary["n_data_rows"] == N_ROWS

    spy = Spy()
    monkeypatch.setattr(ev, "complete", spy)
    assert main(argv + ["--resume"]) == 0
    assert spy.calls == []

    assert main(argv[:5] + ["--gen-length", "48"] + argv[7:]) == 2
    err = capsys.readouterr().err
    assert "maskrl eval: error:" in err and "--gen-length" in err and "block_length" in err


def test_eval_samples_with_the_cards_decoding_rule_as_lm_eval_does(tmp_path):
    """A Dream model's card carries Dream's rule (schedule dream, entropy, top-k 50): ``maskrl eval``
    samples with it, as the lm-eval model does, not with LLaDA's fixed / low-confidence rule (it did:
    the Dream-7B rehearsal's lm-eval and maskrl eval completions differed)."""
    import json

    from lm_eval.api.instance import Instance
    from lm_eval.api.registry import get_model

    import maskrl.lm_eval_model  # noqa: F401
    from conftest import tiny_dream
    from maskrl.evaluate import resolve_prompt_settings, run_harness
    from maskrl.models import save_model
    from maskrl.prompt_card import save_prompt_card
    from maskrl.sampling import SamplerConfig
    from maskrl.tasks import get_task

    task = get_task("countdown")
    rule = SamplerConfig(gen_length=16, block_length=16, steps=8, temperature=0.0, schedule="dream",
                         remasking="entropy", top_k=50)
    out = save_model(tiny_dream(max_positions=1024), tmp_path / "model")
    save_prompt_card(out, task, False, rule)
    used = resolve_prompt_settings(out, "countdown")
    assert used["rule"]["from"] == "model card" and used["rule"]["value"]["schedule"] == "dream"
    run_harness(model=str(out), task_name="countdown", limit=3, out_dir=tmp_path / "eval", batch_size=3,
                progress=False)
    f = sorted((tmp_path / "eval").rglob("samples*.jsonl"))[0]
    cli = [json.loads(x)["completion"] for x in f.read_text().splitlines() if x.strip()]
    lm = get_model("maskrl")(pretrained=str(out), batch_size=3)
    rows = task.load()[:3]
    lmo = lm.generate_until([Instance("generate_until", {}, (ex.prompt, {"until": []}), i) for i, ex in enumerate(rows)])
    assert cli == lmo
    from maskrl.models import load

    live = run_harness(model=load(out), task_name="countdown", limit=3, out_dir=tmp_path / "live", batch_size=3,
                       progress=False, gen_lengths=16, block_length=16, steps=8,
                       rule={k: getattr(rule, k) for k in ("schedule", "remasking", "top_k")})
    f = sorted((tmp_path / "live").rglob("samples*.jsonl"))[0]  # an adapter has no card: the rule as an argument
    assert [json.loads(x)["completion"] for x in f.read_text().splitlines() if x.strip()] == cli
    with pytest.raises(ValueError, match="rule: colour are not decoding-rule fields"):
        run_harness(model=str(out), task_name="countdown", limit=1, out_dir=tmp_path / "bad", rule={"colour": 1})
    from maskrl.evaluate import describe_settings

    assert "decoding rule schedule dream, remasking entropy, top_k 50 (model card)" in describe_settings(used)
