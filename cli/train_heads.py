"""`specgen train-heads`: train draft heads for a target; `--kind` picks the trainer from KINDS (XSpecMesh, EAGLE)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from cli import _output
from cli._errors import command
from cli._options import ConfigOpt, DeviceOpt, ForceOpt, Format, FormatOpt, OverridesArg, QuietOpt, out_path
from specgen.config import load_config
from specgen.errors import UnknownNameError

EPILOG = """examples:

  specgen train-heads --kind xspecmesh --config recipes/tiny/xspecmesh-heads.yaml --out runs/xspecmesh-ca

  specgen train-heads --kind xspecmesh -c recipes/tiny/xspecmesh-heads.yaml --out runs/xspecmesh-mlp \\
      head_kind=mlp name=xspecmesh-mlp-tiny

  specgen train-heads --kind xspecmesh --out runs/quick target=mesh-gpt-tiny num_sequences=16 stage1_epochs=1 stages=1

  specgen train-heads --kind eagle --config recipes/tiny/eagle-image.yaml --out runs/eagle-image target=tiny-image-gpt

  specgen train-heads --kind eagle --out runs/t2i-eagle target=t2i-xl captions=feats.safetensors name=t2i-xl-eagle
"""


def train_xspecmesh(config: Path | None, overrides: list[str], out: Path, quiet: bool,
                    device: str | None = None, force: bool = False) -> list[dict]:
    """XSpecMesh heads (stage 1), then LoRA + heads (stage 2); registers the results."""
    from specgen.train import heads, run_folder  # deferred: start-up (torch-free --help)

    cfg = load_config(heads.HeadsTrainConfig, config, overrides)
    heads.check_config(cfg)  # before the run folder and registry checks; the state check comes after the target loads
    with run_folder.training_run(out, asdict(cfg), heads.outputs(cfg), device, force, quiet,
                                 heads.resume_loose(out)) as (log, dev):
        trainer = heads.HeadsTrainer(cfg, out, log, dev)
        result = trainer.train()
        if not trainer.is_main:  # another process of a data-parallel run: rank 0 registers and reports
            return []
        entries = heads.save_outputs(trainer, result, force)
    return [{"ref": e.ref, "stage": e.meta.get("stage", "-"), "parent": e.meta.get("parent"),
             "metrics": e.meta.get("metrics", {}), "path": str(e.path)} for e in entries]


def train_eagle(config: Path | None, overrides: list[str], out: Path, quiet: bool,
                device: str | None = None, force: bool = False) -> list[dict]:
    """An EAGLE feature drafter for an image target (c2i, or t2i with captions=FILE); registers it."""
    from specgen.train import eagle, run_folder  # deferred: start-up (torch-free --help)

    cfg = load_config(eagle.EagleTrainConfig, config, overrides)
    # the run folder and outputs are checked before the target loads and samples are generated
    with run_folder.training_run(out, asdict(cfg), [("draft", cfg.name, cfg.ship_dir)], device, force, quiet,
                                 loose=eagle.RESUME_LOOSE) as (log, dev):
        done = eagle.train(cfg, out, log, device=dev, force=force)
    if done is None:  # another process of a data-parallel run: rank 0 reports
        return []
    return [done.row(out, stage="-", parent=done.entry.meta.get("parent") if done.entry else cfg.target)]


KINDS = {"xspecmesh": train_xspecmesh, "eagle": train_eagle}  # --kind -> (config, overrides, out, quiet, device, force)


@command
def train_heads(
    overrides: OverridesArg = None,
    kind: Annotated[str, typer.Option("--kind", help=f"Which heads: {', '.join(KINDS)}.")] = "xspecmesh",
    out: Annotated[Path, typer.Option("--out", "-o", parser=out_path, help="Run folder (resumed if it holds state).")] = ...,
    device: DeviceOpt = None,
    config: ConfigOpt = None,
    fmt: FormatOpt = Format.table,
    quiet: QuietOpt = False,
    force: ForceOpt = False,
) -> None:
    """Train draft heads by distillation from a target model and register them; resumable, and under
    `accelerate launch` / `torchrun` data-parallel (specgen/train/loop.py)."""
    if kind not in KINDS:
        raise UnknownNameError("heads kind", kind, list(KINDS))
    rows = KINDS[kind](config, list(overrides or []), out, quiet, device, force)
    if not rows:  # another process of a data-parallel run
        return
    if fmt == Format.json:
        _output.emit_json(rows)
    else:
        _output.table(f"train-heads --kind {kind}", rows, ["ref", "stage", "parent", "path"], _output.out)
