"""`specgen collect-trajectories`: greedy Jacobi trajectories of a target over training prompts (parquet shards)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli._errors import command
from cli._options import ConfigOpt, DeviceOpt, DtypeOpt, Format, FormatOpt, ModelOpt, OverridesArg, QuietOpt, SeedOpt
from specgen.errors import UsageError

EPILOG = """examples:

  specgen collect-trajectories --out runs/traj-n16 --limit 200 --block-size 16 --max-new-tokens 96

  specgen collect-trajectories --prompts my_prompts.jsonl --out runs/traj --model smollm2-135m

  torchrun --nproc-per-node 2 -m cli.main collect-trajectories --out runs/traj   # one shard set per rank

  specgen collect-trajectories --out runs/traj --merge     # merge every rank's shards (idempotent)
"""


@command
def collect_trajectories(
    overrides: OverridesArg = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (resumed if it holds trajectories).")] = ...,
    model: ModelOpt = None,
    prompts: Annotated[Optional[str], typer.Option("--prompts", help="'stdlib' (built-in) or a text/JSONL file, datasets folder or parquet file.")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Use only this many prompts (0 = all).")] = None,
    block_size: Annotated[Optional[int], typer.Option("--block-size", "-n", help="Jacobi block size n.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option("--max-new-tokens", help="Answer tokens per prompt.")] = None,
    batch_size: Annotated[Optional[int], typer.Option(
        "--batch-size", "-b", help="Prompts decoded together (continuous batching; the records do not change).")] = None,
    merge: Annotated[bool, typer.Option("--merge", help="Only merge the shards of every rank into merged/train.parquet.")] = False,
    seed: SeedOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    config: ConfigOpt = None,
    fmt: FormatOpt = Format.table,
    quiet: QuietOpt = False,
) -> None:
    """Record every Jacobi state (initial guess to fixed point) per block; HumanEval prompts are refused."""
    # deferred: start-up (the runs import torch and the models; `specgen --help` and refused flags do without them)
    from cli import collect_runs

    given = dict(model=model, prompts=prompts, limit=limit, block_size=block_size, max_new_tokens=max_new_tokens,
                 seed=seed, device=device, batch_size=batch_size, dtype=dtype)
    if merge:
        extra = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None and k != "batch_size"]
        extra += [flag for flag, v in (("--config", config), ("overrides", overrides or None)) if v is not None]
        if extra:
            raise UsageError(f"--merge only merges the shards in --out; {extra[0]} would be ignored")
        return collect_runs.merge(out, fmt)
    collect_runs.run(out, config, overrides, given, fmt, quiet)
