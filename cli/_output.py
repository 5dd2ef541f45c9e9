"""Output helpers: results to stdout (table or JSON), tables/progress/logs to stderr."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterable

from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from specgen.errors import RuntimeFailure, UsageError
from specgen.paths import ADVICE, check_space, nearest_existing, remove_empty_dirs, write_new


class ResultsConsole(Console):
    """stdout's console: a reader that leaves (`| head`) raises BrokenPipeError to the command's error boundary (exit
    141, no message), where Rich's own handler would exit 1."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError


err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
out = ResultsConsole(soft_wrap=True, highlight=False, width=None if sys.stdout.isatty() else 160)


def emit_json(obj: Any) -> None:
    """One JSON document (or JSON line) on stdout."""
    print(json.dumps(obj, default=str), flush=True)


def emit_text(text: str, end: str = "\n") -> None:
    """A result (a completion, a file's path) on stdout byte for byte: Rich's print would read `[...]` as markup,
    `:smile:` as an emoji code, expand tabs and drop control characters, so a generated Makefile or a folder named
    `runs [a]` would come out altered."""
    print(text, end=end, flush=True)


LEFT = ("method", "prompt", "name", "kind", "ref", "check", "detail", "item", "value")  # columns of words, not numbers


def table(title: str, rows: Iterable[dict], columns: list[str], console: Console = err) -> None:
    """Render dict rows as a Rich table (missing values show as '-'). Title and cells are text as given: a str would
    be read as markup and emoji codes, so a user-given name or path (a category `[red]chat`, a row `ngram@a:b`,
    `SPECGEN_HOME="runs [a]"`) printed changed."""
    t = Table(title=Text(title, style="table.title"))
    for c in columns:
        t.add_column(c, justify="left" if c in LEFT else "right")
    for r in rows:
        t.add_row(*[console.render_str(fmt(r.get(c)), markup=False, emoji=False) for c in columns])
    if console.is_terminal:  # a terminal's width: Rich shortens what does not fit
        console.print(t)
        return
    # a file or a pipe (a log, `| less -S`) gets every column whole: a shortened header (`exact_m…`) names no column
    width = console.width
    console.width = max(width, Measurement.get(console, console.options.update_width(1 << 16), t).maximum)
    try:
        console.print(t)
    finally:
        console.width = width


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


@contextmanager
def progress(description: str, total: int | None, quiet: bool = False):
    """A transient stderr progress bar; yields advance(n=1, **fields). Off when stderr is not a terminal (a bar
    there is noise, and Rich ends it with a blank line that would precede an error line)."""
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[info]}"), console=err, transient=True, disable=quiet or not err.is_terminal)
    with bar:
        task = bar.add_task(description, total=total, info="")

        def advance(n: int = 1, info: str = "", **kw) -> None:
            bar.update(task, advance=n, info=info, **kw)

        yield advance


def item_done(what: str, done: int, total: int, detail, quiet: bool = False) -> None:
    """One stderr line as an item of a run (an image, a mesh) is done: `image 3/8: path`."""
    if not quiet:
        err.print(f"{what} {done}/{total}: {detail}", markup=False, emoji=False, highlight=False, soft_wrap=True)


@contextmanager
def writing(what: str, folder) -> None:
    """One write of `what` files into `folder` (made by the first) as a run goes: a write the device or file system
    refuses (full, read-only, permissions) is one line, exit 1, naming the folder, not the temporary the atomic
    writer used; files written before it stay, a folder made for nothing goes."""
    base = nearest_existing(folder)
    try:
        yield
    except OSError as e:
        remove_empty_dirs(folder, base)
        raise RuntimeFailure(f"cannot write {what} in {folder} ({e.strerror or e}); "
                             f"{ADVICE.get(e.errno, 'write elsewhere')}") from None


def registry_progress(quiet: bool = False):
    """A callback for registry materialisation (label, done, total) drawing a progress bar."""
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=err, transient=True,
                   disable=quiet or not err.is_terminal)
    tasks: list = []

    def cb(label: str, done: int, total: int) -> None:
        if not tasks:
            bar.start()
            tasks.append(bar.add_task(label + " (first use only)", total=total))
        bar.update(tasks[0], completed=done)
        if done >= total:
            bar.stop()

    return cb


def check_rows_path(out, append: bool = False) -> None:
    """Refuse a --out destination before any work is done: an existing file (rows never replace a file; with
    `append` they are added to it, unless its last line is torn and no JSON) or folder, a missing parent, or a
    parent where this user cannot write a small probe file (no folder, permissions, a full device)."""
    if out is None:
        if append:
            raise UsageError("--append adds rows to the --out file; name one with --out FILE")
        return
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder; name a new JSONL file")
    if append and out.is_file():
        if not os.access(out, os.W_OK):
            raise UsageError(f"--out {out} is not writable")
        check_tail(out)
    elif out.exists() or out.is_symlink():
        raise UsageError(f"--out {out} already exists; rows never replace a file: add --append, remove it or "
                         "name a new file")
    elif not out.parent.exists():
        raise UsageError(f"output folder does not exist: {out.parent}")
    check_space(out.parent, f"--out {out}")  # also a parent that is no folder, or one this user cannot write in


def check_tail(path) -> None:
    """A JSONL file whose last line has no newline (a cut-off write) is appended to after a newline when that
    line is whole JSON (repaired); a torn line that is no JSON is refused, naming it, rather than written onto."""
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    try:
        json.loads(data.rsplit(b"\n", 1)[-1])
    except ValueError:
        line = data.count(b"\n") + 1
        raise UsageError(f"--out {path}: its last line (line {line}) is torn (no newline, not JSON: a cut-off write); "
                         "remove that line or name a new file") from None


def write_rows(out, rows: list[dict], append: bool = False) -> None:
    """Rows as JSONL to a new `out` (whole or not at all, never replacing a file) or, with `append`, to its end in
    one write; when the write fails anyway (a full device) the rows go to stdout before the error."""
    if out is None:
        return
    text = "".join(json.dumps(r, default=str) + "\n" for r in rows)
    try:
        if append and out.is_file():
            fd = os.open(out, os.O_RDWR | os.O_APPEND)  # one write, after a newline when the last row lacks one
            try:
                size = os.fstat(fd).st_size
                os.write(fd, (("\n" if size and os.pread(fd, 1, size - 1) != b"\n" else "") + text).encode())
            finally:
                os.close(fd)
        elif not write_new(out, text):
            raise RuntimeFailure(f"--out {out} was created by someone else meanwhile; it was left as it is")
    except OSError as e:
        print(text, end="", flush=True)
        raise RuntimeFailure(f"cannot write --out {out} ({e.strerror or e}); the rows went to stdout instead") from None
