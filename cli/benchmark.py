"""`specgen benchmark`: methods side by side in one process; a Rich table on stderr, rows on stdout."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli._errors import command
from cli._options import (ConfigOpt, DeviceOpt, DtypeOpt, Format, FormatOpt, GraphsOpt, ModelOpt, OverridesArg,
                          PromptFieldOpt, QuantizeOpt, QuietOpt, SeedOpt, comma_list, out_path, prompt_source,
                          recipe_key)
from specgen.errors import UnknownNameError, UsageError
from specgen.eval.run_dir import SUITES

EPILOG = """examples:

  specgen benchmark --suite humaneval --methods ar,jacobi,ngram,hf --limit 20

  specgen benchmark --suite text --prompts mine.jsonl --methods ar,ngram,hf-lookup,llamacpp-lookup   # your workload

  specgen benchmark --suite text --prompts question.jsonl --limit 80   # Spec-Bench's layout as is; rows per category

  specgen benchmark --suite humaneval --methods ar,ngram --limit 5 --format json | jq '.[] | .speedup_vs_ar'

  specgen benchmark --suite text --prompts stubs.txt --no-chat --stop $'\\ndef ' --stop $'\\nclass '   # Codex-style

  specgen benchmark --config recipes/tiny/bench-humaneval.yaml --out rows.jsonl options.ngram.num_draft=3

  specgen benchmark --config recipes/tiny/bench-humaneval.yaml 'sweep.ngram.num_draft=[2,8]'   # rows ngram@num_draft=2, =8

  specgen benchmark --suite humaneval --methods ar,jacobi,cllm,pcllm,pcllm-mr --limit 20   # distilled models vs the original AR

  specgen benchmark --suite humaneval --methods ar,ngram,hf --limit 32 --batch-size 1,4,16   # throughput

  specgen benchmark --suite images --limit 16        # every image method (ImageBenchConfig.methods) at T=0 and T=1

  specgen benchmark --config recipes/tiny/bench-humaneval.yaml --run-dir runs/he   # rerun to resume after a kill

  specgen benchmark --config recipes/tiny/bench-humaneval.yaml --run-dir runs/he --shard 0/4   # one of 4 jobs

  torchrun --nproc-per-node 2 -m cli.main benchmark --config recipes/tiny/bench-humaneval.yaml --run-dir runs/he

  specgen benchmark report runs/he --methods ar,ngram --format json   # a finished run folder's rows (shards merged)

  specgen benchmark report runs/img out_dir=grids   # an images run's grids and plots here, not its recorded out_dir

  specgen benchmark --config recipes/full/bench-llamagen-c2i-l.yaml --dry-run   # check a GPU recipe here first
"""

TEXT = ("humaneval", "text")
#: option -> suite -> the config key it sets there; a suite not named refuses the option rather than ignore it
SUITE_KEYS = {"methods": {**dict.fromkeys(TEXT, "methods"), "images": "methods", "meshes": "rows"},
              "limit": {**dict.fromkeys(TEXT, "limit"), "images": "num", "meshes": "limit"},
              "offset": dict.fromkeys((*TEXT, "meshes"), "offset"),
              "max_new_tokens": dict.fromkeys((*TEXT, "meshes"), "max_new_tokens"),
              "quantize": dict.fromkeys(TEXT, "quantize"), "prompts": {"text": "prompts"},
              "prompt_field": {"text": "prompt_field"}, "category_field": {"text": "category_field"},
              "stop": dict.fromkeys(TEXT, "stop"), "chat": dict.fromkeys(TEXT, "chat")}
#: option -> how another suite does what it does (README: --quantize is for every modality)
ELSEWHERE = {"quantize": "quantized rows: dtypes={{ROW: {value}}} (docs/precision.md)"}
#: option -> value -> the flag that gives it, where the flag is not the option's name (`--no-chat`: chat false)
FLAGS = {"chat": {True: "--chat", False: "--no-chat"}}


def flag(option: str, value) -> str:
    """The command-line flag that gave `option` this `value` (as a refusal names it)."""
    return FLAGS[option][value] if option in FLAGS else f"--{option.replace('_', '-')}"


@command
def benchmark(
    overrides: OverridesArg = None,
    suite: Annotated[Optional[str], typer.Option("--suite", help=f"Benchmark suite: {', '.join(SUITES)}.")] = None,
    methods: Annotated[Optional[str], typer.Option(
        "--methods", help="Comma-separated rows: methods (meshes: heads rows); 'ar' is the reference. A recipe's "
                          "sweeps of other methods (rows) are left out. With report: the rows to show.")] = None,
    model: ModelOpt = None,
    limit: Annotated[Optional[int], typer.Option(
        "--limit", help="Number of prompts (default: humaneval 20, text every prompt of the set), of images per "
                        "row (images, 16) or of test meshes (meshes, 8).")] = None,
    offset: Annotated[Optional[int], typer.Option("--offset", help="Skip this many prompts first.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option("--max-new-tokens", help="Token budget per prompt.")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch threads (0 = default).")] = None,
    prompts: Annotated[Optional[str], typer.Option(
        "--prompts", parser=prompt_source,
        help="\\[text] Prompt set: a file of lines or JSON Lines (prompt or chat messages, optional "
                          "category; Spec-Bench's question.jsonl as is), - for stdin, or a local dataset folder / "
                          ".parquet / .json / .csv file. Default: the shipped mixed set.")] = None,
    prompt_field: PromptFieldOpt = None,
    category_field: Annotated[Optional[str], typer.Option(
        "--category-field", help="\\[text] The record field holding its category (default: category).")] = None,
    stop: Annotated[Optional[list[str]], typer.Option(
        "--stop", help="\\[text] Stop string (repeatable; recipe key stop): every row, peer rows included, ends at "
                       "the token whose text completes the first one, as `generate --stop` ends; speeds count the "
                       "tokens kept.")] = None,
    chat: Annotated[Optional[bool], typer.Option(
        "--chat/--no-chat", help="\\[text] Text prompts through the chat template (default; recipe key chat), or raw "
                                 "as `generate --no-chat` feeds them: the same prompt ids for every row.")] = None,
    batch_size: Annotated[Optional[str], typer.Option(
        "--batch-size", help="Batch sizes, comma-separated (e.g. 1,4,16): B slots of continuous batching (B > 1 "
                            "rows add throughput and latency).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", parser=out_path, help="Also write the rows as JSONL to this new file (an "
                                                "existing file is refused before any work, unless --append).")] = None,
    append: Annotated[bool, typer.Option("--append", help="Add the rows to the end of an existing --out file.")] = False,
    run_dir: Annotated[Optional[Path], typer.Option(
        "--run-dir", parser=out_path, help="Run folder (new, empty or an earlier run's): config, machine and "
                          "per-item records; rerunning the same command resumes (every suite).")] = None,
    shard: Annotated[Optional[str], typer.Option(
        "--shard", help="I/N: measure only shard I of N (0-based; a Slurm array job), into --run-dir. Under "
                        "torchrun/accelerate launch the ranks are the shards.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Check the run (the --config recipe with these options, or the options alone: keys, "
                          "methods, registry entries and checkpoint shapes, prompts, files, --shard, --run-dir, --out) "
                          "without loading a model or writing; "
                          "exit 1 if a check fails.")] = False,
    seed: SeedOpt = None,
    device: DeviceOpt = None,
    graphs: GraphsOpt = None,
    dtype: DtypeOpt = None,
    quantize: QuantizeOpt = None,
    config: ConfigOpt = None,
    fmt: FormatOpt = Format.table,
    quiet: QuietOpt = False,
) -> None:
    """Measure speed (ratios from one run), acceptance and quality of methods on a suite.

    `specgen benchmark report RUN_DIR [out_dir=DIR]` prints the table of a finished --run-dir (shards merged)."""
    # deferred: start-up (the suites import torch and the models; `specgen --help` does without them)
    from cli import benchmark_runs

    names = comma_list("--methods", methods, "method", "ar,ngram")
    if overrides and overrides[0] == "report":  # a subcommand in the overrides' place: no override is a bare word
        # a report prints a finished run as measured: the options that set up a run would be ignored
        run_only = {"--suite": suite, "--model": model, "--limit": limit, "--offset": offset,
                    "--max-new-tokens": max_new_tokens, "--threads": threads, "--prompts": prompts,
                    "--prompt-field": prompt_field, "--category-field": category_field, "--batch-size": batch_size,
                    "--run-dir": run_dir, "--shard": shard, "--dry-run": dry_run or None, "--seed": seed,
                    "--device": device, "--graphs": graphs, "--dtype": dtype, "--quantize": quantize,
                    "--config": config, "--stop": stop or None, flag("chat", bool(chat)): chat}
        given = next((o for o, v in run_only.items() if v is not None), None)
        if given is not None:
            raise UsageError(f"{given} does not apply to `benchmark report`, which prints the run folder's rows as "
                             "measured; it takes --methods (the rows to show), --format, --out, --append, --quiet "
                             "and out_dir=DIR (an images run's grids and plots)")
        return benchmark_runs.report(overrides[1:], names, fmt, out, append, quiet)
    given_suite, named = suite is not None, recipe_key(config, overrides, "suite")
    clash = lambda a, b: bool({a, b} - set(TEXT)) and a != b  # noqa: E731  humaneval and text share keys
    if given_suite and named and clash(suite, named):
        raise UsageError(f"--suite {suite} contradicts suite: {named} (the recipe's or an override's): the {named} "
                         f"benchmark's keys are not the {suite} suite's; drop one of them")
    filed = recipe_key(config, None, "suite")  # an override's suite against the recipe's, as --suite's above
    if named is not None and filed is not None and clash(named, filed):
        raise UsageError(f"suite={named} contradicts the recipe's suite: {filed}: the {filed} benchmark's keys are "
                         f"not the {named} suite's; drop the override or give a recipe of that suite")
    suite = suite if suite is not None else named if named is not None else "humaneval"  # "": no suite (refused)
    if suite not in SUITES:
        raise UnknownNameError("suite", suite, list(SUITES))
    sizes = comma_list("--batch-size", batch_size, "batch size", "1,4,16")
    if sizes is not None:  # every suite reads its batch sizes from its config
        if not all(x.isdecimal() and int(x) >= 1 for x in sizes):
            raise UsageError(f"--batch-size takes comma-separated integers >= 1, got {batch_size!r}")
        overrides = [*(overrides or []), f"batch_sizes=[{','.join(str(int(x)) for x in sizes)}]"]
    explicit = dict(suite=suite, model=model, threads=threads, seed=seed, device=device, dtype=dtype, graphs=graphs)
    # config key -> the option that set it, as a resume's refusal names it (the images suite's --limit sets `num`)
    spelled = {k: f"--{k}" for k, v in explicit.items() if v is not None}
    if sizes is not None:
        spelled["batch_sizes"] = "--batch-size"
    given = dict(methods=names, limit=limit, offset=offset, max_new_tokens=max_new_tokens, quantize=quantize,
                 prompts=prompts, prompt_field=prompt_field, category_field=category_field, stop=stop or None,
                 chat=chat)
    for option, value in ((o, v) for o, v in given.items() if v is not None):
        if suite not in SUITE_KEYS[option]:
            hint = ELSEWHERE[option].format(value=value) if option in ELSEWHERE else ""
            raise UsageError(f"{flag(option, value)} is for --suite {' or '.join(SUITE_KEYS[option])}; it is "
                             f"not an option of the {suite} suite" + (f"; {hint}" if hint else ""))
        explicit[SUITE_KEYS[option][suite]] = value
        spelled[SUITE_KEYS[option][suite]] = flag(option, value)
    if dry_run:  # the recipe as this command line would run it: its options are checked, not ignored
        # the suite as the run takes it: the option's, else the recipe's (its own check), else the default
        checked = {k: v for k, v in explicit.items() if v is not None and (k != "suite" or given_suite or not config)}
        return benchmark_runs.print_dry_run(config, overrides, checked, fmt, run_dir, shard, out, append, spelled)
    if limit is not None and limit < 1:  # said as given (the images suite's key is `num`; a dry run's row names it)
        raise UsageError(f"--limit must be >= 1, got {limit}")
    if run_dir is not None and (prompts or recipe_key(config, overrides, "prompts")) == "-":
        raise UsageError("--prompts - (stdin) cannot be read again to resume or report a --run-dir: give a file")
    benchmark_runs.run(suite, config, list(overrides or []), explicit, spelled, run_dir, shard, fmt, out, append,
                       quiet)
