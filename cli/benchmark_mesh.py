"""Mesh suite of `specgen benchmark` (`--suite meshes`): XSpecMesh table-3 rows + threshold sweep."""

from __future__ import annotations

from pathlib import Path

from cli import _output, benchmark_runs
from cli._options import Format
from specgen.config import load_config
from specgen.eval.mesh_bench import MeshBenchConfig, items_left, measure_meshes, mesh_rows_of, variants

COLUMNS = ["row", "dtype", "rule", "cd", "hd", "valid_rate", "scr", "step_latency_ms", "tokens_per_s", "meshes_per_s", "speedup_vs_ar", "vs_ar_b1",
           "speedup_scr_lat", "mean_tokens"]


def run(overrides=None, methods=None, model=None, limit=None, offset=None, max_new_tokens=None, threads=None,
        out=None, seed=None, device=None, config=None, fmt=Format.table, quiet=False, run_dir=None, shard=None,
        append=False, dtype=None, quantize=None) -> None:
    """Run the mesh benchmark; `--methods` picks table rows (ar, mlp, mlp+lora, ca, ca+lora)."""
    rows = [m.strip() for m in methods.split(",") if m.strip()] if methods else None
    cfg = load_config(MeshBenchConfig, config, overrides, model=model, limit=limit, offset=offset,
                      max_new_tokens=max_new_tokens, threads=threads, seed=seed, device=device, rows=rows, dtype=dtype)
    labels = [v.label for v in variants(cfg)]  # bad rows or options: one line before anything is written
    this, launched = benchmark_runs.shard_of(shard, run_dir)
    _output.check_rows_path(out, append)
    sink = benchmark_runs.sink_for(run_dir, "meshes", cfg)
    cfg.device = benchmark_runs.process_device(cfg.device)
    if any(items_left(cfg, labels, sink.records(), this)):
        with _output.progress("benchmark meshes", cfg.limit, quiet or fmt == Format.json) as advance:
            # the machine label is read once the run has set its threads
            measure_meshes(cfg, sink, this, on_mesh=lambda i: advance(), machine=lambda: _output.machine_label(cfg.device))
    result = benchmark_runs.merged_rows(sink, lambda s: mesh_rows_of(cfg, s), this, launched, quiet)
    if result is not None:
        show(result, cfg, benchmark_runs.machine_of(sink), fmt, out, append)


def report(run, fmt, out: Path | None, append: bool, quiet: bool) -> None:
    """The rows of a finished meshes run folder."""
    cfg = load_config(MeshBenchConfig, **run.config)  # checked like a recipe: a tampered run.json is one line
    show(mesh_rows_of(cfg, run), cfg, benchmark_runs.machine_of(run), fmt, out, append)


def show(result: list[dict], cfg, machine: str, fmt, out: Path | None, append: bool) -> None:
    for r in result:
        r["machine"] = machine
    _output.write_rows(out, result, append)
    if fmt == Format.json:
        _output.emit_json(result)
    else:
        title = (f"meshes: {cfg.model}, {cfg.limit} test point clouds from {cfg.offset}, T {cfg.temperature} "
                 f"top-k {cfg.top_k} top-p {cfg.top_p}, D {cfg.num_heads} ({machine}); reference CD: a box "
                 f"{result[0]['cd_box']}, another test mesh {result[0]['cd_other_mesh']}")
        _output.table(title, result, COLUMNS, _output.out)
