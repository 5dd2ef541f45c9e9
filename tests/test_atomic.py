"""The one set of atomic writers in specgen.paths: a file or folder appears whole or not at all, an earlier one is
replaced in one rename, and a failing writer leaves the earlier one untouched and no temporary behind."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from specgen.paths import atomic_dir, atomic_write, atomic_write_bytes, atomic_write_text, write_linked, write_new


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_atomic_write_creates_and_replaces(tmp_path):
    path = tmp_path / "sub" / "a.json"
    assert atomic_write_text(path, "one\n") == path  # the parent folder is created
    assert path.read_text() == "one\n"
    atomic_write_bytes(path, b"\x00two")
    assert path.read_bytes() == b"\x00two"
    seen = []
    atomic_write(path, lambda tmp: (seen.append(tmp), tmp.write_text("three")))
    assert path.read_text() == "three" and names(path.parent) == ["a.json"]
    tmp = seen[0]  # a hidden name beside the target, ending in .tmp (never matching a glob of *.json)
    assert isinstance(tmp, Path) and tmp.parent == path.parent and tmp.name.startswith(".a.json.")
    assert tmp.name.endswith(".tmp")
    atomic_write_text(path, "four")
    assert path.read_text() == "four" and names(path.parent) == ["a.json"]


def test_atomic_write_keeps_the_suffix_when_asked(tmp_path):
    seen = []
    atomic_write(tmp_path / "plot.png", lambda tmp: (seen.append(tmp.name), tmp.write_bytes(b"png")),
                 keep_suffix=True)
    assert seen[0].startswith(".plot.png.") and seen[0].endswith(".png")
    assert names(tmp_path) == ["plot.png"]


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_write_follows_the_umask_or_mode(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        atomic_write_text(tmp_path / "b.txt", "x", mode=0o640)
    finally:
        os.umask(old)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == mode  # not mkstemp's 0600
    assert (tmp_path / "b.txt").stat().st_mode & 0o777 == 0o640


def test_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "model.safetensors"
    atomic_write_text(path, "old")

    def fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(path, fail)
    assert path.read_text() == "old" and names(tmp_path) == ["model.safetensors"]
    with pytest.raises(RuntimeError):
        atomic_write(tmp_path / "new.json", fail)
    assert names(tmp_path) == ["model.safetensors"]


def test_failing_rename_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "keep.txt"
    path.write_text("old")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(path, "new")
    assert path.read_text() == "old" and names(tmp_path) == ["keep.txt"]


def fill_with(files: dict[str, str]):
    def fill(tmp: Path) -> None:
        for name, text in files.items():
            (tmp / name).write_text(text)
    return fill


def test_atomic_dir_creates_and_swaps_a_folder(tmp_path):
    folder = tmp_path / "runs" / "ckpt"
    assert atomic_dir(folder, fill_with({"a.txt": "1", "b.txt": "2"})) == folder
    assert names(folder) == ["a.txt", "b.txt"] and names(folder.parent) == ["ckpt"]
    atomic_dir(folder, fill_with({"c.txt": "3"}))  # the old folder's files do not survive the swap
    assert names(folder) == ["c.txt"] and (folder / "c.txt").read_text() == "3"
    assert names(folder.parent) == ["ckpt"]  # no temporary nor old folder left


def test_failing_fill_leaves_the_old_folder(tmp_path):
    folder = tmp_path / "ckpt"
    atomic_dir(folder, fill_with({"a.txt": "old"}))

    def fail(tmp: Path) -> None:
        (tmp / "a.txt").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_dir(folder, fail)
    assert names(tmp_path) == ["ckpt"] and (folder / "a.txt").read_text() == "old"
    with pytest.raises(RuntimeError):
        atomic_dir(tmp_path / "new", fail)
    assert names(tmp_path) == ["ckpt"]


def test_failing_swap_puts_the_old_folder_back(tmp_path, monkeypatch):
    folder = tmp_path / "ckpt"
    atomic_dir(folder, fill_with({"a.txt": "old"}))
    real = os.replace

    def second_fails(src, dst):
        if Path(src).name.startswith(".ckpt.tmp"):
            raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(os, "replace", second_fails)
    with pytest.raises(OSError, match="disk full"):
        atomic_dir(folder, fill_with({"a.txt": "new"}))
    assert names(tmp_path) == ["ckpt"] and (folder / "a.txt").read_text() == "old"


def test_atomic_dir_guard_runs_around_the_swap_and_may_refuse(tmp_path):
    folder, events = tmp_path / "entry", []

    @contextmanager
    def guard():
        events.append(("enter", folder.exists()))
        yield
        events.append(("exit", folder.exists()))

    atomic_dir(folder, fill_with({"a": "1"}), tag="-host-1-", guard=guard)
    assert events == [("enter", False), ("exit", True)]

    @contextmanager
    def refuse():
        raise ValueError("taken meanwhile")
        yield

    with pytest.raises(ValueError, match="taken meanwhile"):
        atomic_dir(folder, fill_with({"a": "2"}), tag="-host-1-", guard=refuse)
    assert names(tmp_path) == ["entry"] and (folder / "a").read_text() == "1"


def test_write_new_of_two_racing_writers_gives_the_file_to_one(tmp_path, monkeypatch):
    """A second writer (another host or container: pids may repeat) that writes and links between the first one's
    temporary and its link takes the file; the first gets False, and no temporary is left."""
    link, out = os.link, tmp_path / "run.json"

    def racing(src, dst):
        monkeypatch.setattr(os, "link", link)
        assert write_new(out, "B")  # after A's temporary is written, before A links it
        link(src, dst)

    monkeypatch.setattr(os, "link", racing)
    monkeypatch.setattr(os, "getpid", lambda: 1)
    assert not write_new(out, "A")
    assert out.read_text() == "B" and [p.name for p in tmp_path.iterdir()] == ["run.json"]


@pytest.mark.parametrize("writer", ["write_linked", "write_new"])
def test_a_killed_writers_temporary_goes_at_the_next_linked_write(tmp_path, writer):
    """`kill -9` of `specgen generate -o DIR` while it wrote an image or mesh left its `.<name>.<8 hex digits>.tmp` in
    DIR for good; the next write of that name (linked to a free numbered one or not) removes one untouched for an hour and
    keeps a fresh one (a live writer's) and other files' temporaries."""
    import time

    out = tmp_path / "a.png"
    stale, live, other = (tmp_path / n for n in (".a.png.ab12cd34.tmp", ".a.png.ef56ab78.tmp", ".b.png.ab12cd34.tmp"))
    for f in (stale, live, other):
        f.write_bytes(bytes(64))
    os.utime(stale, (time.time() - 2 * 3600,) * 2)
    os.utime(other, (time.time() - 2 * 3600,) * 2)
    if writer == "write_linked":
        out.write_bytes(b"earlier")  # the new file takes a free numbered name; the sweep is of the requested name's
        assert write_linked(out, lambda tmp: tmp.write_bytes(b"png")) == tmp_path / "a-1.png"
    else:
        assert write_new(out, "png")
    assert not stale.exists() and live.exists() and other.exists()


def test_paths_imports_nothing_heavy():
    code = ("import sys, specgen.paths; heavy = {'torch', 'numpy', 'safetensors', 'matplotlib', 'PIL'} & "
            "set(sys.modules); print(sorted(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
