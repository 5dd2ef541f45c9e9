"""Shared pieces of the `python -m specgen.train.<x>` training scripts (their entry points, not the library)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable


def file_logger(log_path: Path, echo: bool = True) -> Callable[[str], None]:
    """A `log(msg)` appending timestamped lines to `log_path` (its folder appears with the first line,
    so a run that fails validation leaves nothing behind) and echoing them to stderr unless `echo` is off."""

    def log(msg: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as f:
            f.write(line + "\n")
        if echo:
            print(line, file=sys.stderr, flush=True)

    return log
