"""Shared pieces of the `python -m specgen.train.<x>` training scripts (their entry points, not the library)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable


def file_logger(log_path: Path) -> Callable[[str], None]:
    """A `log(msg)` that appends timestamped lines to `log_path` and echoes them to stderr."""

    def log(msg: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}"
        with open(log_path, "a") as f:
            f.write(line + "\n")
        print(line, file=sys.stderr, flush=True)

    return log
