"""Image runner of `specgen generate`: PNG files + a grid; paths and stats on stdout (table or JSON)."""

from __future__ import annotations

from pathlib import Path

from cli import _output
from cli._options import Format

STAT_COLUMNS = ["method", "images", "tau", "d_bar", "nfe", "tpf", "drafter_share", "images_per_s", "wall_s"]


def run(req) -> None:
    from specgen.config import load_config
    from specgen.decoding.stats import DecodeStats
    from specgen.errors import UsageError
    from specgen.image.generate import ImageGenConfig, generate_images, image_conditions, load_image_model, write_pngs
    from specgen.paths import check_output_dir

    if req.num is not None and req.num < 1:
        raise UsageError(f"--num must be >= 1, got {req.num} (leave it out for the default)")
    if req.drafter and (req.method or "ar") == "ar":
        raise UsageError("--drafter is not used by method ar; pick a speculative method (e.g. --method adt-tree)")
    if req.classes is not None and not [c for c in req.classes.split(",") if c.strip()]:
        raise UsageError(f"--classes {req.classes!r} names no class; give names or ids, comma-separated")
    cfg = load_config(ImageGenConfig, req.config, req.overrides, method=req.method, model=req.model,
                      num=req.num, cfg_scale=req.cfg_scale, temperature=req.temperature, top_k=req.top_k,
                      top_p=req.top_p, seed=req.seed, device=req.device,
                      out_dir=str(req.out_dir) if req.out_dir else None,
                      classes=[c.strip() for c in req.classes.split(",") if c.strip()] if req.classes else None,
                      captions=str(req.captions) if req.captions else None, drafter=req.drafter,
                      batch_size=req.batch_size, dtype=req.dtype, quantize=req.quantize)
    check_output_dir(Path(cfg.out_dir), "--out-dir")  # created with the first PNG: a failed run leaves no folder
    im = load_image_model(cfg.model, cfg.drafter, cfg.device, need_drafter=cfg.method != "ar", dtype=cfg.dtype,
                          quantize=cfg.quantize)
    conditions = image_conditions(im, cfg)  # checks classes/captions against the model before decoding
    with _output.progress(f"{cfg.method}: images", len(conditions), req.quiet or req.fmt == Format.json) as advance:
        samples, pixels = generate_images(im, cfg, on_done=lambda i: advance(), conditions=conditions)
    labels = [s.label for s in samples]
    paths = write_pngs(pixels, labels, im.classes, Path(cfg.out_dir), cfg.method)
    total = DecodeStats()
    for s in samples:
        total.merge(s.stats)
    wall = max(s.stats.extras["latency_s"] for s in samples)  # the batch's wall time (rows overlap when batched)
    summary = {"method": cfg.method, "images": len(samples), **total.summary(), "wall_s": round(wall, 4),
               "images_per_s": round(len(samples) / wall, 4) if wall else 0.0}
    if req.fmt == Format.json:
        about = ((lambda l: {"caption": l}) if im.text_conditional else
                 (lambda l: {"class": im.classes[l] if l < len(im.classes) else l, "label": l}))
        _output.emit_json({"method": cfg.method, "model": im.entry.ref, "images": [
            {"path": str(p), **about(l), "tokens": s.tokens}
            for p, l, s in zip(paths, labels, samples)], "grid": str(paths[-1]), "stats": summary})
        return
    for p in paths:
        _output.out.print(str(p))
    if not req.quiet:
        _output.table(f"{cfg.method} on {im.entry.ref} (cfg {cfg.cfg_scale}, T={cfg.temperature})", [summary],
                      STAT_COLUMNS)
