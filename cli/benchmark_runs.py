"""Run folders of `specgen benchmark`: shard selection (`--shard I/N` or a launcher's ranks), resuming, merging."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import torch

from cli import _output
from specgen import devices
from specgen.errors import UsageError
from specgen.eval.run_dir import MemoryRun, RunDir, RunNotFinished, Shard, launcher_shard, parse_shard, wait_for_ranks


def shard_of(shard: str | None, run_dir: Path | None) -> tuple[Shard, bool]:
    """(this process's shard, whether a launcher started it); several shards need a folder to meet in."""
    launched = launcher_shard()
    if shard is not None and launched is not None:
        raise UsageError("--shard and a launcher's ranks (RANK/WORLD_SIZE) both split the items; use one of them")
    chosen = parse_shard(shard) if shard is not None else launched or Shard()
    if chosen.count > 1 and run_dir is None:
        raise UsageError(f"shard {chosen.index}/{chosen.count}: a sharded run needs --run-dir DIR, the folder "
                         "where the shards' records meet (report merges them)")
    return chosen, launched is not None


def process_device(device: str) -> str:
    """The device this process measures on: `auto` resolved, and under a launcher a bare `cuda` becomes this rank's
    own GPU (LOCAL_RANK), so the ranks of one node do not all share GPU 0. Resolved after the run folder recorded
    the config as given, so every rank records the same config."""
    name = devices.device_name(device)
    local = os.environ.get("LOCAL_RANK")
    if name == "cuda" and local is not None and torch.cuda.device_count() > 1:
        return f"cuda:{int(local) % torch.cuda.device_count()}"
    return name


def sink_for(run_dir: Path | None, suite: str, cfg) -> RunDir | MemoryRun:
    """The run folder (created, or reopened to resume; another config is refused) or an in-memory run."""
    return RunDir.open(run_dir, suite, asdict(cfg)) if run_dir is not None else MemoryRun()


def merged_rows(sink, rows_of, shard: Shard, launched: bool, quiet: bool) -> list[dict] | None:
    """The finished run's rows; None on a launcher rank other than 0, or when other shards are not done yet
    (said in one line: their records are merged by the last shard to finish or by `benchmark report`)."""
    if launched:
        wait_for_ranks()
        if shard.index != 0:
            return None
    try:
        return rows_of(sink)
    except RunNotFinished as e:
        if not quiet:
            _output.err.print(f"shard {shard.index}/{shard.count} is done; {e}. "
                              f"`specgen benchmark report {sink.path}` prints the table once every shard is done.",
                              markup=False, soft_wrap=True)
        return None


def machine_of(sink) -> str:
    """The machine label of the shards that measured a run (one label when they agree)."""
    labels = sorted({info.get("machine") or "?" for info in sink.machines().values()})
    return "; ".join(labels) or _output.machine_label()
