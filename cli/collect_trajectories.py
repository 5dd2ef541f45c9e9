"""`specgen collect-trajectories`: greedy Jacobi trajectories of a target over training prompts (parquet shards)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli import _output
from cli._errors import command
from cli._options import (ConfigOpt, DeviceOpt, DtypeOpt, Format, FormatOpt, ModelOpt, OverridesArg, QuietOpt, SeedOpt,
                          out_path, prompt_source, recipe_key)
from specgen.config import load_config
from specgen.errors import UsageError

EPILOG = """examples:

  specgen collect-trajectories --out runs/traj-n16 --limit 200 --block-size 16 --max-new-tokens 96

  specgen collect-trajectories --prompts my_prompts.jsonl --out runs/traj --model smollm2-135m

  torchrun --nproc-per-node 2 -m cli.main collect-trajectories --out runs/traj   # one shard set per rank

  specgen collect-trajectories --out runs/traj --merge     # merge every rank's shards (idempotent)
"""

#: Settings a resumed collection must keep (the rest, such as --limit, may grow or change; the target is checked on
#: load); the seed draws every block's initial guess, so the records of another one would contradict the folder's meta.
RESUME_STRICT = ("prompts", "prompt_field", "block_size", "max_new_tokens", "chat", "dtype", "seed")


@command
def collect_trajectories(
    overrides: OverridesArg = None,
    out: Annotated[Path, typer.Option("--out", "-o", parser=out_path, help="Output folder (resumed if it holds trajectories).")] = ...,
    model: ModelOpt = None,
    prompts: Annotated[Optional[str], typer.Option(
        "--prompts", parser=prompt_source, help="'stdlib' (built-in) or a text/JSONL file, datasets folder or parquet file.")] = None,
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
    # deferred: start-up (these import torch and the models; `specgen --help` does without them)
    from specgen.devices import device_name, resolve_dtype
    from specgen.text.trajectories import META, CollectConfig, collect, collect_dtype, merge_shards
    from specgen.train.run_folder import check_resume, run_folder

    given = dict(model=model, prompts=prompts, limit=limit, block_size=block_size, max_new_tokens=max_new_tokens,
                 seed=seed, device=device, batch_size=batch_size, dtype=dtype)
    if merge:
        extra = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
        extra += [flag for flag, v in (("--config", config), ("overrides", overrides or None)) if v is not None]
        if extra:
            raise UsageError(f"--merge only merges the shards in --out; {extra[0]} would be ignored")
        path = merge_shards(out)
        _output.emit_json({"merged": str(path)}) if fmt == Format.json else _output.emit_text(str(path))
        return
    cfg = load_config(CollectConfig, config, overrides, **given)
    # the model name's precision (+bf16, +int8) where no dtype was given: the config's float32 is only a default
    cfg.dtype = collect_dtype(cfg.model, dtype or recipe_key(config, overrides, "dtype"))
    cfg.device = device_name(cfg.device)  # "auto" -> cuda or cpu
    resolve_dtype(cfg.dtype, cfg.device)  # float16 on a CPU without float16 kernels: one line, before the model loads
    check_resume(out, asdict(cfg), only=RESUME_STRICT, record=META, section="config",  # before the model loads
                 run_files=("shards", "merged"))
    with run_folder(out, disposable=(META,)), \
            _output.progress("collect", None, quiet or fmt == Format.json) as advance:
        def on_prompt(blocks: int, iters: int, seconds: float) -> None:
            advance(1, info=f"{blocks / max(seconds, 1e-9):.2f} blocks/s, {iters / max(blocks, 1):.2f} it/block")

        row = asdict(collect(cfg, out, on_prompt, _output.registry_progress(quiet)))
    if fmt == Format.json:
        _output.emit_json(row)
    else:
        _output.table("collect-trajectories", [row], list(row), _output.out)
