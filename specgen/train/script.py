"""Shared pieces of the `python -m specgen.train.<x>` training scripts (their entry points, not the library)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

from specgen import registry
from specgen.config import load_config
from specgen.devices import train_device
from specgen.errors import SpecgenError
from specgen.train.checkpoint import brief

T = TypeVar("T")


def file_logger(log_path: Path, echo: bool = True) -> Callable[[str], None]:
    """A `log(msg)` appending timestamped lines to `log_path` (its folder made by the first one) and to stderr."""

    def log(msg: str) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as f:
            f.write(line + "\n")
        if echo:
            print(line, file=sys.stderr, flush=True)

    return log


def script_parser(module: str, doc: str, recipe: str, config_required: bool = False,
                  out_help: str = "run directory (resumed if it holds state.safetensors)",
                  registers: bool = False) -> argparse.ArgumentParser:
    """`python -m <module> --config RECIPE --out OUT [--log FILE] [--force] [key=value ...]` (--force where the script
    `registers` an entry); add script-specific flags to it."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=config_required, default=None, help=f"YAML recipe, e.g. {recipe}")
    parser.add_argument("--out", required=True, help=out_help)
    parser.add_argument("--log", default=None, help="log file (default: OUT/train.log); also echoed to stderr")
    parser.add_argument("--device", default=None, help="cpu (default: the tiny recipes' numerics), cuda, cuda:N or "
                        "auto; under `accelerate launch` / `torchrun` every process trains (specgen/train/loop.py)")
    if registers:  # the registry's write rule (docs/training.md), as on the CLI's training commands
        parser.add_argument("--force", action="store_true", help="replace an existing registry entry of the output "
                            "name (never a built-in's)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of recipe keys")
    return parser


def parse_recipe(parser: argparse.ArgumentParser, cls: type[T],
                 argv: list[str] | None) -> tuple[T, argparse.Namespace, Callable[[str], None]]:
    """(recipe from --config + overrides, arguments (--device resolved), logger of --log or OUT/train.log)."""
    args = parser.parse_args(argv)
    args.device = train_device(args.device)  # a missing device: one line, before anything loads
    cfg = load_config(cls, args.config, args.overrides)
    return cfg, args, file_logger(Path(args.log) if args.log else Path(args.out) / "train.log")


def registering(out: str | Path) -> AbstractContextManager:
    """A script's registry writes from its run folder `out`: resumed (it holds a state), the run replaces what it
    registered itself without --force, as the CLI's training commands do (`registry.registering_from`)."""
    return registry.registering_from(Path(out), resumed=(Path(out) / "state.safetensors").is_file())


def print_metrics(metrics: dict[str, Any]) -> int:
    """A script's last stdout line: its metrics as JSON, without the per-eval history; exit status 0."""
    print(json.dumps(brief(metrics)))
    return 0


def run_script(main: Callable[[], int]) -> int:
    """Exit status of `main()`: a specgen error is one line on stderr and its exit code, as in the CLI."""
    try:
        return main()
    except SpecgenError as e:
        if os.environ.get("SPECGEN_DEBUG") == "1":
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
