"""`specgen collect-trajectories`' runs: merging shards, or collecting into a resumable run folder."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from cli import _output
from cli._options import Format
from specgen.config import load_config
from specgen.devices import device_name, resolve_dtype
from specgen.text.trajectories import META, CollectConfig, collect, merge_shards
from specgen.train.run_folder import check_resume, run_folder

#: Settings a resumed collection must keep (the rest, such as --limit, may grow or change).
RESUME_STRICT = ("prompts", "prompt_field", "block_size", "max_new_tokens", "chat", "dtype")  # the target: checked on load


def merge(out: Path, fmt: Format) -> None:
    path = merge_shards(out)
    _output.emit_json({"merged": str(path)}) if fmt == Format.json else _output.out.print(str(path))


def run(out: Path, config: Path | None, overrides: list[str] | None, given: dict, fmt: Format, quiet: bool) -> None:
    """Collect into `out` (resumed when it holds a collection of the same RESUME_STRICT settings); `given`: flags."""
    cfg = load_config(CollectConfig, config, overrides, **given)
    cfg.device = device_name(cfg.device)  # "auto" -> cuda or cpu
    resolve_dtype(cfg.dtype, cfg.device)  # float16 on a CPU without float16 kernels: one line, before the model loads
    check_resume(out, asdict(cfg), only=RESUME_STRICT, record=META, section="config",  # before the model loads
                 run_files=("shards", "merged"))
    with run_folder(out, disposable=(META,)), \
            _output.progress("collect", None, quiet or fmt == Format.json) as advance:
        def on_prompt(blocks: int, iters: int, seconds: float) -> None:
            advance(1, info=f"{blocks / max(seconds, 1e-9):.2f} blocks/s, {iters / max(blocks, 1):.2f} it/block")

        summary = collect(cfg, out, on_prompt, _output.registry_progress(quiet))
    row = asdict(summary)
    if fmt == Format.json:
        _output.emit_json(row)
    else:
        _output.table("collect-trajectories", [row], list(row), _output.out)
