"""Error boundary for commands: SpecgenError, Click usage errors and unexpected failures become one line + exit code."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import warnings

import typer
from typer._click.exceptions import ClickException, NoArgsIsHelpError
from typer.core import TyperGroup

from specgen.errors import SpecgenError
from specgen.paths import ADVICE


#: Exit status when the reader of stdout leaves: 128 + SIGPIPE, what a shell reports for a filter killed by it.
BROKEN_PIPE = 141


def debug() -> bool:
    return os.environ.get("SPECGEN_DEBUG") == "1"


def one_line(text: str) -> str:
    """Collapse a possibly multi-line message into one line."""
    return " ".join(str(text).split())


def fail(message: str, code: int) -> typer.Exit:
    """Print `error: message` (one line) on stderr and return the Exit to raise."""
    hint = "" if debug() else " (SPECGEN_DEBUG=1 shows a traceback)" if code == 1 else ""
    print(f"error: {one_line(message)}{hint}", file=sys.stderr, flush=True)
    return typer.Exit(code)


def command(fn):
    """Wrap a command so errors exit 2 (usage) or 1 (runtime) with one line (a traceback only when debugging);
    warnings are held back and printed as `warning:` lines only on success."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if debug():
            return fn(*args, **kwargs)
        stdout = sys.stdout = WatchedStdout(sys.stdout)
        with warnings.catch_warnings(record=True) as caught:  # the active filters decide what is recorded
            try:
                result = fn(*args, **kwargs)
                sys.stdout.flush()  # results still buffered: a full device there is the command's failure
            except SpecgenError as e:
                raise fail(str(e), e.exit_code) from None
            except KeyboardInterrupt:
                raise fail("interrupted", 130) from None
            except BrokenPipeError:  # the reader of stdout left (`| head`): no message, and the status of a
                silence_stdout()  # Unix filter that SIGPIPE ended, so `set -o pipefail` scripts read it as they do
                raise typer.Exit(BROKEN_PIPE) from None
            except MemoryError:
                raise fail("out of memory: use a smaller model, batch or token budget", 1) from None
            except OSError as e:  # a file system refusal nobody checked for: the path, why, what to do
                if stdout.failed is e:  # writing the results failed: silenced, so the final flush fails no more
                    silence_stdout()
                what = "stdout (the results)" if stdout.failed is e else e.filename
                reason = e.strerror or str(e) or type(e).__name__
                why = f"{reason}; {ADVICE.get(e.errno, 'check the path and its permissions')}"
                raise fail(f"cannot write {what}: {why}" if what else why, 1) from None
            except Exception as e:  # unexpected: still one line unless SPECGEN_DEBUG=1
                if isinstance(e, (typer.Exit, typer.Abort)) or type(e).__module__.startswith("typer"):
                    raise  # Typer's own exits and usage errors (its click is private, so matched by module)
                raise fail(f"{type(e).__name__}: {e}", 1) from None
            finally:
                sys.stdout = stdout.file
        for message in dict.fromkeys(f"{w.category.__name__}: {one_line(w.message)}" for w in caught):
            print(f"warning: {message}", file=sys.stderr)
        return result

    return wrapper


class WatchedStdout:
    """sys.stdout while a command runs, remembering the OSError a write to it raised (the results' device is full)."""

    def __init__(self, file) -> None:
        self.file, self.failed = file, None

    def write(self, text: str) -> int:
        return self.watched(self.file.write, text)

    def flush(self) -> None:
        self.watched(self.file.flush)

    def watched(self, call, *args):
        try:
            return call(*args)
        except OSError as e:
            self.failed = e
            raise

    def __getattr__(self, name: str):
        return getattr(self.file, name)


def silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not report the broken pipe again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # not a real file (tests): nothing to flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class OneLineGroup(TyperGroup):
    """The app's group: Click's own usage errors print one `error:` line naming the command's --help and exit 2."""

    def main(self, args=None, prog_name=None, complete_var=None, **extra):
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except NoArgsIsHelpError as e:
            e.show()
            sys.exit(e.exit_code)
        except ClickException as e:
            ctx = getattr(e, "ctx", None)
            where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            print(f"error: {one_line(e.format_message())}{where}", file=sys.stderr, flush=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            print("error: aborted", file=sys.stderr, flush=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)
