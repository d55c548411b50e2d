"""lm-evaluation-harness model `maskrl` (issue 23), offline: a local task YAML over a local JSONL made from
../shared/data, run through `lm_eval.simple_evaluate` with a `TaskManager(include_path=...)` on the tiny
model. Parity: the same model, rows and sampler settings give the same completions (greedy) and the same
accuracy through lm-eval as through `maskrl eval`."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")

from maskrl.models import build_tiny, save_model  # noqa: E402
from maskrl.pipeline import save_prompt_card  # noqa: E402
from maskrl.sampling import SamplerConfig  # noqa: E402
from maskrl.sft import run_sft  # noqa: E402
from maskrl.tasks import default_data_dir, get_task  # noqa: E402

TASKS = Path(__file__).parent / "lm_eval_tasks"
N_ROWS = 12


def _rows():
    root = default_data_dir()
    if root is None or not (root / "sudoku4x4" / "4x4_test_sudoku.csv").is_file():
        pytest.skip("no ../shared/data/sudoku4x4")
    with open(root / "sudoku4x4" / "4x4_test_sudoku.csv", newline="") as fh:
        return list(csv.DictReader(fh))[:N_ROWS]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm_eval")
    rows = _rows()
    with open(tmp / "rows.csv", "w", newline="") as fh:  # maskrl eval's Sudoku reader
        w = csv.DictWriter(fh, fieldnames=["Puzzle", "Solution"])
        w.writeheader()
        w.writerows(rows)
    (tmp / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # lm-eval's
    tasks = tmp / "tasks"
    tasks.mkdir()
    shutil.copy(TASKS / "maskrl_sudoku_utils.py", tasks)
    (tasks / "maskrl_sudoku_parity.yaml").write_text(
        (TASKS / "maskrl_sudoku_parity.yaml").read_text().replace("PLACEHOLDER", str(tmp / "rows.jsonl")))
    task = get_task("sudoku4x4", "{puzzle}=")
    model = build_tiny(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=3)
    # a short SFT (~3 s): digits, different for each puzzle, partly right -- a comparison that can fail
    run_sft(model, task.generate(256, seed=2), task.target, gen_length=16, steps=80, batch_size=32, lr=3e-3,
            warmup_steps=5, weight_decay=0.0, max_grad_norm=1.0, seed=0, log_every=1000, progress=False)
    folder = save_model(model, tmp / "model")
    save_prompt_card(folder, task, False,
                     SamplerConfig(gen_length=16, block_length=8, steps=8))
    return tmp, folder


def _lm_eval(tmp, folder, **args):
    import maskrl.lm_eval_model  # noqa: F401  (registers model "maskrl")
    from lm_eval.tasks import TaskManager

    model_args = ",".join([f"pretrained={folder}", "batch_size=5", *[f"{k}={v}" for k, v in args.items()]])
    return lm_eval.simple_evaluate(model="maskrl", model_args=model_args, tasks=["maskrl_sudoku_parity"],
                                   task_manager=TaskManager(include_path=str(tmp / "tasks"), include_defaults=False),
                                   log_samples=True)


def test_lm_eval_parity_with_maskrl_eval(setup):
    from maskrl.evaluate import run_harness

    tmp, folder = setup
    out = _lm_eval(tmp, folder)
    res = out["results"]["maskrl_sudoku_parity"]
    samples = sorted(out["samples"]["maskrl_sudoku_parity"], key=lambda s: s["doc_id"])
    got = [s["resps"][0][0] for s in samples]

    summary = run_harness(model=str(folder), task_name="sudoku4x4", data_path=str(tmp / "rows.csv"),
                          out_dir=str(tmp / "maskrl_eval"), batch_size=5, device="cpu", progress=False)
    (r,) = summary["results"]
    want = [json.loads(x)["completion"] for x in (tmp / "maskrl_eval" / r["samples"]).read_text().splitlines()]
    assert len(got) == len(want) == N_ROWS
    assert got == want  # the same greedy completions, row by row
    assert len(set(got)) > N_ROWS // 2  # and they are not all alike (the comparison can fail)
    assert res["acc,none"] == pytest.approx(r["accuracy"])
    assert res["cell_acc,none"] == pytest.approx(r["cell_accuracy"]) and r["cell_accuracy"] > 0


def test_sampler_settings_are_model_args_and_stop_strings_cut(setup):
    from maskrl.lm_eval_model import MaskrlLM, cut_at_stops

    _, folder = setup
    lm = MaskrlLM(pretrained=str(folder))  # the prompt card's sampler by default
    assert (lm.sampler.gen_length, lm.sampler.block_length, lm.sampler.steps) == (16, 8, 8)
    assert lm.use_chat_template is False  # from the card, not from the path
    lm = MaskrlLM(pretrained=str(folder), gen_length="32", block_length="16", schedule="threshold", threshold="0.7",
                  cache="prefix", temperature="0.5", chat_template="true")
    s = lm.sampler
    assert (s.gen_length, s.block_length, s.steps, s.schedule, s.threshold, s.cache, s.temperature) == \
        (32, 16, 16, "threshold", 0.7, "prefix", 0.5)
    assert lm.use_chat_template is True
    with pytest.raises(ValueError, match="unknown key"):
        MaskrlLM(pretrained=str(folder), gen_lenght=8)
    with pytest.raises(ValueError, match="block_length"):
        MaskrlLM(pretrained=str(folder), gen_length=12, block_length=8)
    assert cut_at_stops("12343\n\nmore", ["\n\n", "4"]) == "123"
    assert cut_at_stops("1234", []) == "1234"

    from lm_eval.api.instance import Instance

    lm = MaskrlLM(pretrained=str(folder))
    reqs = [Instance("generate_until", {}, ("0000111122223333=", {"until": [u]}), 0) for u in ("zz", "1")]
    full, cut = lm.generate_until(reqs)
    assert "1" in full and cut == full[:full.index("1")]
    with pytest.warns(UserWarning, match="generation_kwargs max_gen_toks, temperature are not used"):
        lm.generate_until([Instance("generate_until", {}, ("0=", {"until": [], "temperature": 0.7,
                                                                  "max_gen_toks": 9}), 0)])


def test_loglikelihood_is_the_elbo_and_rolling_is_a_clear_error(setup):
    from lm_eval.api.instance import Instance

    from maskrl.likelihood.elbo import elbo
    from maskrl.lm_eval_model import MaskrlLM, request_seed
    from maskrl.models import load
    from maskrl.text import encode_prompts
    from maskrl.types import Rollout

    _, folder = setup
    lm = MaskrlLM(pretrained=str(folder), elbo_nodes=2, elbo_draws=3, seed=1)
    reqs = [Instance("loglikelihood", {}, (c, x), i) for i, (c, x) in
            enumerate([("0120=", "12"), ("3333=", "1234"), ("0=", "21")])]
    out = lm.loglikelihood(reqs)
    assert [type(v) for v in out[0]] == [float, bool]
    # reference: the library's estimator on request 1 alone, with its generator
    a = load(folder)
    ids, mask = encode_prompts(a.tokenizer, ["3333="])
    comp = torch.tensor([a.tokenizer("1234", add_special_tokens=False)["input_ids"]])
    ro = Rollout(ids, mask, comp, torch.ones_like(comp, dtype=torch.bool), torch.zeros_like(comp),
                 torch.ones(comp.shape), torch.ones(1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    with torch.no_grad():
        seed = request_seed(1, ids[0].tolist(), comp[0].tolist())
        ref = elbo(a, ro, torch.Generator().manual_seed(seed), nodes=2, draws=3).sum().item()
    assert out[1][0] == pytest.approx(ref, rel=1e-5)
    assert out[1][0] < 0 and out == lm.loglikelihood(reqs)  # a log-probability bound; reproducible
    with pytest.raises(NotImplementedError, match="loglikelihood_rolling"):
        lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, ("1234",), 0)])


@pytest.mark.slow
@pytest.mark.slow  # minutes of CPU: CI's slow stage (make test-slow)
def test_two_processes_through_accelerate_give_the_same_completions(setup):
    """lm-eval splits the requests by rank / world_size and gathers them through the model (accelerate)."""
    import subprocess
    import sys

    from test_distributed import _RENDEZVOUS_ERRORS, _env, _free_port, _run

    from maskrl.evaluate import run_harness

    tmp, folder = setup
    out = tmp / "two"
    out.mkdir()
    worker = str(Path(__file__).parent / "lm_eval_dist_worker.py")
    for attempt in range(2):
        port = str(_free_port())
        procs = [subprocess.Popen([sys.executable, worker, str(folder), str(tmp / "tasks"), str(out)],
                                  env=_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                                           MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
        failed = _run(procs)
        if failed is None or attempt == 1 or not any(e in failed for e in _RENDEZVOUS_ERRORS):
            break
    assert failed is None, failed
    got = json.loads((out / "rank0.json").read_text())
    summary = run_harness(model=str(folder), task_name="sudoku4x4", data_path=str(tmp / "rows.csv"),
                          out_dir=str(tmp / "maskrl_eval_two"), batch_size=5, device="cpu", progress=False)
    (r,) = summary["results"]
    want = [json.loads(x)["completion"] for x in (tmp / "maskrl_eval_two" / r["samples"]).read_text().splitlines()]
    assert got["completions"] == want
    assert got["cell_acc"] == pytest.approx(r["cell_accuracy"])


# ---------------------------------------------------------------- what lm-eval's own models give
CHAT = "{% for m in messages %}[U]{{ m['content'] }}[/U]{% endfor %}{% if add_generation_prompt %}[A]{% endif %}"
CORPUS = ["The capital of France is Paris.", "Paris is the capital of France.", "Is it Paris? It is Paris.",
          "Q: 1+1=\nA: 2", "[U]1+1=[/U][A]2"]


def bpe_tokenizer(bos: bool = False, chat_template: str | None = None):
    """A byte-level BPE tokenizer (GPT-2 / Qwen2 style: 'Ġ' marks a leading space), trained here on a
    few sentences; Qwen2 / Dream have no bos token (``bos=False``), LLaDA has one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|mask|>", "<|pad|>"] + (["<|bos|>"] if bos else [])
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(CORPUS * 20, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>", pad_token="<|pad|>",
                                  mask_token="<|mask|>", bos_token="<|bos|>" if bos else None)
    if chat_template:
        tok.chat_template = chat_template
    return tok


@pytest.fixture(scope="module")
def bpe_models(tmp_path_factory):
    """``{(bos, chat): folder}``: tiny models with a byte-level BPE tokenizer, saved as maskrl folders."""
    tmp = tmp_path_factory.mktemp("bpe")
    out = {}
    for bos, chat in [(False, False), (True, False), (False, True)]:
        tok = bpe_tokenizer(bos, CHAT if chat else None)
        model = build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=32, seed=4, tokenizer=tok)
        out[bos, chat] = save_model(model, tmp / f"bos{int(bos)}_chat{int(chat)}")
    return out


def _tokens(lm, ids):
    return lm.adapter.tokenizer.convert_ids_to_tokens(ids)


def _elbo_ref(folder, ctx_ids, cont_ids, seed, nodes, draws):
    """The library's ELBO estimator on one (context ids, continuation ids) row, with the generator
    MaskrlLM seeds for that request (:func:`~maskrl.lm_eval_model.request_seed`)."""
    from maskrl.likelihood.elbo import elbo
    from maskrl.lm_eval_model import request_seed
    from maskrl.models import load
    from maskrl.types import Rollout

    a = load(folder)
    ids, comp = torch.tensor([ctx_ids]), torch.tensor([cont_ids])
    ro = Rollout(ids, torch.ones_like(ids, dtype=torch.bool), comp, torch.ones_like(comp, dtype=torch.bool),
                 torch.zeros_like(comp), torch.ones(comp.shape), torch.ones(1, dtype=torch.long),
                 torch.zeros(1, dtype=torch.long))
    with torch.no_grad():
        gen = torch.Generator().manual_seed(request_seed(seed, ctx_ids, cont_ids))
        return elbo(a, ro, gen, nodes=nodes, draws=draws).sum().item()


@pytest.mark.parametrize("context, continuation", [("The capital of France is ", "Paris"),
                                                   ("Q: 1+1=\nA: ", "2"), ("Is it Paris? It is  ", "Paris.")])
def test_loglikelihood_moves_trailing_whitespace_into_the_continuation(bpe_models, context, continuation):
    from lm_eval.api.instance import Instance

    from maskrl.lm_eval_model import MaskrlLM

    folder = bpe_models[False, False]
    lm = MaskrlLM(pretrained=str(folder), elbo_nodes=2, elbo_draws=2)
    tok = lm.adapter.tokenizer
    stripped = context.rstrip()
    moved = context[len(stripped):] + continuation
    ctx, cont = lm.encode_pair(context, continuation)
    # lm-eval's rule, by hand: the context without its trailing whitespace; the continuation is what
    # the whole text tokenises to after the context's tokens
    want_ctx = tok(stripped, add_special_tokens=False)["input_ids"]
    whole = tok(stripped + moved, add_special_tokens=False)["input_ids"]
    assert (ctx, cont) == (want_ctx, whole[len(want_ctx):])
    assert lm.encode_pair(stripped, moved) == (ctx, cont)  # both ways of writing the request agree
    assert _tokens(lm, cont)[0].startswith("Ġ")  # the word keeps its leading-space token
    if context.startswith("The capital"):
        assert _tokens(lm, cont) == ["ĠParis"] and _tokens(lm, tok(" Paris", add_special_tokens=False)["input_ids"]) == ["ĠParis"]
    (a,), (b,) = (lm.loglikelihood([Instance("loglikelihood", {}, req, 0)]) for req in
                  [(context, continuation), (stripped, moved)])
    assert a == b
    assert a[0] == pytest.approx(_elbo_ref(folder, ctx, cont, 0, 2, 2), rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("bos", [False, True])
def test_empty_context_is_scored_after_the_prefix_token(bpe_models, bos):
    from lm_eval.api.instance import Instance

    from maskrl.lm_eval_model import MaskrlLM

    folder = bpe_models[bos, False]
    lm = MaskrlLM(pretrained=str(folder), elbo_nodes=2, elbo_draws=2)
    tok = lm.adapter.tokenizer
    assert (tok.bos_token_id is None) is (not bos)
    prefix = tok.bos_token_id if bos else tok.eos_token_id  # lm-eval's hf model: bos, else eos
    assert lm.prefix_token_id == prefix
    paris = tok("Paris", add_special_tokens=False)["input_ids"]
    assert lm.encode_pair("", "Paris") == ([prefix], paris)
    assert lm.encode_pair(" ", "Paris") == ([prefix], tok(" Paris", add_special_tokens=False)["input_ids"])
    first = tok.convert_ids_to_tokens(prefix)
    assert lm.encode_pair("", first + "Paris") == ([prefix], paris)  # a continuation opening with it
    reqs = [Instance("loglikelihood", {}, ("", "Paris"), 0), Instance("loglikelihood", {}, ("The capital of", " France"), 1)]
    (ll, greedy), _ = lm.loglikelihood(reqs)
    assert ll < 0 and isinstance(greedy, bool)
    assert ll == pytest.approx(_elbo_ref(folder, [prefix], paris, 0, 2, 2), rel=1e-5, abs=1e-5)
    other = MaskrlLM(pretrained=str(folder), prefix_token_id=tok.pad_token_id)
    assert other.encode_pair("", "Paris") == ([tok.pad_token_id], paris)


@pytest.mark.parametrize("bos", [False, True])
def test_empty_context_is_generated_after_the_prefix_token(bpe_models, bos):
    """generate_until with an empty context (lm-eval's contract: handled, not an error). Without bos
    (Qwen2 / Dream) the context tokenises to nothing and is ``[eos]``, the loglikelihood prefix; with
    bos it is ``[bos]`` as before. The completion equals the sampler's on that one-token prompt, and
    the non-empty context in the same batch is unchanged."""
    from lm_eval.api.instance import Instance

    from maskrl.lm_eval_model import MaskrlLM
    from maskrl.sampling import generate
    from maskrl.text import decode_completions, encode_prompts

    folder = bpe_models[bos, False]
    lm = MaskrlLM(pretrained=str(folder), gen_length=8, block_length=8, steps=4, batch_size=2)
    tok, a = lm.adapter.tokenizer, lm.adapter
    prefix = tok.bos_token_id if bos else tok.eos_token_id
    assert lm.prefix_token_id == prefix and (tok("", add_special_tokens=False)["input_ids"] == [])
    if not bos:  # the fault: an empty prompt on a tokenizer without bos has no tokens
        with pytest.raises(ValueError, match="prompt 0 .* tokenises to no tokens"):
            encode_prompts(tok, [""])
    reqs = [Instance("generate_until", {}, ("", {"until": []}), 0),
            Instance("generate_until", {}, ("The capital of", {"until": []}), 1)]
    empty, other = lm.generate_until(reqs)

    def alone(ids):
        ids = torch.tensor([ids])
        r = generate(a, ids, torch.ones_like(ids, dtype=torch.bool), lm.sampler)
        return decode_completions(tok, r.completion_ids, r.completion_mask)[0]

    assert empty == alone([prefix])
    assert other == alone(tok(("<|bos|>" if bos else "") + "The capital of", add_special_tokens=False)["input_ids"])
    assert lm.generate_until(reqs[:1]) == [empty]  # an all-empty batch too
    ids, mask = encode_prompts(tok, ["", "The capital of"], empty_id=prefix)
    assert ids[0, -1].item() == prefix and mask[0].sum().item() == 1


def _chat_task(tmp):
    rows = [{"q": "1+1=", "a": "2"}, {"q": "The capital of France is", "a": "Paris"}]
    (tmp / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = tmp / "chat_tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / "maskrl_chat_once.yaml").write_text(
        "task: maskrl_chat_once\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tmp / 'rows.jsonl'}\n"
        "test_split: test\noutput_type: generate_until\ndoc_to_text: \"{{q}}\"\ndoc_to_target: \"{{a}}\"\n"
        "generation_kwargs:\n  until: [\"<|endoftext|>\"]\nmetric_list:\n  - metric: exact_match\n")
    return tasks


@pytest.mark.parametrize("explicit", [None, "true"])
def test_lm_evals_apply_chat_template_templates_once(bpe_models, tmp_path, monkeypatch, explicit):
    import warnings

    import maskrl.evaluate
    from lm_eval.tasks import TaskManager

    from maskrl.lm_eval_model import MaskrlLM

    folder = bpe_models[False, True]
    lm = MaskrlLM(pretrained=str(folder), gen_length=8, block_length=8, steps=4, batch_size=2,
                  **({} if explicit is None else {"chat_template": explicit}))
    assert lm.use_chat_template and lm.model_input("1+1=") == "[U]1+1=[/U][A]"  # maskrl's own template alone
    seen: list[str] = []
    real = maskrl.evaluate.complete

    def record(adapter, prompts, *args, **kwargs):
        seen.extend(prompts)
        return real(adapter, prompts, *args, **kwargs)

    monkeypatch.setattr(maskrl.evaluate, "complete", record)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = lm_eval.simple_evaluate(model=lm, tasks=["maskrl_chat_once"], apply_chat_template=True, log_samples=True,
                                      task_manager=TaskManager(include_path=str(_chat_task(tmp_path)),
                                                               include_defaults=False))
    assert lm.harness_templates
    assert sorted(seen) == ["[U]1+1=[/U][A]", "[U]The capital of France is[/U][A]"]  # once, not twice
    samples = out["samples"]["maskrl_chat_once"]
    assert sorted(s["arguments"][0][0] for s in samples) == sorted(seen)  # exactly what lm-eval built
    said = [str(w.message) for w in caught if "applied once" in str(w.message)]
    assert len(said) == (1 if explicit else 0)


def test_lm_evals_cached_chat_requests_are_not_templated_again(bpe_models):
    """lm-eval reads ``tokenizer_name`` whenever it templates, also when its requests come from its
    cache (``apply_chat_template`` is then never called); the loglikelihood split is then the same as
    with maskrl's own template."""
    from maskrl.lm_eval_model import MaskrlLM

    folder = bpe_models[False, True]
    own = MaskrlLM(pretrained=str(folder))
    harness = MaskrlLM(pretrained=str(folder))
    assert harness.tokenizer_name and harness.harness_templates and not own.harness_templates
    templated = harness.adapter.tokenizer.apply_chat_template([{"role": "user", "content": "1+1="}], tokenize=False,
                                                              add_generation_prompt=True)
    assert harness.model_input(templated) == templated == own.model_input("1+1=")
    assert harness.encode_pair(templated, "2") == own.encode_pair("1+1=", "2")
    assert MaskrlLM(pretrained=str(folder)).chat_template(False) is None
    lm = MaskrlLM(pretrained=str(folder))
    assert lm.chat_template(True) == CHAT and lm.harness_templates


def test_a_lora_export_is_evaluated_as_base_plus_adapter(tmp_path):
    """``dtype=bfloat16`` on a LoRA run's ``model/``: the bf16 base plus the float32 adapter, the
    live policy's logits (not the base's, which a bf16 merge of a small update would give)."""
    from maskrl.lm_eval_model import MaskrlLM
    from maskrl.models import apply_lora

    tiny = build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=32, seed=2)
    for p in tiny.model.parameters():
        p.data = p.data.to(torch.bfloat16)
    lora = apply_lora(tiny, rank=8, alpha=16)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in lora.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 1e-4)
    folder = save_model(lora, tmp_path / "model")
    lm = MaskrlLM(pretrained=str(folder), dtype="bfloat16")
    ids = torch.randint(0, 60, (2, 10), generator=g)
    with torch.no_grad():
        want = lora.logits(ids)
        assert torch.equal(lm.adapter.logits(ids), want)
        with lora.reference() as base:
            assert not torch.equal(base.logits(ids), want)  # the adapter changes this policy


def test_a_requests_score_depends_on_the_request_alone(bpe_models):
    """Issue 50 §4: B's ``(ELBO, is_greedy)`` is the same in ``[A, B]``, ``[C, B]``, ``[B]`` and ``[B, A]``, and
    under another ``batch_size`` (the masks were seeded from the request's index in the list); A and C
    score differently from B (the comparison can fail); another ``seed`` draws other masks."""
    from lm_eval.api.instance import Instance

    from maskrl.lm_eval_model import MaskrlLM, request_seed

    folder = bpe_models[False, False]
    lm = MaskrlLM(pretrained=str(folder), elbo_nodes=2, elbo_draws=2, batch_size=2)
    # B's continuation has several tokens: its masks vary with the seed (index-seeded, B scored
    # -19.39 at index 1 and -24.12 at index 0 on this model)
    A, B, C = ("Q: 1+1=\nA:", " 2"), ("The capital of", " France is Paris."), ("Is it Paris? It is", " Paris.")

    def run(model, *reqs):
        return model.loglikelihood([Instance("loglikelihood", {}, r, i) for i, r in enumerate(reqs)])

    b = run(lm, B)[0]
    assert run(lm, A, B)[1] == run(lm, C, B)[1] == run(lm, B, A)[0] == b
    assert run(MaskrlLM(pretrained=str(folder), elbo_nodes=2, elbo_draws=2, batch_size=1), A, C, B)[2] == b
    assert len({run(lm, A)[0][0], run(lm, C)[0][0], b[0]}) == 3
    ctx, cont = lm.encode_pair(*B)
    assert b[0] == pytest.approx(_elbo_ref(folder, ctx, cont, 0, 2, 2), rel=1e-5, abs=1e-5)
    assert run(MaskrlLM(pretrained=str(folder), elbo_nodes=2, elbo_draws=2, seed=1), B)[0][0] != b[0]
    # the seed is a function of the seed and the tokens only (SHA-256: no per-process hash salt)
    assert request_seed(0, ctx, cont) == request_seed(0, list(ctx), list(cont)) != request_seed(1, ctx, cont)
    assert request_seed(0, [1, 2], [3]) != request_seed(0, [1], [2, 3])


def test_batch_size_in_model_args_and_from_lm_eval(bpe_models, tmp_path):
    """Issue 50 §6: lm-eval passes ``batch_size`` (its ``--batch_size``, default 1), ``max_batch_size`` and
    ``device`` to every model; given in ``model_args`` too, the constructor got it twice. ``model_args``
    wins, with a warning naming both values when they differ; through ``simple_evaluate`` as lm-eval's
    command line calls it (``batch_size=1`` beside ``model_args``'s)."""
    import warnings

    from lm_eval.tasks import TaskManager

    from maskrl.lm_eval_model import MaskrlLM, merge_model_args

    folder = bpe_models[False, False]
    lm_eval_passes = {"batch_size": 1, "max_batch_size": None, "device": "cpu"}
    with pytest.warns(UserWarning, match=r"batch_size is both in model_args \(3\) and given to lm-eval \(1"):
        lm = MaskrlLM.create_from_arg_string(f"pretrained={folder},batch_size=3,gen_length=8,block_length=8",
                                             lm_eval_passes)
    assert lm.batch_size == 3 and lm.sampler.gen_length == 8 and str(lm.device) == "cpu"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lm = MaskrlLM.create_from_arg_obj({"pretrained": str(folder), "device": "cpu", "batch_size": 1}, lm_eval_passes)
        assert lm.batch_size == 1
        assert MaskrlLM.create_from_arg_string(f"pretrained={folder}", lm_eval_passes).batch_size == 1
    assert merge_model_args({"a": 1}, None) == {"a": 1}
    assert merge_model_args({"device": "cpu"}, {"device": None, "max_batch_size": 4}) == {"device": "cpu",
                                                                                          "max_batch_size": 4}
    import maskrl.lm_eval_model  # noqa: F401  (registers "maskrl")

    with pytest.warns(UserWarning, match="batch_size is both in model_args"):
        out = lm_eval.simple_evaluate(model="maskrl", batch_size=1, device="cpu",
                                      model_args=f"pretrained={folder},batch_size=2,gen_length=8,block_length=8,steps=4",
                                      tasks=["maskrl_chat_once"], task_manager=TaskManager(
                                          include_path=str(_chat_task(tmp_path)), include_defaults=False))
    assert "maskrl_chat_once" in out["results"]
