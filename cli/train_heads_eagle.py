"""`specgen train-heads --kind eagle`: an EAGLE feature drafter for a class-conditional image target.

Registered in `cli/train_heads.py` KINDS; the work is `specgen.train.eagle.train`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def train_eagle(config: Path | None, overrides: list[str], out: Path, quiet: bool) -> list[dict]:
    """`specgen train-heads --kind eagle`: train and register an EAGLE drafter; one row per registered entry."""
    from specgen.config import load_config
    from specgen.train.eagle import EagleTrainConfig, train

    cfg = load_config(EagleTrainConfig, config, overrides)
    log_path = out / "train.log"

    def log(msg: str) -> None:  # the run folder appears with the first log line, after validation
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as f:
            f.write(line + "\n")
        if not quiet:
            print(line, file=sys.stderr, flush=True)

    result = train(cfg, out, log)
    e = result["entry"]
    m = {k: v for k, v in result["metrics"].items() if k != "history"}
    return [{"ref": e.ref if e else "-", "stage": "-", "parent": e.meta.get("parent") if e else cfg.target,
             "metrics": m, "path": str(e.path) if e else str(out)}]
