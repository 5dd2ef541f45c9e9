"""Image suite of `specgen benchmark` (`--suite images`): methods x temperatures, grids and a speed-quality plot."""

from __future__ import annotations

from pathlib import Path

from cli import _output, benchmark_runs
from cli._options import Format
from specgen.config import load_config
from specgen.errors import UsageError
from specgen.eval.image_bench import (ImageBenchConfig, check_image_methods, image_rows_of, items_left,
                                      measure_images, with_extra_rows, write_outputs)
from specgen.image.generate import load_image_model

COLUMNS = ["method", "temperature", "dtype", "lossless", "images_per_s", "speedup_vs_ar", "vs_ar_b1", "tau", "d_bar",
           "nfe", "tpf", "drafter_share", "efficiency", "exact_match_vs_ar", "exact_match_vs_own_ar", "nll", "clf_fid",
           "class_accuracy"]


def run(overrides=None, methods=None, model=None, limit=None, seed=None, device=None, threads=None, out=None,
        config=None, fmt=Format.table, quiet=False, offset=None, max_new_tokens=None, run_dir=None, shard=None,
        append=False, dtype=None, quantize=None) -> None:
    """Run the image benchmark; `--limit` is the number of images per method and temperature."""
    if offset is not None or max_new_tokens is not None:  # refused, not silently ignored
        raise UsageError(f"{'--offset' if offset is not None else '--max-new-tokens'} is not an option of the images "
                         "suite (its images have a fixed number of tokens; --limit is the number of images)")
    rows = [m.strip() for m in methods.split(",") if m.strip()] if methods else None
    cfg = load_config(ImageBenchConfig, config, overrides, model=model, num=limit, seed=seed, device=device,
                      threads=threads, methods=rows, dtype=dtype)
    check_image_methods(cfg)
    this, launched = benchmark_runs.shard_of(shard, run_dir)
    _output.check_rows_path(out, append)
    sink = benchmark_runs.sink_for(run_dir, "images", cfg)
    cfg.device = benchmark_runs.process_device(cfg.device)
    if any(items_left(with_extra_rows(cfg), sink.records(), this)):
        im = load_image_model(cfg.model, cfg.drafter, cfg.device,
                              need_drafter=any(m != "ar" for m in with_extra_rows(cfg).methods), dtype=cfg.dtype,
                              graphs=cfg.graphs)
        steps = len([i for i in range(cfg.num) if this.owns(i)]) * len(cfg.temperatures)
        with _output.progress("benchmark images", steps, quiet or fmt == Format.json) as advance:
            # the machine label is read once the run has set its threads
            measure_images(im, cfg, sink, this, on_step=lambda: advance(), machine=lambda: _output.machine_label(cfg.device))
    merged = benchmark_runs.merged_rows(sink, lambda s: image_rows_of(cfg, s), this, launched, quiet)
    if merged is not None:
        show(*merged, cfg, benchmark_runs.machine_of(sink), fmt, out, append, quiet)


def report(run, fmt, out: Path | None, append: bool, quiet: bool) -> None:
    """The rows (and grids, plots) of a finished images run folder."""
    cfg = load_config(ImageBenchConfig, **run.config)  # checked like a recipe: a tampered run.json is one line
    show(*image_rows_of(cfg, run), cfg, benchmark_runs.machine_of(run), fmt, out, append, quiet)


def show(rows: list[dict], pixels: dict, cfg, machine: str, fmt, out: Path | None, append: bool, quiet: bool) -> None:
    """Grids and plots into cfg.out_dir, then the rows as JSONL (`--out`), JSON or a table on stdout."""
    files = write_outputs(rows, pixels, Path(cfg.out_dir))
    for r in rows:
        r["machine"] = machine
        r["model"] = cfg.model
    _output.write_rows(out, rows, append)
    if fmt == Format.json:
        _output.emit_json(rows)
        return
    _output.table(f"images: {cfg.model}, {cfg.num} images per row, cfg {cfg.cfg_scale} ({machine}); lantern and vvs "
                  "rows are LOSSY; clf_fid/class_accuracy use the offline tiny classifier, not Inception",
                  rows, COLUMNS, _output.out)
    if not quiet:
        _output.err.print("wrote " + ", ".join(str(f) for f in files))
