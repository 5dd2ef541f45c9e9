"""Image suite of `specgen benchmark` (`--suite images`): methods x temperatures, grids and a speed-quality plot."""

from __future__ import annotations

from pathlib import Path

from cli import _output
from cli._options import Format

COLUMNS = ["method", "temperature", "lossless", "images_per_s", "speedup_vs_ar", "vs_ar_b1", "tau", "d_bar", "nfe",
           "tpf", "drafter_share", "exact_match_vs_ar", "nll", "clf_fid", "class_accuracy"]


def run(overrides=None, methods=None, model=None, limit=None, seed=None, device=None, threads=None, out=None,
        config=None, fmt=Format.table, quiet=False, offset=None, max_new_tokens=None, **_) -> None:
    """Run the image benchmark; `--limit` is the number of images per method and temperature."""
    from specgen.config import load_config
    from specgen.errors import UsageError

    if offset is not None or max_new_tokens is not None:  # refused, not silently ignored
        raise UsageError(f"{'--offset' if offset is not None else '--max-new-tokens'} is not an option of the images "
                         "suite (its images have a fixed number of tokens; --limit is the number of images)")
    from specgen.eval.image_bench import (ImageBenchConfig, check_image_methods, run_image_benchmark, with_extra_rows,
                                          write_outputs)
    from specgen.image.generate import load_image_model

    cfg = load_config(ImageBenchConfig, config, overrides, model=model, num=limit, seed=seed, device=device,
                      threads=threads, methods=[m.strip() for m in methods.split(",") if m.strip()] if methods else None)
    check_image_methods(cfg)
    _output.check_rows_path(out)
    im = load_image_model(cfg.model, cfg.drafter, cfg.device, need_drafter=any(m != "ar" for m in with_extra_rows(cfg).methods))
    steps = cfg.num * len(cfg.temperatures)
    with _output.progress("benchmark images", steps, quiet or fmt == Format.json) as advance:
        rows, pixels = run_image_benchmark(im, cfg, on_step=lambda: advance())
    files = write_outputs(rows, pixels, Path(cfg.out_dir))
    machine = _output.machine_label()
    for r in rows:
        r["machine"] = machine
        r["model"] = im.entry.ref
    _output.write_rows(out, rows)
    if fmt == Format.json:
        _output.emit_json(rows)
        return
    _output.table(f"images: {im.entry.ref}, {cfg.num} images per row, cfg {cfg.cfg_scale} ({machine}); "
                  "lantern and vvs rows are LOSSY; clf_fid/class_accuracy use the offline tiny classifier, not Inception",
                  rows, COLUMNS, _output.out)
    if not quiet:
        _output.err.print("wrote " + ", ".join(str(f) for f in files))
