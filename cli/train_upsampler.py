"""`specgen train-upsampler`: the MuLo-SD up/down-sampler pair between a low-res drafter's grid and the target's."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from cli import _output
from cli._errors import command
from cli._options import ConfigOpt, DeviceOpt, ForceOpt, Format, FormatOpt, OverridesArg, QuietOpt, out_path
from specgen.config import load_config

EPILOG = """examples:

  specgen train-upsampler --config recipes/tiny/upsampler-2x.yaml --out runs/upsampler-2x

  specgen train-upsampler -c recipes/tiny/upsampler-4x.yaml --out runs/upsampler-4x \\
      warm_start=tiny-image-upsampler-2x

  specgen train-upsampler --out runs/quick steps=20 num_crops=256 name=my-upsampler-2x

  accelerate launch --num_processes 2 -m cli.main train-upsampler -c recipes/tiny/upsampler-2x.yaml \\
      --out runs/u2 --device cuda
"""


@command
def train_upsampler(
    overrides: OverridesArg = None,
    out: Annotated[Path, typer.Option("--out", "-o", parser=out_path, help="Run folder (resumed if it holds state).")] = ...,
    device: DeviceOpt = None,
    config: ConfigOpt = None,
    fmt: FormatOpt = Format.table,
    quiet: QuietOpt = False,
    force: ForceOpt = False,
) -> None:
    """Train and register a MuLo-SD up/down-sampler pair (2x, or 4x warm-started from 2x); resumable, and under
    `accelerate launch` / `torchrun` data-parallel (specgen/train/loop.py)."""
    from specgen.train import run_folder, upsampler  # deferred: start-up (torch-free --help)

    cfg = load_config(upsampler.UpsamplerTrainConfig, config, list(overrides or []))
    # the trainer's state check comes only after the VQ and data load
    with run_folder.training_run(out, asdict(cfg), [("upsampler", cfg.name, cfg.ship_dir)], device, force,
                                 quiet, upsampler.RESUME_LOOSE) as (log, dev):
        done = upsampler.train(cfg, out, log, device=dev, force=force)
    if done is None:  # another process of a data-parallel run: rank 0 reports
        return
    m = done.metrics
    rows = [done.row(out, scale=f"{cfg.scale}x", up_token_acc=m["up_token_acc"], down_token_acc=m["down_token_acc"])]
    if fmt == Format.json:
        _output.emit_json(rows)
    else:
        _output.table("train-upsampler", rows, ["ref", "scale", "up_token_acc", "down_token_acc", "path"], _output.out)
