"""Text suites of `specgen benchmark` (humaneval, text): measure into a run (folder or memory), print the rows."""

from __future__ import annotations

from pathlib import Path

from cli import _output, benchmark_runs
from cli._options import Format
from specgen.config import load_config
from specgen.errors import UsageError
from specgen.eval.text_bench import (TextBenchConfig, check_methods, check_prompts_fit, items_left, measure, plan,
                                     rows_of)
from specgen.text.target import load_text_model

COLUMNS = ["category", "method", "model", "tokens_per_s", "speedup_vs_ar", "tpf", "tau", "efficiency", "weight_mb_per_token",
           "bandwidth_share", "nfe", "exact_match_vs_ar", "exact_match_vs_own_ar", "prefix_vs_ar", "nll_base",
           "pass_at_1"]
BATCH_COLUMNS = ["batch_size", "method", "model", "throughput_tokens_per_s", "throughput_vs_ar", "throughput_vs_ar_b1",
                 "decode_tokens_per_s",
                 "latency_median_s", "latency_p90_s", "tpf", "tau", "c_batch", "exact_match_vs_ar",
                 "exact_match_vs_ar_b1", "nll_base", "pass_at_1"]


def run(overrides=None, suite="humaneval", prompts=None, prompt_field=None, category_field=None, methods=None,
        model=None, limit=None, offset=None, max_new_tokens=None, threads=None, seed=None, device=None, dtype=None,
        quantize=None, config=None, out=None, append=False, run_dir=None, shard=None, fmt=Format.table,
        quiet=False) -> None:
    """Measure this process's items of the run (all of them unless sharded), then print the merged rows."""
    rows = [m.strip() for m in methods.split(",") if m.strip()] if methods else None
    cfg = load_config(TextBenchConfig, config, overrides, suite=suite, prompts=prompts, prompt_field=prompt_field,
                      category_field=category_field, model=model, limit=limit, offset=offset,
                      max_new_tokens=max_new_tokens, threads=threads, seed=seed, device=device, methods=rows,
                      dtype=dtype, quantize=quantize)
    if cfg.prompts == "-" and run_dir is not None:
        raise UsageError("--prompts - (stdin) cannot be read again to resume or report a --run-dir: give a file")
    check_methods(cfg)
    n_prompts = plan(cfg).n_prompts  # refuses an empty or malformed prompt set before anything is written
    this, launched = benchmark_runs.shard_of(shard, run_dir)
    _output.check_rows_path(out, append)
    sink = benchmark_runs.sink_for(run_dir, cfg.suite, cfg)
    cfg.device = benchmark_runs.process_device(cfg.device)
    if pending(cfg, sink, this):
        check_prompts_fit(cfg, _output.registry_progress(quiet))  # from the entry's files, before the weights load
        tm = load_text_model(cfg.model, cfg.device, _output.registry_progress(quiet), dtype=cfg.dtype,
                             quantize=cfg.quantize, graphs=cfg.graphs)
        with _output.progress(f"benchmark {cfg.suite}", n_prompts * len(cfg.batch_sizes),
                              quiet or fmt == Format.json) as advance:
            # the machine label is read once the run has set its threads
            measure(tm, cfg, sink, this, on_prompt=lambda i: advance(), machine=lambda: _output.machine_label(cfg.device))
    rows = benchmark_runs.merged_rows(sink, lambda s: rows_of(cfg, s), this, launched, quiet)
    if rows is not None:
        show(rows, cfg, benchmark_runs.machine_of(sink), fmt, out, append, roofline_note(sink))


def roofline_note(sink) -> str:
    """The AR roofline of the run's first shard: its copy bandwidth / the bytes one AR forward streams."""
    info = next(iter(sink.machines().values()), {})
    bandwidth, ar = info.get("bandwidth_gbs"), (info.get("streamed_bytes") or {}).get("ar")
    if not bandwidth or not ar:
        return ""
    return (f"; AR roofline {bandwidth * 1e9 / ar:.0f} tokens/s = {bandwidth:.1f} GB/s copy bandwidth / "
            f"{ar / 1e6:.1f} MB of weights per step")


def pending(cfg, sink, shard) -> bool:
    """Whether this shard has items without a record (a finished shard rerun loads no model)."""
    return any(items_left(cfg, plan(cfg), sink.records(), shard))


def report(run, fmt, out: Path | None, append: bool, quiet: bool) -> None:
    """The rows of a finished text run folder, printed as a benchmark run prints them."""
    cfg = load_config(TextBenchConfig, **run.config)  # checked like a recipe: a tampered run.json is one line
    show(rows_of(cfg, run), cfg, benchmark_runs.machine_of(run), fmt, out, append, roofline_note(run))


def show(rows: list[dict], cfg, machine: str, fmt, out: Path | None, append: bool, note: str = "") -> None:
    """Skipped rows as their one line each, then the rows as JSONL (`--out`), JSON or tables on stdout."""
    for r in rows:  # a row that cannot run here (llamacpp without llama-cpp-python): its one line, then dropped
        if r.get("skipped"):
            _output.err.print(r["skipped"], markup=False, soft_wrap=True)
    rows = [r for r in rows if not r.get("skipped")]
    for r in rows:
        r["machine"] = machine
    _output.write_rows(out, rows, append)
    if fmt == Format.json:
        _output.emit_json(rows)
        return
    source = f" of {cfg.prompts or 'the mixed set'}" if cfg.suite == "text" else ""
    title = (f"{cfg.suite}: {cfg.model}, {rows[0]['prompts'] if rows else 0} prompts{source} from {cfg.offset}, "
             f"greedy, max {cfg.max_new_tokens} new tokens ({machine}{note})")
    single = [r for r in rows if r["batch_size"] == 1]
    if single:
        columns = COLUMNS if any("category" in r for r in single) else COLUMNS[1:]
        _output.table(title, single, columns, _output.out)
    if len(single) < len(rows):
        _output.table(f"{title}, batched (throughput over the batch, latency per sequence)", rows, BATCH_COLUMNS,
                      _output.out)
