"""Error boundary for commands: SpecgenError and unexpected failures become one line + exit code."""

from __future__ import annotations

import functools
import os
import sys

import typer

from specgen.errors import SpecgenError


def debug() -> bool:
    return os.environ.get("SPECGEN_DEBUG") == "1"


def fail(message: str, code: int) -> typer.Exit:
    """Print `error: message` on stderr and return the Exit to raise."""
    hint = "" if debug() else " (SPECGEN_DEBUG=1 shows a traceback)" if code == 1 else ""
    print(f"error: {message}{hint}", file=sys.stderr)
    return typer.Exit(code)


def command(fn):
    """Wrap a command so errors exit 2 (usage) or 1 (runtime) with one line; traceback only when debugging."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SpecgenError as e:
            if debug():
                raise
            raise fail(str(e), e.exit_code) from None
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None
        except Exception as e:  # unexpected: still one line unless SPECGEN_DEBUG=1
            if debug() or is_cli_control(e):
                raise
            raise fail(f"{type(e).__name__}: {e}", 1) from None

    return wrapper


def is_cli_control(e: Exception) -> bool:
    """Typer's own exits and usage errors (its click is private, so match by module)."""
    return isinstance(e, (typer.Exit, typer.Abort)) or type(e).__module__.startswith("typer")
