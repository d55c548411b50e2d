"""Multi-process training on CPU (gloo): a 2-process ``optimize`` equals the 1-process one on the same
global batch, under DDP and under FSDP2, only the main process writes, and the sampler's rank hooks
keep ranks' forwards in step (the KV-cached sampler also on the FSDP2-sharded model); a resumed
2-process run equals the uninterrupted one, and a resume on another process count is a decision.

The processes are plain subprocesses with the ``torch.distributed`` environment variables set (what
``accelerate launch`` / ``torchrun`` set); the trainer's own ``Accelerator(cpu=True)`` starts the gloo
group. Worker code: ``tests/dist_worker.py``. Three 2-process launches serve every test of this file:
DDP (``multi``), FSDP2 (``fsdp``) and train / checkpoint / resume (``resume``). What N processes log
equals what one logs (the learning-rate schedule, the global batch's metrics): ``tests/logging_dist_worker.py``.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import WAIT_CAP_S
from maskrl.models import ModelAdapter
from maskrl.sampling import SamplerConfig, generate

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
WORLD = 2
#: per launch, and the workers' own collective timeout ($MASKRL_TEST_DIST_TIMEOUT): the cap of every
#: wait (conftest.WAIT_CAP_S), far above a real run, so that only a hang reaches it, however loaded
#: the machine (a rank that starts late only makes the others wait)
TIMEOUT_S = WAIT_CAP_S
#: the tests of a 2-process launch (minutes of CPU each): CI's slow stage (``make test-slow``)
SLOW = pytest.mark.slow


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"  # the same GEMM reduction order in every process
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["GLOO_SOCKET_IFNAME"] = "lo"  # single machine: loopback only, no hostname lookup
    env["MASKRL_TEST_DIST_TIMEOUT"] = str(TIMEOUT_S)
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Failures that can come from the shared machine rather than from maskrl: the port picked by
# _free_port taken by another program before rank 0 binds it, or a stalled rendezvous. Such a
# launch is retried once with a new port; any other failure, or a second one, fails the test.
# (The computation itself is deterministic: a real bug fails both attempts.)
_RENDEZVOUS_ERRORS = ("EADDRINUSE", "address already in use", "DistNetworkError", "DistStoreError",
                      "Connection refused", "Connection reset", "timed out", "Timed out")


def _run(procs: list[subprocess.Popen]) -> str | None:
    """Wait for the workers; ``None`` on success, else their combined output."""
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            outs.append(p.communicate()[0] + f"\n[killed after {TIMEOUT_S:.0f} s waiting for worker {p.args} to end: a hang]")
    outs += [p.communicate()[0] for p in procs[len(outs):]]
    if all(p.returncode == 0 for p in procs):
        return None
    return "\n".join(f"--- worker {p.args} (exit {p.returncode}):\n{out[-4000:]}" for p, out in zip(procs, outs))


WORKER = str(HERE / "dist_worker.py")
_KW = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _launch(mode: str, out: Path, worker: str = WORKER) -> None:
    """``worker MODE OUT`` (default ``dist_worker.py``) on :data:`WORLD` gloo processes (one retry on a
    rendezvous failure)."""
    for attempt in range(2):
        port = str(_free_port())
        failed = _run([subprocess.Popen([sys.executable, worker, mode, str(out)],
                                        env=_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(WORLD),
                                                 LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                                                 MASTER_PORT=port), **_KW)
                       for r in range(WORLD)])
        if failed is None:
            return
        (out / f"{mode}_attempt{attempt}.log").write_text(failed)
        if not any(e in failed for e in _RENDEZVOUS_ERRORS):
            break
    pytest.fail(f"2-process {mode} run failed:\n{failed}")


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    """The 1-process run (``OUT/batch.pt``, ``OUT/single.pt``) both 2-process launches compare with."""
    out = tmp_path_factory.mktemp("dist")
    failed = _run([subprocess.Popen([sys.executable, WORKER, "single", str(out)], env=_env(), **_KW)])
    assert failed is None, failed
    return out


@pytest.fixture(scope="module")
def run(single) -> Path:
    _launch("multi", single)
    return single


@pytest.fixture(scope="module")
def fsdp(single) -> Path:
    _launch("fsdp", single)
    return single


@pytest.fixture(scope="module")
def resume(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("resume")
    _launch("resume", out)
    return out


def _load(path: Path):
    return torch.load(path, weights_only=False)


@SLOW
def test_two_process_optimize_equals_single_process(run):
    single = _load(run / "single.pt")
    ranks = [_load(run / f"multi{r}.pt") for r in range(WORLD)]
    assert all("MULTI_CPU" in r["distributed_type"] for r in ranks)
    init, ref, got = single["init"], single["weights"], ranks[0]["weights"]
    assert ref.keys() == got.keys()
    diff = max((ref[k] - got[k]).abs().max().item() for k in ref)
    moved = max((ref[k] - init[k]).abs().max().item() for k in ref)
    print(f"2-process vs 1-process: max |Δw| = {diff:.3e} (update size max |w - w0| = {moved:.3e})")
    assert moved > 1e-4, "the update is too small for the comparison to mean anything"
    assert diff <= 2e-6, f"2-process weights differ from 1-process by {diff:.3e}"
    # the global gradient norm (before clipping; sensitive to a wrong normaliser scale, which Adam
    # would hide) is the same on every rank and equals the 1-process one
    for r in ranks:
        assert r["metrics"]["grad_norm"] == pytest.approx(single["metrics"]["grad_norm"], rel=1e-5)
        # every loss metric is the global batch's value on every rank (shares summed, then averaged
        # over processes), not this rank's share
        # (plus pad_forwards, multi-process only: equal shards here, so no dummy forward)
        assert r["metrics"].keys() == single["metrics"].keys() | {"pad_forwards"}
        assert r["metrics"]["pad_forwards"] == 0.0
        for k, v in single["metrics"].items():
            assert r["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-7), k


@SLOW
def test_only_main_process_writes_logs_and_checkpoint_files(run):
    # each rank logged and checkpointed into its own folder (same code path, different paths)
    main, other = run / "rank0", run / f"rank{WORLD - 1}"
    lines = (main / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1
    assert (main / "tb").is_dir()
    ck = main / "checkpoints" / "step_1"
    names = {p.name for p in ck.iterdir()}
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "trainer_state.pt", "random_states_0.pkl"} <= names
    # a non-main rank writes nothing but its own RNG state (accelerate saves one per process, for resume)
    written = sorted(str(p.relative_to(other)) for p in other.rglob("*") if p.is_file())
    assert written == [f"checkpoints/step_1/random_states_{WORLD - 1}.pkl"]


@SLOW
def test_a_signal_on_one_rank_stops_every_rank_after_the_same_step(run):
    import signal

    got = [_load(run / f"multi{r}.pt")["interrupt"] for r in range(WORLD)]
    assert all(g["step"] == g["start"] + 1 and g["signum"] == signal.SIGTERM for g in got), got
    assert (run / "interrupt" / "checkpoints" / f"step_{got[0]['step']}" / "trainer_state.pt").is_file()


@SLOW
def test_sampler_rank_sync_same_result_same_forward_count(run):
    ranks = [_load(run / f"multi{r}.pt") for r in range(WORLD)]
    # without the hook the ranks need different numbers of forwards (2 vs 8) ...
    assert ranks[0]["plain_calls"] == 2 and ranks[1]["plain_calls"] == 8
    # ... with it, both run the slowest rank's count, and the rollouts do not change
    assert [r["synced_calls"] for r in ranks] == [8, 8]
    for r in ranks:
        a, b = r["plain"], r["synced"]
        for field in ("completion_ids", "completion_mask", "commit_step", "commit_prob", "num_steps"):
            assert torch.equal(getattr(a, field), getattr(b, field)), field
    # the trainer's collect() hands the hook to the sampler; each rank called it equally often
    calls = [r["collect_all_done_calls"] for r in ranks]
    assert calls[0] > 0 and len(set(calls)) == 1


@SLOW
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_sampler_rank_sync_same_result_same_forward_count(run, cache):
    """The KV-cached sampler on 2 gloo processes: unequal decoder forwards without ``ranks_max``, equal
    with it (the slowest rank's), and the rollouts unchanged."""
    ranks = [_load(run / f"multi{r}.pt")["cached"][cache] for r in range(WORLD)]
    assert ranks[0]["plain_calls"] < ranks[1]["plain_calls"]
    assert [r["synced_calls"] for r in ranks] == [ranks[1]["synced_calls"]] * WORLD
    assert ranks[1]["synced_calls"] == ranks[1]["plain_calls"]  # the slowest rank pads nothing
    for r in ranks:
        a, b = r["plain"], r["synced"]
        for field in ("completion_ids", "completion_mask", "commit_step", "commit_prob", "num_steps"):
            assert torch.equal(getattr(a, field), getattr(b, field)), field


@SLOW
def test_fsdp2_optimize_equals_single_process(fsdp):
    """The trainer's model under FSDP2 (accelerate's ``fsdp2_prepare_model`` on 2 gloo processes: every
    decoder layer, the embedding, the tail and the root sharded): one ``optimize`` on each rank's half
    of the batch gives the 1-process update; float32, so the gathered weights agree to rounding."""
    single = _load(fsdp / "single.pt")
    ranks = [_load(fsdp / f"fsdp{r}.pt") for r in range(WORLD)]
    assert all(r["model_class"].startswith("FSDP") for r in ranks)  # fully_shard's class swap
    assert all(r["distributed_type"].endswith("FSDP") for r in ranks)  # still FSDP after the trainer's prepare
    assert set(ranks[0]["sharded"]) == {"", "model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm",
                                        "lm_head"}
    ref, got, init = single["weights"], ranks[0]["weights"], single["init"]
    assert ref.keys() == got.keys()
    diff = max((ref[k] - got[k]).abs().max().item() for k in ref)
    moved = max((ref[k] - init[k]).abs().max().item() for k in ref)
    assert moved > 1e-4 and diff <= 2e-6, (diff, moved)
    for r in ranks:
        assert r["metrics"]["grad_norm"] == pytest.approx(single["metrics"]["grad_norm"], rel=1e-5)


@SLOW
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_sampler_under_fsdp2_runs_equal_forwards(fsdp, cache):
    """Issue 21 §4: the KV-cached sampler on the FSDP2-sharded model (each forward all-gathers the
    layers' shards, a collective) finishes on 2 processes that need different numbers of forwards:
    both run the slowest rank's count, and each rank's rollout is the one an unsharded copy of the
    same weights samples without the hook."""
    ranks = [_load(fsdp / f"fsdp{r}.pt")["cached"][cache] for r in range(WORLD)]
    assert ranks[0]["plain_calls"] < ranks[1]["plain_calls"]
    assert [r["synced_calls"] for r in ranks] == [ranks[1]["plain_calls"]] * WORLD
    for r in ranks:
        a, b = r["plain"], r["synced"]
        for field in ("completion_ids", "completion_mask", "commit_step", "num_steps"):
            assert torch.equal(getattr(a, field), getattr(b, field)), field
        torch.testing.assert_close(a.commit_prob, b.commit_prob, rtol=1e-5, atol=1e-6)  # float32 all-gathered weights


@SLOW
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_sampler_first_forward_of_a_sharded_lora_model(fsdp, cache):
    """A peft model as the 8B recipes build theirs (bf16 base, fp32 LoRA) under FSDP2, whose first forward
    is the KV-cached sampler's: the LoRA tensors sharded (float32, half the rows on each rank), the final
    norm left in the root unit by accelerate's wrap, and still the rollouts of an unsharded copy with
    the slowest rank's forward count on both ranks. (The cached path calls the decoder and the output
    layer itself; before it entered through the model's own forward, the root's pre-forward never ran:
    the first call made a sub-module's unit a root and the root-held norm stayed sharded.)"""
    ranks = [_load(fsdp / f"fsdp{r}.pt")["lora"] for r in range(WORLD)]
    for r in ranks:
        assert "base_model.model.model.layers.0" in r["units"]
        assert "base_model.model.model.norm.weight" in r["root_params"]  # the case the root's forward must gather
        assert r["lora_shards"] and all(local[0] == -(-full[0] // WORLD) and dt == torch.float32
                                        for full, local, dt in r["lora_shards"])
    got = [r["cached"][cache] for r in ranks]
    assert got[0]["plain_calls"] < got[1]["plain_calls"]
    assert [g["synced_calls"] for g in got] == [got[1]["plain_calls"]] * WORLD
    for g in got:
        for field in ("completion_ids", "completion_mask", "commit_step", "num_steps"):
            assert torch.equal(getattr(g["plain"], field), getattr(g["synced"], field)), field
        torch.testing.assert_close(g["plain"].commit_prob, g["synced"].commit_prob, rtol=0, atol=0)


@SLOW
def test_two_process_resume_equals_the_uninterrupted_run(resume):
    """3 steps on 2 processes, against 1 step, a checkpoint and a new trainer resuming for steps 2-3:
    on each rank the same prompts, completions and metrics, bit for bit, and the same weights."""
    for r in range(WORLD):
        got = _load(resume / f"resume{r}.pt")
        full, res = got["full"], got["resumed"]
        assert len(full["prompts"]) == 3 and len(res["prompts"]) == 2
        assert res["prompts"] == full["prompts"][1:]
        assert all(torch.equal(a, b) for a, b in zip(res["completions"], full["completions"][1:]))
        assert res["metrics"] == full["metrics"][1:]  # exact: every float
        assert full["weights"].keys() == res["weights"].keys()
        assert all(torch.equal(full["weights"][k], res["weights"][k]) for k in full["weights"])
        assert any(not torch.equal(full["weights"][k], got["init"][k]) for k in full["weights"])  # it trained
    main = _load(resume / "resume0.pt")
    assert [m["step"] for m in main["resumed"]["metrics_jsonl"]] == [1, 2, 3]  # step 1 from before the stop
    assert main["resumed"]["metrics_jsonl"] == main["full"]["metrics_jsonl"]


@SLOW
def test_after_a_two_process_resume_each_rank_draws_its_own_prompts(resume):
    """Each rank's prompt and sampler streams are checkpointed as its own: after the resume the ranks
    do not draw the same prompts and completions (they did when every rank loaded process 0's)."""
    ranks = [_load(resume / f"resume{r}.pt") for r in range(WORLD)]
    for run in ("full", "resumed"):
        for a, b in zip(ranks[0][run]["prompts"], ranks[1][run]["prompts"]):
            assert a != b, (run, a, b)
        for a, b in zip(ranks[0][run]["completions"], ranks[1][run]["completions"]):
            assert not torch.equal(a, b), run
    state = torch.load(Path(ranks[0]["checkpoint"]) / "trainer_state.pt", weights_only=False)
    assert state["num_processes"] == WORLD and len(state["streams"]) == WORLD
    assert not torch.equal(state["streams"][0]["data_gen"], state["streams"][1]["data_gen"])
    assert torch.equal(state["data_gen"], state["streams"][0]["data_gen"])  # process 0's, as earlier versions read


@SLOW
def test_a_checkpoint_without_streams_per_process_resumes_process_0_and_re_derives_the_others(resume):
    """The layout of earlier maskrl versions (process 0's streams only, no process count): process 0
    resumes its streams exactly; process 1 draws from a stream of its own, not process 0's."""
    ranks = [_load(resume / f"resume{r}.pt") for r in range(WORLD)]
    assert ranks[0]["legacy_prompts"] == ranks[0]["full"]["prompts"][1:2]
    assert ranks[1]["legacy_prompts"] != ranks[0]["legacy_prompts"]
    assert ranks[1]["legacy_prompts"] != ranks[1]["full"]["prompts"][:1]  # nor its own first draw again


@SLOW
def test_resuming_on_another_process_count_is_refused_unless_forced(resume, tmp_path, caplog):
    """The 2-process checkpoint on 1 process: refused, naming both process counts and global batches;
    with ``force`` it resumes process 0's streams, with a warning."""
    import logging

    from dist_worker import resume_trainer
    from maskrl.trainer import ProcessCountError

    ckpt = Path(_load(resume / "resume0.pt")["checkpoint"])
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    tr = resume_trainer(tmp_path / "one")
    with pytest.raises(ProcessCountError, match=r"process count 2 -> 1: the global batch \(train.prompts_per_step x "
                                                r"processes\) 2 x 2 = 4 -> 2 x 1 = 2 prompts per step"):
        tr.load_checkpoint(ckpt)
    assert tr.step_count == 0
    with caplog.at_level(logging.WARNING, logger="maskrl.trainer"):
        tr.load_checkpoint(ckpt, force=True)
    assert tr.step_count == 1 and "forced: process count 2 -> 1" in caplog.text
    assert torch.equal(tr.data_gen.get_state(), state["streams"][0]["data_gen"])
    assert torch.equal(tr.rollout_gen.get_state(), state["streams"][0]["rollout_gen"])
    tr.close()


class _Counting(torch.nn.Module):
    """Tiny deterministic LM (random fixed weights) counting its forwards."""

    def __init__(self, vocab: int = 12) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g) * 3)
        self.calls = 0

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
        self.calls += 1
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.emb[input_ids] + self.emb[input_ids.roll(1, 1)])


@pytest.mark.parametrize("cfg_scale", [0.0, 1.5])
def test_all_done_hook_single_process(cfg_scale):
    """Other ranks that need 3 more loop iterations: dummy forwards only, the rollout is unchanged."""
    model = _Counting()
    adapter = ModelAdapter(model=model, mask_id=3, eos_id=2, pad_id=0)
    ids = torch.tensor([[5, 6, 7], [0, 8, 9]])
    mask = ids != 0
    cfg = SamplerConfig(gen_length=8, block_length=4, schedule="threshold", threshold=0.5, cfg_scale=cfg_scale)
    gen = torch.Generator().manual_seed(1)
    plain = generate(adapter, ids, mask, cfg, generator=gen)
    plain_calls, model.calls = model.calls, 0
    seen: list[bool] = []

    def others_need_three_more(finished: bool) -> bool:
        seen.append(finished)
        return finished and seen.count(True) > 3

    gen = torch.Generator().manual_seed(1)
    synced = generate(adapter, ids, mask, cfg, generator=gen, all_done=others_need_three_more)
    per_step = 2 if cfg_scale > 0 else 1
    assert model.calls == plain_calls + 3 * per_step
    assert seen.count(False) == plain_calls // per_step and seen.count(True) == 4
    for field in ("completion_ids", "commit_step", "commit_prob", "num_steps"):
        assert torch.equal(getattr(plain, field), getattr(synced, field)), field


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_ranks_max_hook_single_process(cache):
    """The cached sampler's counts are its real forwards (with an observer asking outside the windows:
    the extra full forward); other ranks needing more: dummy forwards of one row, the rollout unchanged."""
    from maskrl.credit.dps import DPS
    from maskrl.models import build_tiny

    adapter = build_tiny(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, seed=0)
    calls, heads = [], []
    adapter.model.get_decoder().register_forward_pre_hook(lambda *_: calls.append(1))
    # every output-layer call, as FSDP sees them (each decoder forward also runs the layer on zero positions:
    # ModelAdapter._decoder_hidden enters through the model's own forward; with observers a step's own
    # output layer is split in two calls, the second possibly on zero positions: Denoising.head_calls)
    adapter.model.get_output_embeddings().register_forward_hook(lambda *_: heads.append(1))
    ids = torch.tensor([[5, 6, 7], [7, 6, 5]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    cfg = SamplerConfig(gen_length=8, block_length=4, schedule="threshold", threshold=0.5, cache=cache)

    def run(hook):
        gen = torch.Generator().manual_seed(0)
        calls.clear(), heads.clear()
        obs = DPS(dps_scope="all").observers(cfg, torch.Generator().manual_seed(1))
        return generate(adapter, ids, mask, cfg, generator=gen, observers=obs, all_done=lambda f: f, ranks_max=hook)

    sent = []
    own = run(lambda v: sent.append(list(v)) or list(v))
    n_calls, n_heads = len(calls), len(heads)
    assert sent[-1] == [0, 0, 0] and all(b == 1 for b, *_ in sent[:-1])  # the last call: no rows left
    assert n_calls == sum(d + e for _, d, e in sent) and n_heads == sum(d + 2 + 2 * e for _, d, e in sent[:-1])
    # DPS reads exact logits (and, under dual, asks beyond the block window): extra full forwards
    assert any(e for *_, e in sent)
    def others(v):  # another rank: busy 4 iterations longer, 3 decoder forwards and an extra each time
        sent.append(list(v))
        o = [1, 3, 1] if len(sent) <= len(own_sent) - 1 + 4 else [0, 0, 0]
        return [max(a, b) for a, b in zip(v, o)]

    own_sent, sent = sent, []
    synced = run(others)
    for field in ("completion_ids", "completion_mask", "commit_step", "commit_prob", "num_steps"):
        assert torch.equal(getattr(own, field), getattr(synced, field)), field
    iters = len(own_sent) - 1 + 4
    assert len(sent) == iters + 1  # the last call finds no rank busy
    # every iteration: 3 + 1 decoders (each with its zero-row output layer), the step's 2 output-layer calls
    # and the extra forward's one: what a decoding rank runs, so FSDP's collectives stay in step
    assert len(calls) == 4 * iters and len(heads) == 7 * iters


# ------------------------------------------------------------------ N processes log what one process logs
LOG_WORKER = str(HERE / "logging_dist_worker.py")


@pytest.fixture(scope="module")
def lr_runs(tmp_path_factory) -> Path:
    """Every schedule's short run on one process (``lr_single.pt``) and on 2 gloo processes (``lr{r}.pt``)."""
    out = tmp_path_factory.mktemp("lr")
    failed = _run([subprocess.Popen([sys.executable, LOG_WORKER, "lr", str(out)], env=_env(), **_KW)])
    assert failed is None, failed
    _launch("lr", out, LOG_WORKER)
    return out


def test_two_processes_follow_the_one_process_learning_rate_schedule(lr_runs):
    """Issue 50 §1: the schedule counts optimizer steps, which the processes take together; under 2
    processes accelerate's scheduler wrapper stepped it twice per step (linear: [1e-4, 5e-5, 0, 0]).
    Every schedule, with and without warmup, logs the 1-process rates on every rank, and ends on the
    same rate."""
    from logging_dist_worker import SCHEDULES

    single = _load(lr_runs / "lr_single.pt")
    assert set(single) == set(SCHEDULES)
    for r in range(WORLD):
        got = _load(lr_runs / f"lr{r}.pt")
        for key in SCHEDULES:
            assert got[key] == single[key], (r, key, got[key], single[key])
    # the cases by hand: linear over 4 steps of lr 1e-4 (warmup 0, μ 1: 4 optimizer steps;
    # warmup 1 step, μ 2: rate s/2 for optimizer step s < 2, then (8 - s)/6, logged at s = 0, 2, 4, 6)
    assert single[("linear", 0, 1)]["logged"] == pytest.approx([1e-4, 7.5e-5, 5e-5, 2.5e-5], rel=1e-12)
    assert single[("linear", 1, 2)]["logged"] == pytest.approx([0.0, 1e-4, 1e-4 * 4 / 6, 1e-4 * 2 / 6], rel=1e-12)
    assert single[("linear", 1, 2)]["after"] == pytest.approx(0.0, abs=1e-20)
    assert single[("constant_with_warmup", 1, 2)]["logged"] == pytest.approx([0.0, 1e-4, 1e-4, 1e-4], rel=1e-12)


@pytest.fixture(scope="module")
def batch_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("batch")
    _launch("batch", out, LOG_WORKER)
    return out


@pytest.mark.numerics
def test_batch_metrics_describe_the_global_batch(batch_run):
    """Issue 50 §1: rewards all 0 on rank 0 and alternating on rank 1: ``informative_groups`` is the
    global 0.5 (rank 0 alone: 0.0), and every metric of the batch (``completion_tokens``, the rollout
    diagnostics, ``rollout/mismatch``) equals the single-process function on the two ranks' rows
    together; every logged number but the wall-clock ones is the same on both ranks."""
    from maskrl.advantages import informative_groups
    from maskrl.health import rollout_diagnostics

    ranks = [_load(batch_run / f"batch{r}.pt") for r in range(WORLD)]
    assert informative_groups(ranks[0]["rewards"], ranks[0]["group_ids"]) == 0.0
    assert informative_groups(ranks[1]["rewards"], ranks[1]["group_ids"]) == 1.0
    cat = {k: torch.cat([r[k] for r in ranks]) for k in ("completion_ids", "completion_mask", "commit_prob", "rewards")}
    groups = torch.cat([r["group_ids"] + 100 * i for i, r in enumerate(ranks)])  # each rank's groups are its own
    want = rollout_diagnostics(cat["completion_ids"], cat["completion_mask"], cat["commit_prob"])
    want["informative_groups"] = informative_groups(cat["rewards"], groups)
    want["completion_tokens"] = cat["completion_mask"].sum(-1).float().mean().item()
    assert want["informative_groups"] == 0.5
    logged = ranks[0]["jsonl"][0]
    eps = torch.finfo(torch.float32).eps
    for k, v in want.items():  # float32 commit_prob logs summed per rank vs over all rows: rounding only
        assert logged[k] == pytest.approx(v, rel=16 * eps, abs=16 * eps), k
    # rollout/mismatch: the mean over both ranks' committed tokens
    (m0,), (m1,) = (r["mismatch"] for r in ranks)
    assert m0["tokens"] > 0 and m1["tokens"] > 0 and m0["mismatch"] != m1["mismatch"]
    want_mismatch = (m0["mismatch"] * m0["tokens"] + m1["mismatch"] * m1["tokens"]) / (m0["tokens"] + m1["tokens"])
    assert logged["rollout/mismatch"] == pytest.approx(want_mismatch, rel=1e-12)
    stable = [{k: v for k, v in r["metrics"].items() if "seconds" not in k} for r in ranks]
    assert stable[0] == stable[1]
    assert stable[0] == {k: v for k, v in logged.items() if "seconds" not in k}
