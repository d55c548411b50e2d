"""Command line: ``maskrl sft | train | eval | generate | score | demo | config | bench``.

Every command that trains reads YAML files from ``configs/`` (``--config``, repeatable, later files
win) plus ``--set key.sub=value`` overrides; an unknown key or a bad value is an error naming the key
and the valid ones.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shlex
import sys
import time
from pathlib import Path

from maskrl.config import ConfigError, load_config, to_dict


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", action="append", default=[], help="YAML config file (repeatable; later files win)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.lr=1e-5 (repeatable)")
    p.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE",
                   help="import a module (dotted name or .py file) that registers objectives, likelihoods, "
                        "credit modules or tasks before the config is built (repeatable; adds to `plugins:`)")


def _config(args):
    return load_config(args.config, args.overrides, plugins=args.plugins)


def _model_config(args):
    """:func:`_config` for a command that reads ``model.path`` (sft, train, plan): a training run folder
    there stands for its exported ``model/`` (:func:`maskrl.rundir.run_model_folder`), so the run
    records, fingerprints and plans the model it reads."""
    from maskrl.rundir import run_model_folder

    cfg = _config(args)
    cfg.model.path = run_model_folder(cfg.model.path, "model.path")
    return cfg


def cmd_sft(args) -> int:
    cfg = _model_config(args)  # config errors answer before torch is imported
    from maskrl.pipeline import (check_run_lengths, check_run_samplers, export_model, load_policy, sft_from_config,
                                 task_and_data, write_json)

    out = Path(args.out or Path(cfg.output_dir) / "model")
    _open_model_dir(args, out)
    task, _, source, train = task_and_data(cfg)
    adapter = load_policy(cfg)
    check_run_lengths(cfg, adapter, train)
    check_run_samplers(cfg, adapter, ("eval",))  # the prompt card's sampler
    t0 = time.time()
    hist = sft_from_config(cfg, adapter, task, train)
    export_model(out, adapter, cfg, task, data=f"{len(train)} training rows of {task.name} (held-out rows: {source})",
                 steps=f"SFT {cfg.sft.steps} steps of {cfg.sft.batch_size} rows")
    write_json(out / "maskrl_sft.json", {"config": to_dict(cfg), "history": hist, "train_rows": len(train),
                                         "held_out_source": source, "seconds": time.time() - t0})
    print(f"saved SFT model to {out}")
    return 0


def cmd_train(args) -> int:
    cfg = _model_config(args)  # config errors answer before torch is imported
    from maskrl.pipeline import (check_run_lengths, check_run_samplers, drop_rows, export_model, load_policy,
                                 prompt_formatter, task_and_data, training_eval_fn, validation_examples)
    from maskrl.rundir import is_main_process, record_config
    from maskrl.trainer import RLTrainer, TrainingInterrupted

    run = _open_train_run(args, cfg)  # before any model is loaded
    task, held_out, source, train = task_and_data(cfg)
    val, val_source = validation_examples(cfg, task, held_out) if cfg.train.eval_every else ([], "")
    train = drop_rows(train, task, val)
    if not cfg.model.path:
        print("maskrl train: model.path is empty, so RL starts from a randomly initialised tiny model. "
              "Run `maskrl sft ... --out DIR` and pass `--set model.path=DIR`, or use `maskrl demo` "
              "(SFT + RL + evaluation).", file=sys.stderr)
    policy = load_policy(cfg)
    check_run_lengths(cfg, policy, train, val, val_source or source)
    check_run_samplers(cfg, policy)
    fmt = prompt_formatter(policy, cfg.model.chat_template)
    trainer = RLTrainer(cfg, policy, task, train, prompt_fn=fmt,
                        eval_fn=training_eval_fn(cfg, task, val, fmt, lambda: trainer.policy_eval) if val else None)
    if run["checkpoint"]:
        trainer.load_checkpoint(run["checkpoint"], force=args.force)
        print(f"resumed from {run['checkpoint']} at step {trainer.step_count}")
    elif run["event"] == "restart":  # the logs of the attempt that saved no checkpoint are replaced
        trainer.continue_logs_after(0)
    if is_main_process():
        record_config(cfg.output_dir, to_dict(cfg), step=trainer.step_count, **run)
    try:
        history = trainer.train()
    except TrainingInterrupted as e:
        trainer.close()
        import signal

        print(f"maskrl train: {signal.Signals(e.signum).name} after step {e.step} of {cfg.train.steps}: checkpoint "
              f"saved to {e.checkpoint}. Resume with:\n  {_resume_command(args)}", file=sys.stderr)
        return 128 + e.signum
    trainer.save_checkpoint(Path(cfg.output_dir) / "checkpoints" / f"step_{trainer.step_count}")
    if trainer.acc.is_main_process:
        evals = [h for h in history if any(k.startswith("eval/") for k in h)]
        table = [(f"step {h['step']} (validation, {val_source})",
                  {k.removeprefix("eval/"): v for k, v in h.items() if k.startswith("eval/")}) for h in evals[-1:]]
        export_model(Path(cfg.output_dir) / "model", trainer.policy_eval, cfg, task,
                     data=f"{len(train)} training rows of {task.name}" + (f"; validation {val_source}" if val else ""),
                     steps=f"RL {trainer.step_count} steps ({to_dict(cfg)['objective']['name']})", evaluation=table)
        print(f"model saved to {Path(cfg.output_dir) / 'model'}; metrics in {Path(cfg.output_dir) / 'metrics.jsonl'}")
    trainer.close()
    return 0


def cmd_eval(args) -> int:
    from maskrl.evaluate import run_harness

    summary = run_harness(model=args.model, task_name=args.task, gen_lengths=args.gen_length, limit=args.limit,
                          out_dir=args.out, data_path=args.data, block_length=args.block_length,
                          steps=args.steps, batch_size=args.batch_size, resume=args.resume, device=args.device,
                          dtype=args.dtype, prompt_template=args.prompt_template, chat_template=args.chat_template,
                          overwrite=args.overwrite)
    print(summary["markdown"])
    print(f"maskrl eval: results in {summary['out']}", file=sys.stderr)
    return 0


def cmd_generate(args) -> int:
    from maskrl.evaluate import complete
    from maskrl.models import load
    from maskrl.pipeline import check_lengths, generate_settings, prompt_formatter, read_prompt_card, resolve_device
    import torch

    from maskrl.rundir import run_model_folder

    # every flag is checked before the model is loaded
    args.model = run_model_folder(args.model, "--model")  # a run folder: its exported model/
    card = read_prompt_card(args.model)
    sampler, chat, dtype, used = generate_settings(args, card)
    prompts = args.prompt or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not prompts:
        raise ValueError("no prompt: pass --prompt TEXT (repeatable) or lines on stdin")
    empty = [i for i, p in enumerate(prompts) if not p.strip()]
    if empty:
        raise ValueError(f"prompt {empty[0]} is empty")
    device = resolve_device(args.device)
    adapter = load(args.model, dtype=dtype, device=device)
    if chat and not getattr(adapter.tokenizer, "chat_template", None):  # one truth: asked for, none to apply
        used[-1] = f"chat_template off ({used[-1].rsplit('(', 1)[1][:-1]} on, but the tokenizer has no chat template)"
    print("maskrl generate: " + "; ".join(used) + (f"; prompt card {Path(args.model) / 'maskrl_prompt.json'}"
          if card else "; no prompt card") + " (prompts are used as given: no task template)", file=sys.stderr)
    fmt = prompt_formatter(adapter, chat)
    texts = [fmt(p) for p in prompts]
    check_lengths(adapter, texts, sampler.gen_length, "gen_length")
    gen = torch.Generator(device=adapter.device).manual_seed(args.seed)
    for p, c in zip(prompts, complete(adapter, texts, sampler, generator=gen)):
        print(json.dumps({"prompt": p, "completion": c}, ensure_ascii=False))
    return 0


def _refuse_replacing(paths: list[Path], what: str, overwrite: bool) -> None:
    """Nothing is lost: an output file that exists is replaced only with ``--overwrite``.

    Raises:
        ValueError: naming the first existing path of ``paths`` when ``overwrite`` is false.
    """
    found = [p for p in paths if p.exists()]
    if found and not overwrite:
        raise ValueError(f"{found[0]} exists ({what}); pass --overwrite to replace it, or use another --out")


def cmd_score(args) -> int:
    from maskrl.scoring import score_predictions

    out = Path(args.out)
    _refuse_replacing([out / n for n in ("rows.jsonl", "summary.json", "summary.md")], "an earlier score",
                      args.overwrite)
    summary = score_predictions(args.task, args.predictions, args.data, out_dir=args.out)
    print(json.dumps({k: summary[k] for k in ("task", "n", "accuracy", "accuracy_ci95") if k in summary}))
    return 0


def cmd_demo(args) -> int:
    from maskrl.demo import run_demo

    cfg = _config(args)
    args.run_dir = cfg.output_dir  # for the interrupt hint (:func:`maskrl.demo.interrupt_hint`)
    run_demo(cfg, force_sft=args.force_sft, overwrite=args.overwrite)
    return 0


def cmd_config(args) -> int:
    """Print the resolved config as YAML, or with ``--explain SECTION`` each field of a section with
    its default and description."""
    import yaml

    from maskrl.config import explain, load_plugins

    if args.explain:  # a component's field without its name is the configured component's (--config / --set)
        load_plugins(args.plugins)
        print(explain(args.explain, configured=lambda: _config(args)))
        return 0
    print(yaml.safe_dump(to_dict(_config(args)), sort_keys=False, allow_unicode=True), end="")
    return 0


def cmd_plan(args) -> int:
    """Memory and time of a recipe per process before renting GPUs (:mod:`maskrl.plan`)."""
    cfg = _model_config(args)  # config errors answer before torch is imported
    from maskrl.pipeline import write_json
    from maskrl.plan import Hardware, format_plan, make_plan, parse_bytes, strategy_from_accelerate

    strategy = args.strategy or strategy_from_accelerate(args.accelerate_config, args.gpus)
    hw = Hardware(gpus=args.gpus, gpu_memory=parse_bytes(args.gpu_memory), tflops=args.tflops, mfu=args.mfu,
                  bandwidth=args.bandwidth * 1e12, strategy=strategy)
    from maskrl.plan import estimate_prompt_length

    prompt_length, how = (args.prompt_length, "--prompt-length") if args.prompt_length else estimate_prompt_length(cfg)
    from maskrl.plan.progress import Progress

    plan = make_plan(cfg, hw, prompt_length=prompt_length, search=not args.no_search, progress=Progress(sys.stderr))
    plan["recipe"]["prompt_length_source"] = how
    print(f"prompt length {prompt_length} tokens ({how})")
    print(format_plan(plan))
    if args.json:
        write_json(args.json, plan)
        print(f"wrote {args.json}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="maskrl", description="RL for masked diffusion language models")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    _add_train_parsers(sub)
    _add_eval_parsers(sub)
    _add_tool_parsers(sub)
    _add_config_parsers(sub)
    _add_bench_parser(sub)
    return parser


def _add_train_parsers(sub) -> None:
    """``maskrl sft`` and ``maskrl train``."""
    p = sub.add_parser("sft", help="masked-diffusion supervised warm start")
    _add_config_args(p)
    p.add_argument("--out", help="model folder (default: <output_dir>/model)")
    p.add_argument("--overwrite", action="store_true", help="replace a model folder maskrl wrote before")
    p.set_defaults(func=cmd_sft)

    p = sub.add_parser("train", help="RL fine-tuning (diffu-GRPO, ...)")
    _add_config_args(p)
    p.add_argument("--resume", nargs="?", const="latest", help="checkpoint folder, or 'latest' under output_dir")
    p.add_argument("--overwrite", action="store_true", help="replace the run in output_dir (its checkpoints, "
                   "logs, model) instead of refusing")
    p.add_argument("--force", action="store_true", help="with --resume: accept config changes that change what "
                   "the run trains, or another process count than the checkpoint's (listed; recorded in configs.jsonl)")
    p.set_defaults(func=cmd_train)


def _add_eval_parsers(sub) -> None:
    """``maskrl eval`` and ``maskrl generate``."""
    p = sub.add_parser("eval", help="benchmark a model folder on a task (greedy, same sampler as training)")
    p.add_argument("--model", required=True, help="model folder, training run folder (its model/) or hub id")
    p.add_argument("--task", required=True)
    p.add_argument("--gen-length", default=None,
                   help="comma-separated completion lengths in tokens (default: the model's prompt card, else 128,256,512)")
    p.add_argument("--block-length", type=int, default=None, help="default: the model's prompt card, else 32")
    p.add_argument("--steps", type=int, default=None,
                   help="denoising steps (0: gen_length/2; default: the model's prompt card, else gen_length/2)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--limit", type=int, default=0, help="first N rows only (0: all)")
    p.add_argument("--data", help="data file or folder (default: $MASKRL_DATA_DIR or ../shared/data)")
    p.add_argument("--out", help="output folder (default: runs/eval/<task>/<key of the weights and settings>)")
    p.add_argument("--resume", action="store_true", help="skip samples already in the output JSONL "
                   "(same weights and settings only)")
    p.add_argument("--overwrite", action="store_true", help="replace an evaluation of another model or settings in --out")
    p.add_argument("--prompt-template", help="replace the task's prompt template, e.g. '{puzzle}=' for the tiny model "
                   "(default: the model's prompt card, else the task's own)")
    p.add_argument("--chat-template", action=argparse.BooleanOptionalAction, default=None,
                   help="apply the tokenizer's chat template (default: the model's prompt card, else on)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("generate", help="complete prompts with a model")
    p.add_argument("--model", required=True, help="model folder, training run folder (its model/) or hub id")
    p.add_argument("--prompt", action="append", help="prompt text (repeatable; default: lines on stdin)")
    p.add_argument("--gen-length", type=int, default=None, help="default: the model's prompt card, else 64")
    p.add_argument("--block-length", type=int, default=None, help="default: the model's prompt card, else 32")
    p.add_argument("--steps", type=int, default=None, help="default: the model's prompt card, else gen_length/2")
    p.add_argument("--temperature", type=float, default=0.0)
    # the decoding rule: each flag, else the prompt card's (as maskrl eval decodes), else SamplerConfig's default
    p.add_argument("--schedule", choices=["fixed", "threshold"], help="default: the model's prompt card, else fixed")
    p.add_argument("--threshold", type=float, help="default: the model's prompt card, else 0.9")
    p.add_argument("--cache", choices=["none", "prefix", "dual", "block"],
                   help="Fast-dLLM key/value cache (none: exact full forwards; block: a block-diffusion model's "
                        "exact cache; default: the model's prompt card, else none)")
    p.add_argument("--remasking", choices=["low_confidence", "sequential", "low_confidence_static", "low_confidence_dynamic",
                   "entropy_bounded"], help="which masks each step commits (docs/sampler.md; default: as --cache)")
    p.add_argument("--early-stop", action=argparse.BooleanOptionalAction, default=None,
                   help="block-diffusion models: a row stops at the block holding its first stop id")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chat-template", action=argparse.BooleanOptionalAction, default=None,
                   help="apply the tokenizer's chat template (default: the model's prompt card, else on)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32")
    p.set_defaults(func=cmd_generate)


def _add_tool_parsers(sub) -> None:
    """``maskrl score``, ``maskrl demo`` and ``maskrl estimate-pos-weights``."""
    p = sub.add_parser("score", help="score another model's completions with a task's reward")
    p.add_argument("--task", required=True)
    p.add_argument("--predictions", required=True, help='JSONL of {"id": row index, "completion": text}')
    p.add_argument("--data", help="the task's data file or folder")
    p.add_argument("--out", required=True, help="output folder (rows.jsonl, summary.json, summary.md)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier score in --out")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("demo", help="SFT the tiny model, evaluate, run RL, evaluate again (make demo)")
    _add_config_args(p)
    p.add_argument("--force-sft", action="store_true", help="ignore the cached SFT model")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier demo run in output_dir "
                   "(an SFT model cached there, in sft-cache/, is kept)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("estimate-pos-weights", help="DTCA's offline POS contribution table (docs/spec.md §3.1)")
    p.add_argument("--model", required=True, help="model folder or training run folder (its model/), frozen")
    p.add_argument("--task", required=True, help="task whose training prompts are sampled")
    p.add_argument("--samples", type=int, default=256, help="trajectories (one per prompt)")
    p.add_argument("--out", required=True, help="JSON table to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing table at --out")
    p.add_argument("--gen-length", type=int, default=None,
                   help="L; the sampler commits 2 tokens per step (default: the model's prompt card, else 64)")
    p.add_argument("--prompt-template", default=None,
                   help="format of the task prompts (default: the model's prompt card, else the task's)")
    p.add_argument("--max-rows", type=int, default=64, help="forward rows per batch of reveal-one states")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_estimate_pos_weights)


def _add_config_parsers(sub) -> None:
    """``maskrl config`` and ``maskrl plan``."""
    p = sub.add_parser("config", help="print the resolved config, or explain a section's fields")
    _add_config_args(p)
    p.add_argument("--explain", metavar="SECTION",
                   help="model, model.tiny, task, rollout, eval, sft, train, objective[.NAME], likelihood[.NAME], "
                        "credit[.NAME]")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("plan", help="memory and time per process of a recipe on given GPUs, before running it")
    _add_config_args(p)
    p.add_argument("--gpus", type=int, default=1, help="processes, one GPU each (default 1)")
    p.add_argument("--gpu-memory", default="80GB", help="memory per GPU, e.g. 24GB, 80GB (read as GiB)")
    p.add_argument("--tflops", type=float, default=989.0, help="peak dense bf16 TFLOP/s per GPU (H100 SXM 989)")
    p.add_argument("--mfu", type=float, default=0.4, help="fraction of the peak reached (default 0.4)")
    p.add_argument("--bandwidth", type=float, default=3.35, help="memory bandwidth in TB/s (H100 SXM 3.35, H200 4.8)")
    p.add_argument("--strategy", choices=["single", "ddp", "fsdp", "zero2", "zero3"],
                   help="sharding (default: from --accelerate-config, else ddp for several GPUs)")
    p.add_argument("--accelerate-config", help="an accelerate config (configs/accelerate/*.yaml) giving the strategy")
    p.add_argument("--prompt-length", type=int, default=0, help="prompt tokens per row, chat template included "
                   "(default: measured on the training prompts when the tokenizer is at hand, else 256)")
    p.add_argument("--no-search", action="store_true", help="do not try changes when the recipe does not fit")
    p.add_argument("--json", help="write the plan as JSON here")
    p.set_defaults(func=cmd_plan)


def cmd_estimate_pos_weights(args) -> int:
    """docs/spec.md §3.1: DTCA's POS contribution table of a frozen model (``maskrl.pos``)."""
    from maskrl.pos import run_estimate

    _refuse_replacing([Path(args.out)], "a POS table", args.overwrite)
    res = run_estimate(args.model, args.task, args.samples, args.out, gen_length=args.gen_length,
                       prompt_template=args.prompt_template, max_rows=args.max_rows, seed=args.seed,
                       device=args.device, progress=not args.no_progress)
    print(f"wrote {args.out}: {len(res['w_c'])} classes from {res['samples']} samples in {res['seconds']:.1f} s")
    return 0


def cmd_bench(args) -> int:
    if args.bench == "sampler":
        from maskrl.bench import parse_counts, run_sampler_bench

        lengths = parse_counts(args.gen_length, "--gen-length", "64,128")
        batches = parse_counts(args.batch, "--batch", "1,8")
        run_sampler_bench(args.out, quick=args.quick, gen_lengths=lengths, reps=args.reps,
                          sudoku_model=args.sudoku_model, countdown_model=args.countdown_model,
                          countdown_block=args.countdown_block, parts=args.parts.split(","), batches=batches,
                          block_size=args.block_size)
        print(f"wrote {args.out}")
        return 0
    if args.bench == "overhead":
        from maskrl.bench_overhead import run_overhead_bench

        res = run_overhead_bench(args.method, args.out, quick=args.quick, reps=args.reps)
        ratios = {k: round(v, 3) for k, v in res.items() if k.endswith("_ratio")}
        print(f"wrote {args.out}: {ratios}")
        return 0
    raise ValueError(f"unknown benchmark {args.bench!r}")  # pragma: no cover - argparse checks choices


def _add_bench_parser(sub) -> None:
    """``maskrl bench <name>``: a group; each benchmark is one sub-command writing JSON."""
    p = sub.add_parser("bench", help="benchmarks (JSON output)")
    p.set_defaults(func=cmd_bench)
    bench = p.add_subparsers(dest="bench", required=True)
    b = bench.add_parser("sampler", help="sampler speed (cache x schedule) and accuracy of trained models")
    b.add_argument("--quick", action="store_true", help="length 64, batches 1,8, 2 repetitions: about a minute (default: length 128, batches 1,8,64, 3 repetitions)")
    b.add_argument("--out", required=True, help="output JSON file")
    b.add_argument("--gen-length", help="comma-separated completion lengths (default 128)")
    b.add_argument("--batch", help="comma-separated batch sizes (default 1,8,64)")
    b.add_argument("--block-size", type=int, help="bench the tiny block-diffusion model with this block (caches none, block)")
    b.add_argument("--reps", type=int, help="repetitions per setting")
    b.add_argument("--sudoku-model", help="Sudoku SFT model folder (maskrl sft --config configs/demo_sudoku.yaml)")
    b.add_argument("--countdown-model", help="Countdown SFT model folder (configs/countdown_diffu_grpo.yaml)")
    b.add_argument("--countdown-block", type=int, default=4, help="block length for Countdown (16-token completions)")
    b.add_argument("--parts", default="speed,sudoku,countdown", help="comma-separated parts to run")
    b = bench.add_parser("overhead", help="per-step cost of a credit-assignment method vs its base (tiny model)")
    b.add_argument("--method", required=True, help="daca (more: maskrl.bench_overhead.OVERHEAD_METHODS)")
    b.add_argument("--quick", action="store_true", help="3 repetitions instead of 7")
    b.add_argument("--reps", type=int, help="repetitions (overrides --quick)")
    b.add_argument("--out", required=True, help="output JSON file")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        with contextlib.ExitStack() as args.cleanup:  # run-folder locks are released on every exit
            return args.func(args)
    except (ConfigError, OSError, KeyError, ValueError) as e:  # OSError: missing files, Hub failures
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"maskrl {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # a second Ctrl-C, or one outside the training loop
        hint = _INTERRUPT_HINTS.get(args.command, "")
        if args.command == "demo":  # whether an SFT model is cached: said only when true
            from maskrl.demo import interrupt_hint
            hint = interrupt_hint(getattr(args, "run_dir", None))
        print(f"maskrl {args.command}: interrupted{': ' + str(e) if str(e) else ''}{hint}", file=sys.stderr)
        return 130


#: what to do after a Ctrl-C outside the training loop, per command (the demo's: :func:`maskrl.demo.interrupt_hint`)
_INTERRUPT_HINTS = {
    "eval": "; run the same command with --resume to keep the samples already written",
    "train": "; the same command plus --resume continues from the last checkpoint (or, if none was saved, "
             "starts the run again from step 0)",
}


# ---------------------------------------------------------------------------------- run folders
def _open_model_dir(args, out: Path) -> None:
    """``maskrl sft``: lock ``out`` and refuse it when it holds a model, unless ``--overwrite``
    (:func:`maskrl.rundir.prepare_model_dir`)."""
    from maskrl import rundir

    if rundir.is_main_process():
        args.cleanup.enter_context(rundir.run_lock(out, f"maskrl {args.command}"))
        rundir.prepare_model_dir(out, overwrite=args.overwrite, other="--out DIR", command=f"maskrl {args.command}")


def _open_train_run(args, cfg) -> dict:
    """``maskrl train``, before any model is loaded: lock ``output_dir``; without ``--resume`` refuse a
    folder holding another run unless ``--overwrite``; with it, refuse config changes that change what
    the run trains unless ``--force`` (:func:`maskrl.rundir.resume_changes`, and a process count other
    than the checkpoint's: the global batch changes; safe changes are printed).

    Returns:
        The keyword arguments of :func:`maskrl.rundir.record_config` but the config and step:
        ``event``, ``checkpoint`` (``None`` for a fresh run), ``changes``, ``forced``, ``weights``.

    Raises:
        RunDirError: the folder is in use, holds another run, or the resume changes the run's meaning.
        FileNotFoundError: ``--resume`` on a folder holding no run (``--resume`` on a run that saved no
            checkpoint starts it again: :func:`_restart_without_checkpoint`).
    """
    from maskrl import rundir
    from maskrl.trainer import latest_checkpoint, read_checkpoint_state
    from maskrl.training.checkpoint import launched_processes, process_count_change

    out = Path(cfg.output_dir)
    main_proc = rundir.is_main_process()
    if args.resume and args.overwrite:
        raise rundir.RunDirError("--resume and --overwrite exclude each other")
    if args.force and not args.resume:
        raise rundir.RunDirError("--force only applies to --resume")
    if main_proc:
        args.cleanup.enter_context(rundir.run_lock(out, "maskrl train"))
    rundir.check_not_inside_run(cfg.model.path, out, "model.path")
    weights = rundir.weights_fingerprint(cfg.model.path) if cfg.model.path else None
    run = {"event": "start", "checkpoint": None, "changes": [], "forced": False, "weights": weights}
    if not args.resume:
        if main_proc:
            rundir.prepare_run_dir(out, overwrite=args.overwrite, other="--set output_dir=DIR", command="maskrl train",
                                   checkpoint=latest_checkpoint(out))
        return run
    ckpt = Path(args.resume) if args.resume != "latest" else latest_checkpoint(out)
    if ckpt is None:
        return _restart_without_checkpoint(args, cfg, out, run)
    state = read_checkpoint_state(ckpt)
    step, old = int(state["step"]), state.get("config", {})
    source = ckpt.resolve().parent.parent
    if main_proc and source != out.resolve():  # a new run from another run's checkpoint
        rundir.prepare_run_dir(out, overwrite=False, other="--set output_dir=DIR", command="maskrl train")
    safe, unsafe = rundir.resume_changes(old, to_dict(cfg), step)
    world = process_count_change(state, launched_processes(), cfg.train.prompts_per_step)
    if world:  # prompts are drawn per process: the global batch changes
        unsafe.append(world)
    began = [r.get("init_weights_sha256") for r in rundir.config_history(source)[:1]]
    if began and began[0] and weights and began[0] != weights and old.get("model", {}).get("path") == cfg.model.path:
        unsafe.append(f"the weights at model.path {cfg.model.path} (the reference model) changed since the run "
                      f"began ({began[0][:19]}... -> {weights[:19]}...)")
    if unsafe and not args.force:
        raise rundir.RunDirError(
            f"resuming {ckpt} (step {step}) would change what the run trains: {'; '.join(unsafe)}. "
            f"Undo these changes, pass --force to apply them from step {step + 1} (recorded in "
            f"{out / rundir.CONFIG_HISTORY}), or start a new run (--set output_dir=DIR)")
    if (safe or unsafe) and main_proc:
        print(f"maskrl train: resuming at step {step} with changed settings ({'forced: ' if unsafe else ''}"
              f"{'; '.join(unsafe + safe)})", file=sys.stderr)
    run.update(event="resume", checkpoint=str(ckpt), changes=unsafe + safe, forced=bool(unsafe))
    return run


def _restart_without_checkpoint(args, cfg, out: Path, run: dict) -> dict:
    """``maskrl train --resume`` on a folder whose run saved no checkpoint (it stopped before its first
    save): start that run again from step 0, saying so. Its settings are those of its last record in
    ``configs.jsonl``; changes are classified as for a resume at step 0 (unsafe ones refused unless
    ``--force``). Its logs are replaced as a resume at step 0 replaces them (``metrics.jsonl`` rows
    and TensorBoard events of steps ≥ 1); ``config.json`` and ``configs.jsonl`` are kept, and the new
    start is recorded as ``"restart"``.

    Raises:
        FileNotFoundError: ``output_dir`` holds no run at all (nothing to resume; a mistyped folder?).
        RunDirError: it holds files but no record of the run's settings, or the settings changed.
    """
    from maskrl import rundir

    what = rundir.describe_run(out)
    if not what:
        raise FileNotFoundError(f"--resume: {out} holds no run to resume (no checkpoint under {out}/checkpoints, "
                                f"no logs); check output_dir, or start the run without --resume")
    history = rundir.config_history(out)
    if not history:
        raise rundir.RunDirError(f"--resume: {out} holds {what} but no checkpoint and no record of the run's "
                                 f"settings ({rundir.CONFIG_HISTORY}); pass --overwrite to start a new run there, "
                                 f"or choose another folder (--set output_dir=DIR)")
    safe, unsafe = rundir.resume_changes(history[-1].get("config", {}), to_dict(cfg), 0)
    if unsafe and not args.force:
        raise rundir.RunDirError(
            f"--resume: the run in {out} saved no checkpoint; starting it again from step 0 would change its "
            f"settings: {'; '.join(unsafe)}. Undo these changes, pass --force to restart it with them, or "
            f"--overwrite to replace it with a new run")
    if rundir.is_main_process():
        changed = f" with changed settings ({'; '.join(unsafe + safe)})" if unsafe or safe else ""
        print(f"maskrl train: --resume: {out} has no checkpoint (the run stopped before its first save; it "
              f"held {what}); starting it again from step 0{changed}", file=sys.stderr)
    run.update(event="restart", changes=unsafe + safe, forced=bool(unsafe))
    return run


def _resume_command(args) -> str:
    """The command line that resumes this ``maskrl train`` run: its own arguments without
    ``--resume [PATH]`` / ``--overwrite``, plus ``--resume``."""
    argv, out, skip = list(args.argv), [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in ("--overwrite",) or a.startswith("--resume="):
            continue
        if a == "--resume":
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            skip = nxt is not None and nxt == args.resume  # `--resume PATH` (argparse took PATH as its value)
            continue
        out.append(a)
    return "maskrl " + shlex.join(out + ["--resume"])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
