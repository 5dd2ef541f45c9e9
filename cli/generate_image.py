"""Image runner of `specgen generate`: PNG files + a grid; paths and stats on stdout (table or JSON)."""

from __future__ import annotations

from pathlib import Path

from cli import _output
from cli._options import Format, comma_list
from specgen.config import load_config
from specgen.decoding.stats import DecodeStats
from specgen.errors import UsageError
from specgen.generate.image import (ImageGenConfig, PngWriter, generate_images, image_conditions, label_of,
                                   load_image_model)
from specgen.methods import MethodSpec
from specgen.paths import check_output_dir
from specgen.request import parse_request

# methods that draft without an EAGLE drafter -> what they use instead (--drafter would be ignored)
NO_EAGLE_DRAFTER = {"ar": "", "mulo-sd": " (mulo-sd drafts with its low-res GPT: method_options.lowres)"}
STAT_COLUMNS = ["method", "images", "tau", "d_bar", "nfe", "tpf", "drafter_share", "images_per_s", "wall_s"]


def run(args, spec: MethodSpec) -> None:
    if args.num is not None and args.num < 1:
        raise UsageError(f"--num must be >= 1, got {args.num} (leave it out for the default)")
    if args.drafter and spec.name in NO_EAGLE_DRAFTER:
        raise UsageError(f"--drafter is not used by method {spec.name}{NO_EAGLE_DRAFTER[spec.name]}; pick a method "
                         "with an EAGLE drafter (e.g. --method adt-tree)")
    classes = comma_list("--classes", args.classes, "class", "dog,sky or 0,3 (names or ids)")
    cfg = load_config(ImageGenConfig, args.config, args.overrides, spec, method=spec.name, num=args.num,
                      cfg_scale=args.cfg_scale, out_dir=str(args.out_dir) if args.out_dir else None, classes=classes,
                      captions=str(args.captions) if args.captions else None, drafter=args.drafter,
                      **args.recipe)
    req = parse_request(cfg, "image", spec)
    cfg = req.cfg  # as parsed: `model: NAME+int8` is NAME with quantize int8
    if not cfg.out_dir:  # `out_dir=` (an unset shell variable): Path("") is this folder, written into unsaid
        raise UsageError("an empty out_dir (an unset shell variable?); name a folder, or . for this one")
    check_output_dir(Path(cfg.out_dir))  # created with the first PNG: a failed run leaves no folder
    im = load_image_model(cfg.model, cfg.drafter, req.device, need_drafter=spec.name != "ar", dtype=cfg.dtype,
                          quantize=cfg.quantize, graphs=cfg.graphs)
    conditions = image_conditions(im, cfg)  # checks classes/captions against the model before decoding
    writer, files = PngWriter(Path(cfg.out_dir), spec.name, im.classes), {}

    def write(j: int, pixels) -> None:  # each file as its image is done: an interrupted run keeps the finished ones
        with _output.writing("images", writer.out_dir):
            files[j] = writer.add(j, label_of(conditions[j]), pixels)
        _output.item_done("image", len(files), len(conditions), files[j], args.quiet)

    samples, _ = generate_images(im, req, conditions=conditions, on_image=write)
    with _output.writing("images", writer.out_dir):
        paths = [files[j] for j in range(len(samples))] + [writer.grid()]
    total = DecodeStats()
    for s in samples:
        total.merge(s.stats)
    wall = max(s.stats.extras["latency_s"] for s in samples)  # the batch's wall time (rows overlap when batched)
    # rates over that wall time: the rows' summed times count a batch's steps once per row; summed latencies are none
    summary = {"method": spec.name, "images": len(samples), **total.summary(), "wall_s": round(wall, 4),
               "tokens_per_s": round(total.new_tokens / wall, 3) if wall else 0.0,
               "images_per_s": round(len(samples) / wall, 4) if wall else 0.0}
    del summary["latency_s"]
    model = req.model_label(im.entry.ref)
    if args.fmt == Format.json:
        about = ((lambda l: {"caption": l}) if im.text_conditional else
                 (lambda l: {"class": im.classes[l] if l < len(im.classes) else l, "label": l}))
        _output.emit_json({"method": spec.name, "model": model, "lossless": spec.lossless, "images": [
            {"path": str(p), **about(s.label), "tokens": s.tokens}
            for p, s in zip(paths, samples)], "grid": str(paths[-1]), "stats": summary})
        return
    for p in paths:
        _output.emit_text(str(p))  # as given: Rich would read a folder such as `out [a]` as markup
    if not args.quiet:
        lossy = "" if spec.lossless else ", LOSSY"  # the target's own distribution, or not (README's method table)
        _output.table(f"{spec.name} on {model} (cfg {cfg.cfg_scale}, T={cfg.temperature}{lossy})", [summary],
                      STAT_COLUMNS)
