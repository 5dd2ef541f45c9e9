"""Output paths that never replace earlier files: numbered names, and folders checked before any work."""

from __future__ import annotations

import os
from pathlib import Path

from specgen.errors import UsageError


def nearest_existing(path: Path) -> Path:
    """`path` itself if it exists, else its nearest existing parent (what creating it would write into)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def creation_blocker(path: Path) -> tuple[Path, str] | None:
    """Why a folder `path` cannot be created or written: (the nearest existing path, "a file" or "not writable"),
    or None when it can."""
    probe = nearest_existing(path)
    if not probe.is_dir():
        return probe, "a file"
    if not os.access(probe, os.W_OK | os.X_OK):
        return probe, "not writable"
    return None


def check_output_dir(folder: Path, flag: str = "--out-dir") -> Path:
    """Refuse, before any work and without creating anything, an output folder that is a file or cannot be
    created or written (the folder itself appears when the first file is written)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"cannot create output folder {folder}: {flag} names a file")
    blocker = creation_blocker(folder)
    if blocker:
        raise UsageError(f"cannot create output folder {folder}: {blocker[0]} is {blocker[1]}")
    return folder


def free_stem(folder: Path, stem: str, suffixes: tuple[str, ...]) -> str:
    """`stem`, or `stem-1`, `stem-2`, ... : the first for which no `folder/stem+suffix` exists for any suffix
    (so a mesh and its preview keep one name, and an earlier run's files are never replaced)."""
    candidate, n = stem, 0
    while any((folder / f"{candidate}{s}").exists() for s in suffixes):
        n += 1
        candidate = f"{stem}-{n}"
    return candidate


def free_path(path: Path) -> Path:
    """`path`, or the first of `stem-1.ext`, `stem-2.ext`, ... that does not exist yet."""
    stem, suffix = path.name[: len(path.name) - len(path.suffix)], path.suffix
    return path.with_name(f"{free_stem(path.parent, stem, (suffix,))}{suffix}")


def link_into_place(tmp: str | Path, path: Path) -> Path:
    """Give the finished temporary file `tmp` the first free numbered name of `path` (atomic, never replacing a
    file, even one created meanwhile by another process), remove `tmp`, and return the name used."""
    stem, suffix = path.name[: len(path.name) - len(path.suffix)], path.suffix
    os.chmod(tmp, 0o666 & ~umask())  # a mkstemp file is 0600: the result follows the umask like any output
    n = 0
    while True:
        target = path if n == 0 else path.with_name(f"{stem}-{n}{suffix}")
        try:
            os.link(tmp, target)
        except FileExistsError:
            n += 1
            continue
        os.unlink(tmp)
        return target


def umask() -> int:
    """The process umask (read without changing it for longer than the call)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_new(path: Path, text: str) -> bool:
    """Write `text` to `path` only if no file is there yet: a hidden temporary linked into place, so a reader
    sees the whole file or none. False when the name was taken (by another process, possibly meanwhile)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink()


def replace_text(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically (a reader sees the old file or the new one, never a mix)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
