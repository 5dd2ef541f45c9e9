"""The process around a command: its first import of torch without the cyclic collector, its end without teardown."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys


@contextlib.contextmanager
def imports_frozen():
    """Run a command's deferred imports with the cyclic collector off, then freeze every object so later collections
    never scan them: the imports make hundreds of thousands of long-lived objects, and the full passes they would set
    off, each over all of them, are start-up time. Only while torch is not yet imported: before it no tensor exists,
    so the cyclic garbage frozen with them holds no weights; later (tests, several commands in one process) the
    collector runs as usual."""
    if "torch" in sys.modules:
        yield
        return
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


def open_closed_streams() -> None:
    """A standard stream the caller closed (`>&-`: Python then has None for it) is /dev/null: what goes there goes
    nowhere, as Python's print does without one, and its descriptor, the lowest free one, is taken, so no file
    opened later gets it (a compiler the native build starts would write into that file as its stdout)."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.open(os.devnull, os.O_RDWR), "r" if fd == 0 else "w", encoding="utf-8"))


def end(code) -> None:
    """Exit as `sys.exit(code)` does, less the interpreter's teardown: freeing every module and object one by one and
    torch's static destructors, work for a process about to vanish. Exit handlers run and stdout/stderr are flushed
    first. Under a profiler or tracer (cProfile, coverage: they report after the program returns) the exit is the
    ordinary one."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)
    status = code if isinstance(code, int) else 0 if code is None else 1
    if not isinstance(code, (int, type(None))):
        print(code, file=sys.stderr)  # as sys.exit("message") prints it
    atexit._run_exitfuncs()  # noqa: SLF001 - what the teardown would run first (weakref finalizers, logging, temp dirs)
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # a reader gone or stdout closed: the interpreter's own exit reports it as 120
        status = status or 120
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    os._exit(status)
