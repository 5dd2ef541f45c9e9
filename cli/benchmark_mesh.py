"""Mesh suite of `specgen benchmark` (`--suite meshes`): XSpecMesh table-3 rows + threshold sweep."""

from __future__ import annotations

from cli import _output
from cli._options import Format

COLUMNS = ["row", "rule", "cd", "hd", "valid_rate", "scr", "step_latency_ms", "tokens_per_s", "meshes_per_s", "speedup_vs_ar", "vs_ar_b1",
           "speedup_scr_lat", "mean_tokens"]


def run(overrides=None, methods=None, model=None, limit=None, offset=None, max_new_tokens=None, threads=None,
        out=None, seed=None, device=None, config=None, fmt=Format.table, quiet=False, **_) -> None:
    """Run the mesh benchmark; `--methods` picks table rows (ar, mlp, mlp+lora, ca, ca+lora)."""
    from specgen.config import load_config
    from specgen.eval.mesh_bench import MeshBenchConfig, run_mesh_benchmark

    rows = [m.strip() for m in methods.split(",") if m.strip()] if methods else None
    cfg = load_config(MeshBenchConfig, config, overrides, model=model, limit=limit, offset=offset,
                      max_new_tokens=max_new_tokens, threads=threads, seed=seed, device=device, rows=rows)
    _output.check_rows_path(out)
    with _output.progress("benchmark meshes", cfg.limit, quiet or fmt == Format.json) as advance:
        result = run_mesh_benchmark(cfg, on_mesh=lambda i: advance())
    machine = _output.machine_label()
    for r in result:
        r["machine"] = machine
    _output.write_rows(out, result)
    if fmt == Format.json:
        _output.emit_json(result)
    else:
        title = (f"meshes: {cfg.model}, {cfg.limit} test point clouds from {cfg.offset}, T {cfg.temperature} "
                 f"top-k {cfg.top_k} top-p {cfg.top_p}, D {cfg.num_heads} ({machine}); reference CD: a box "
                 f"{result[0]['cd_box']}, another test mesh {result[0]['cd_other_mesh']}")
        _output.table(title, result, COLUMNS, _output.out)
