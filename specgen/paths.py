"""Output paths that never replace earlier files, and atomic writers (a reader sees the old file or the new one)."""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from specgen.errors import UsageError


def nearest_existing(path: Path) -> Path:
    """`path` itself if it exists, else its nearest existing parent (what creating it would write into)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def check_folder(folder: Path, what: str) -> None:
    """Refuse, before any work and creating nothing, a folder (`what` names it in messages) that is a file or cannot
    be made or written, or whose device refuses a write (`check_space`)."""
    broken = next((p for p in (Path(folder), *Path(folder).parents) if p.is_symlink() and not p.exists()), None)
    if broken is not None:  # making the folder would fail ("File exists") only once the work is done
        raise UsageError(f"{what}: {broken} is a link to {os.readlink(broken)}, which does not exist")
    probe = nearest_existing(folder)
    if not probe.is_dir():
        raise UsageError(f"{what}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{what}: {probe} is not writable")
    check_space(probe, what)


def check_output_dir(folder: Path) -> None:
    """An --out-dir folder checked as `check_folder` does (a path naming a file is refused as such)."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"cannot create output folder {folder}: --out-dir names a file")
    check_folder(folder, f"cannot create output folder {folder}")


PROBE_BYTES = 64 * 1024  # a probe the size of a few result rows: a device this full fails the real write too
PROBE_PREFIX = ".specgen-probe-"
IN_FLIGHT = (PROBE_PREFIX, ".nfs")  # another process's space probe (`written_elsewhere`)
ADVICE = {errno.ENOSPC: "free some space or write elsewhere", errno.EDQUOT: "free some of your quota or write "
          "elsewhere", errno.EROFS: "it is read-only: write elsewhere", errno.EACCES: "write elsewhere",
          errno.EPERM: "write elsewhere"}


def check_space(folder: Path, what: str) -> None:
    """Refuse, before any work, a folder where a probe file cannot be written and synced (full device, quota,
    read-only mount, permissions the mode bits do not show)."""
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=PROBE_PREFIX, buffering=0) as f:
            f.write(bytes(PROBE_BYTES))
            os.fsync(f.fileno())
    except OSError as e:
        raise UsageError(f"{what}: cannot write in {folder} ({e.strerror or e}); "
                         f"{ADVICE.get(e.errno, 'write elsewhere')}") from None


def remove_empty_dirs(folder: Path, base: Path) -> None:
    """Remove `folder` and its parents below `base` while they are empty (folders a failed write made for nothing)."""
    folder = Path(folder)
    while folder != base and base in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def free_stem(folder: Path, stem: str, suffixes: tuple[str, ...]) -> str:
    """The first of `stem`, `stem-1`, `stem-2`, ... free for every suffix (a mesh and its preview share one name). A
    killed writer's temporaries of any of those names go first: the name picked may not be the one it was writing,
    whose own sweep (`linked_temp`) would then never come."""
    for suffix in suffixes:
        remove_stale_temps(folder, f".{glob.escape(stem)}*{glob.escape(suffix)}.*.tmp")
    return next(c for c in (f"{stem}-{n}" if n else stem for n in itertools.count())
                if not any((folder / f"{c}{s}").exists() for s in suffixes))


def free_path(path: Path) -> Path:
    """`path`, or the first of `stem-1.ext`, `stem-2.ext`, ... that does not exist yet."""
    return path.with_name(f"{free_stem(path.parent, path.stem, (path.suffix,))}{path.suffix}")


def write_linked(path: Path, write: Callable[[Path], object]) -> Path:
    """`write(tmp)` fills a hidden temporary beside `path`, which is then linked to the first free numbered name of
    `path` (`link_into_place`: never replacing a file, even one another run made meanwhile); returns the name used."""
    tmp = linked_temp(path)
    try:
        write(tmp)
        return link_into_place(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def linked_temp(path: Path) -> Path:
    """A fresh hidden temporary name beside `path`, `.<name>.<8 random hex digits>.tmp`, for a writer that links it into
    place: random, not the pid, which writers of one pid (containers sharing the folder) would share. A killed earlier
    writer's temporaries of `path` go first (`remove_stale_temps`): the temporary is always named from
    the requested `path`, whatever numbered name it was linked to, so one stays only until that name is written again
    (a mesh and its preview pick one free stem: `free_stem` sweeps every numbered name's)."""
    remove_stale_temps(path.parent, f".{glob.escape(path.name)}.*.tmp")
    return path.with_name(f".{path.name}.{os.urandom(4).hex()}.tmp")


def link_into_place(tmp: str | Path, path: Path) -> Path:
    """Link the finished file `tmp` to the first free numbered name of `path` (atomic: never replaces a file, even
    one made meanwhile), remove `tmp`, and return the name used."""
    os.chmod(tmp, 0o666 & ~umask())  # a mkstemp file is 0600: the result follows the umask like any output
    for n in itertools.count():
        target = path.with_name(f"{path.stem}-{n}{path.suffix}") if n else path
        with contextlib.suppress(FileExistsError):
            os.link(tmp, target)
            os.unlink(tmp)
            return target


def umask() -> int:
    """The process umask (read without changing it for longer than the call)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_new(path: Path, text: str) -> bool:
    """Write `text` to `path` only if no file is there yet (a temporary linked into place); False when taken."""
    tmp = linked_temp(path)
    try:
        tmp.write_text(text)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


STALE_TEMP_S = 3600  # a writer's temporary untouched this long is a killed writer's (a live one writes, then renames)


def remove_stale_temps(folder: Path, pattern: str) -> None:
    """Remove the temporaries matching the glob `pattern` in `folder` that writers killed mid-write left (`atomic_write`
    removes its own on any exception, not on SIGKILL or the OOM killer): those untouched for `STALE_TEMP_S`."""
    for tmp in folder.glob(pattern):
        with contextlib.suppress(OSError):  # gone meanwhile: its writer finished
            if time.time() - tmp.stat().st_mtime > STALE_TEMP_S:
                tmp.unlink()


def atomic_write(path: str | Path, write: Callable[[Path], None], *, keep_suffix: bool = False,
                 mode: int | None = None) -> Path:
    """`write(tmp)` fills a hidden temporary beside `path` (ending in `path`'s suffix with `keep_suffix`, for writers
    that pick the format from the name), given `mode` (default: the umask's), fsynced and renamed over `path`. On
    failure the temporary is removed and an earlier `path` is left untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix if keep_suffix else ".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~umask() if mode is None else mode)  # mkstemp makes 0600
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # a killed earlier writer's temporary of `path` (a training state's or a layout's size) goes at this write
    remove_stale_temps(path.parent, f".{glob.escape(path.name)}.*{path.suffix if keep_suffix else '.tmp'}")
    return path


def written_elsewhere(entry: Path, name: str) -> bool:
    """Whether `entry` is another process's file in flight, no other program's: an `atomic_write` temporary of a file
    `name` beside it (a data-parallel run's ranks, a Slurm array's tasks, all write their run record) or a space
    probe (`check_space`: a named file where the filesystem has no O_TMPFILE; NFS renames an open one `.nfs` and a
    hex id until it is closed)."""
    return (entry.name.startswith(f".{name}.") and entry.name.endswith(".tmp")) or entry.name.startswith(IN_FLIGHT)


def atomic_write_bytes(path: str | Path, data: bytes, **kw) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_bytes(data), **kw)


def atomic_write_text(path: str | Path, text: str, **kw) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), **kw)


def atomic_dir(folder: str | Path, fill: Callable[[Path], None], *, tag: str = "-",
               guard: Callable[[], AbstractContextManager] | None = None) -> Path:
    """`fill(tmp)` fills a hidden temporary folder beside `folder` (0700: `fill` sets other permissions), which then
    replaces it (`swap_dir`, inside `guard()` when given). On failure an earlier `folder` is left as it was."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp{tag}", dir=folder.parent))
    try:
        fill(tmp)
        with guard() if guard else nullcontext():
            swap_dir(tmp, folder, old_prefix=f".{folder.name}.old{tag}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def swap_dir(tmp: Path, folder: Path, old_prefix: str) -> None:
    """Rename `tmp` to `folder`: an existing `folder` is first renamed onto a fresh empty `<old_prefix><random>`
    (atomic, and never another writer's name), then removed; if `tmp` cannot take its place it is renamed back."""
    if not folder.exists():
        os.replace(tmp, folder)
        return
    old = Path(tempfile.mkdtemp(prefix=old_prefix, dir=folder.parent))
    try:
        os.replace(folder, old)
    except BaseException:
        old.rmdir()
        raise
    try:
        os.replace(tmp, folder)
    except BaseException:
        with contextlib.suppress(OSError):  # the old folder back, unless another writer's took the name meanwhile
            os.replace(old, folder)
        raise
    shutil.rmtree(old, ignore_errors=True)


def file_digest(path: Path | str) -> str:
    """sha256 (16 hex) of a file's bytes: what a run or a cache keys an input file by."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
