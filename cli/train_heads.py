"""`specgen train-heads`: train draft heads for a target; `--kind` picks the trainer from KINDS.

Add a kind by adding one entry to KINDS: a function (config path, overrides, out dir, quiet, device) -> rows
(one dict per registered entry) that does the work and returns what to print. Every kind trains on the shared
loop (specgen/train/loop.py), so it runs under `accelerate launch` / `torchrun` too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from cli import _output
from cli._errors import command
from cli._options import ConfigOpt, DeviceOpt, Format, FormatOpt, OverridesArg, QuietOpt
from cli.train_heads_eagle import ForceOpt, train_eagle

EPILOG = """examples:

  specgen train-heads --kind xspecmesh --config recipes/tiny/xspecmesh-heads.yaml --out runs/xspecmesh-ca

  specgen train-heads --kind xspecmesh -c recipes/tiny/xspecmesh-heads.yaml --out runs/xspecmesh-mlp \\
      head_kind=mlp name=xspecmesh-mlp-tiny

  specgen train-heads --kind xspecmesh --out runs/quick target=mesh-gpt-tiny num_sequences=16 stage1_epochs=1 stages=1

  specgen train-heads --kind eagle --config recipes/tiny/eagle-image.yaml --out runs/eagle-image target=tiny-image-gpt

  specgen train-heads --kind eagle --out runs/t2i-eagle target=t2i-xl captions=feats.safetensors name=t2i-xl-eagle
"""


def train_xspecmesh(config: Path | None, overrides: list[str], out: Path, quiet: bool,
                    device: str = "cpu", force: bool = False) -> list[dict]:
    """XSpecMesh heads (stage 1), then LoRA + heads (stage 2); registers the results."""
    from specgen.config import load_config
    from specgen.errors import UsageError
    from specgen.models.heads import HEAD_KINDS
    from specgen.train.checkpoint import check_outputs
    from specgen.train.heads import HeadsTrainConfig, HeadsTrainer, outputs, save_outputs

    cfg = load_config(HeadsTrainConfig, config, overrides)
    if cfg.head_kind not in HEAD_KINDS:
        raise UsageError(f"unknown head_kind {cfg.head_kind!r}; choose from {', '.join(HEAD_KINDS)}")
    if cfg.num_sequences < 1 or cfg.eval_sequences < 1 or cfg.num_heads < 1 or cfg.stages not in (1, 2):
        raise UsageError("num_sequences, eval_sequences and num_heads must be >= 1 and stages 1 or 2")
    from specgen.registry import check_name

    check_name(cfg.name + "-lora", "name (+ -s1/-lora: heads/NAME-s1, adapter/NAME-lora)")  # before training
    from dataclasses import asdict

    from specgen.train.heads import NAMING_KEYS, STAGE2_KEYS
    from specgen.train.run_folder import check_resume, run_folder
    from specgen.train.script import file_logger

    loose = NAMING_KEYS + ("ship_dir",) + (() if (out / "stage2.safetensors").exists() else STAGE2_KEYS)
    check_resume(out, asdict(cfg), loose=loose)  # the trainer's own check comes only after the target loads
    check_outputs(outputs(cfg), force)
    with run_folder(out, asdict(cfg)):
        log = file_logger(out / "train.log", echo=not quiet)
        trainer = HeadsTrainer(cfg, out, log, device)
        result = trainer.train()
        if not trainer.is_main:  # another process of a data-parallel run: rank 0 registers and reports
            return []
        entries = save_outputs(trainer, result, force)
    return [{"ref": e.ref, "stage": e.meta.get("stage", "-"), "parent": e.meta.get("parent"),
             "metrics": e.meta.get("metrics", {}), "path": str(e.path)} for e in entries]


KINDS: dict[str, Callable[[Path | None, list[str], Path, bool, str, bool], list[dict]]] = {"xspecmesh": train_xspecmesh}
KINDS["eagle"] = train_eagle


@command
def train_heads(
    overrides: OverridesArg = None,
    kind: Annotated[str, typer.Option("--kind", help=f"Which heads: {', '.join(KINDS)}.")] = "xspecmesh",
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Run folder (resumed if it holds state).")] = None,
    device: DeviceOpt = None,
    config: ConfigOpt = None,
    fmt: FormatOpt = Format.table,
    quiet: QuietOpt = False,
    force: ForceOpt = False,
) -> None:
    """Train draft heads by distillation from a target model and register them; resumable, and under
    `accelerate launch` / `torchrun` data-parallel (specgen/train/loop.py)."""
    from specgen.devices import train_device
    from specgen.errors import UnknownNameError, UsageError

    dev = train_device(device)  # before anything loads: a missing device is one line

    if kind not in KINDS:
        raise UnknownNameError("heads kind", kind, list(KINDS))
    if out is None:
        raise UsageError("--out RUN_FOLDER is required (training state and logs go there)")
    rows = KINDS[kind](config, list(overrides or []), out, quiet, dev, force)
    if not rows:  # another process of a data-parallel run
        return
    if fmt == Format.json:
        _output.emit_json(rows)
    else:
        _output.table(f"train-heads --kind {kind}", rows, ["ref", "stage", "parent", "path"], _output.out)
