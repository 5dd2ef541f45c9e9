"""Image runner of `specgen generate`: PNG files + a grid; paths and stats on stdout (table or JSON)."""

from __future__ import annotations

from pathlib import Path

from cli import _output
from cli._options import Format

STAT_COLUMNS = ["method", "images", "tau", "d_bar", "nfe", "tpf", "drafter_share", "images_per_s", "wall_s"]


def run(req) -> None:
    from specgen.config import load_config
    from specgen.decoding.stats import DecodeStats
    from specgen.image.generate import (ImageGenConfig, generate_images, image_conditions, load_image_model,
                                        prepare_out_dir, write_pngs)

    cfg = load_config(ImageGenConfig, req.config, req.overrides, method=req.method, model=req.model,
                      num=req.num, cfg_scale=req.cfg_scale, temperature=req.temperature, top_k=req.top_k,
                      top_p=req.top_p, seed=req.seed, device=req.device,
                      out_dir=str(req.out_dir) if req.out_dir else None,
                      classes=[c.strip() for c in req.classes.split(",") if c.strip()] if req.classes else None,
                      captions=str(req.captions) if req.captions else None, drafter=req.drafter)
    prepare_out_dir(Path(cfg.out_dir))
    im = load_image_model(cfg.model, cfg.drafter, cfg.device, need_drafter=cfg.method != "ar")
    conditions = image_conditions(im, cfg)  # checks classes/captions against the model before decoding
    with _output.progress(f"{cfg.method}: images", len(conditions), req.quiet or req.fmt == Format.json) as advance:
        samples, pixels = generate_images(im, cfg, on_done=lambda i: advance(), conditions=conditions)
    labels = [s.label for s in samples]
    paths = write_pngs(pixels, labels, im.classes, Path(cfg.out_dir), cfg.method)
    total = DecodeStats()
    for s in samples:
        total.merge(s.stats)
    summary = {"method": cfg.method, "images": len(samples), **total.summary(),
               "images_per_s": round(len(samples) / total.wall_time, 4) if total.wall_time else 0.0}
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
