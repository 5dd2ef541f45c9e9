"""Run folders of resumable commands: a changed config is refused up front, and a failed fresh run leaves nothing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from specgen import registry
from specgen.devices import train_device
from specgen.errors import UsageError
from specgen.paths import check_folder, written_elsewhere
from specgen.train.checkpoint import check_outputs, write_json
from specgen.train.script import file_logger

RECORD = "config.json"
DISPOSABLE = ("config.json", "train.log")
RUN_FILES = ("train.log", "state.safetensors", "stage1.safetensors", "stage2.safetensors")


def check_resume(out: Path, new: dict[str, Any], loose: tuple[str, ...] = (), only: tuple[str, ...] | None = None,
                 record: str = RECORD, section: str | None = None, run_files: tuple[str, ...] = RUN_FILES) -> bool:
    """True when OUT records a run with compatible settings (only `loose` keys differ), False when it records none;
    a UsageError naming the differing keys otherwise, or for files (none of `run_files`) of another program."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a run folder")
    check_folder(out, f"--out {out}")  # a file above it, no write permission, a full device: before anything loads
    path = out / record
    if not path.is_file():  # (a data-parallel run's ranks all start here: another's record write may be in flight)
        others = out.is_dir() and any(not written_elsewhere(p, record) for p in out.iterdir())
        if others and not any((out / f).exists() for f in run_files):
            raise UsageError(f"--out {out} holds other files and no run of this command; use an empty or new folder")
        return False
    try:
        old = json.loads(path.read_text())
        old = old.get(section, {}) if section else old
    except (OSError, ValueError, AttributeError):
        raise UsageError(f"{path} is unreadable, so this run cannot be resumed safely; use a fresh --out") from None
    if not isinstance(old, dict) or len(set(old) & set(new)) * 2 < len(new):
        raise UsageError(f"{path} is not a run record of this command; use an empty or new --out")
    # keys recorded in both configs whose values differ (compared as JSON), except `loose` ones
    keys = [k for k in (only if only is not None else sorted(new)) if k in old and k in new and k not in loose]
    diff = [k for k in keys if json.dumps(old[k], sort_keys=True) != json.dumps(new[k], sort_keys=True, default=str)]
    if diff:
        shown = "; ".join(f"{k}={old[k]!r}, now {new[k]!r}" for k in diff[:4]) + ("; ..." if len(diff) > 4 else "")
        raise UsageError(f"{out} holds a run with a different config ({shown}); rerun with its settings to resume, "
                         "or use a fresh --out")
    return True


@contextmanager
def run_folder(out: Path, record: dict[str, Any] | None = None,
               disposable: tuple[str, ...] = DISPOSABLE) -> Iterator[Path]:
    """Write `record` to OUT/config.json and run the body; a failure of a fresh run (OUT absent or empty) that wrote
    nothing but `disposable` files leaves OUT as it was: removed if this call made it, else emptied (its record
    left there would refuse the corrected rerun as a run with a different config)."""
    out = Path(out)
    existed = out.exists()
    fresh = not existed or not any(out.iterdir())
    try:
        if record is not None:
            write_json(out / RECORD, record)
        yield out
    except BaseException:
        if fresh and out.is_dir() and all(p.name in disposable and not p.is_dir() for p in out.iterdir()):
            for p in out.iterdir():
                p.unlink(missing_ok=True)
            if not existed:
                shutil.rmtree(out, ignore_errors=True)
        raise


@contextmanager
def training_run(out: Path, record: dict[str, Any], outputs: list[tuple[str, str, str]], device: str | None,
                 force: bool = False, quiet: bool = False, loose: tuple[str, ...] = ()
                 ) -> Iterator[tuple[Callable[[str], None], str]]:
    """A training command's run inside `run_folder`, its device, folder and registry writes checked before anything
    loads; yields (logger of OUT/train.log, echoed unless `quiet`; the device)."""
    dev = train_device(device)
    # the entries a resumed run registered before (at a `max_minutes` stop) are its own: replaced without --force
    with registry.registering_from(out, resumed=check_resume(out, record, loose=loose)):
        check_outputs(outputs, force)
        with run_folder(out, record):
            yield file_logger(Path(out) / "train.log", echo=not quiet), dev

