"""`specgen train-heads --kind eagle`: an EAGLE feature drafter for an image target (c2i, or t2i with captions=FILE)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from specgen.config import load_config

ForceOpt = Annotated[bool, typer.Option("--force", help="Replace existing registry entries of the output names "
                                                        "(never a built-in's).")]


def train_eagle(config: Path | None, overrides: list[str], out: Path, quiet: bool,
                device: str | None = None, force: bool = False) -> list[dict]:
    """`specgen train-heads --kind eagle`: train and register an EAGLE drafter; one row per registered entry."""
    from specgen.train import eagle, run_folder  # deferred: start-up (torch-free --help)

    cfg = load_config(eagle.EagleTrainConfig, config, overrides)
    # the run folder and outputs are checked before the target loads and samples are generated
    with run_folder.training_run(out, asdict(cfg), [("draft", cfg.name, cfg.ship_dir)], device, force, quiet,
                                 loose=("ship_dir",)) as (log, dev):
        result = eagle.train(cfg, out, log, device=dev, force=force)
    if not result["main"]:  # another process of a data-parallel run: rank 0 reports
        return []
    e = result["entry"]
    m = {k: v for k, v in result["metrics"].items() if k != "history"}
    return [{"ref": e.ref if e else "-", "stage": "-", "parent": e.meta.get("parent") if e else cfg.target,
             "metrics": m, "path": str(e.path) if e else str(out)}]
