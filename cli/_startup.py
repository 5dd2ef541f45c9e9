"""A command's first import of torch and specgen without the cyclic collector; what it made is frozen, never scanned."""

from __future__ import annotations

import contextlib
import gc
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
