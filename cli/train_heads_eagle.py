"""`specgen train-heads --kind eagle`: an EAGLE feature drafter for an image target (c2i, or t2i with captions=FILE).

Registered in `cli/train_heads.py` KINDS; the work is `specgen.train.eagle.train`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

ForceOpt = Annotated[bool, typer.Option("--force", help="Replace existing registry entries of the output names "
                                                        "(never a built-in's).")]


def train_eagle(config: Path | None, overrides: list[str], out: Path, quiet: bool,
                device: str = "cpu", force: bool = False) -> list[dict]:
    """`specgen train-heads --kind eagle`: train and register an EAGLE drafter; one row per registered entry."""
    from specgen.config import load_config
    from specgen.train.checkpoint import check_outputs
    from specgen.train.eagle import EagleTrainConfig, train

    cfg = load_config(EagleTrainConfig, config, overrides)
    from dataclasses import asdict

    from specgen.train.run_folder import check_resume, run_folder
    from specgen.train.script import file_logger

    check_resume(out, asdict(cfg), loose=("ship_dir",))  # before the target loads and samples are generated
    check_outputs([("draft", cfg.name, cfg.ship_dir)], force)
    with run_folder(out, asdict(cfg)):
        log = file_logger(out / "train.log", echo=not quiet)
        result = train(cfg, out, log, device=device, force=force)
    if not result["main"]:  # another process of a data-parallel run: rank 0 reports
        return []
    e = result["entry"]
    m = {k: v for k, v in result["metrics"].items() if k != "history"}
    return [{"ref": e.ref if e else "-", "stage": "-", "parent": e.meta.get("parent") if e else cfg.target,
             "metrics": m, "path": str(e.path) if e else str(out)}]
