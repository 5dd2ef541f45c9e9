"""The `specgen` app: registers one function per command (each wrapped by the error boundary)."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys

import typer

from cli import (benchmark, collect_trajectories, distill, env, export_mesh, generate, registry_cmd, train_heads,
                 train_upsampler)
from cli._errors import OneLineGroup

app = typer.Typer(
    name="specgen",
    cls=OneLineGroup,
    help="Speculative and parallel decoding for autoregressive generators (text, image, mesh).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("generate", epilog=generate.EPILOG)(generate.generate)
app.command("benchmark", epilog=benchmark.EPILOG)(benchmark.benchmark)
app.command("train-heads", epilog=train_heads.EPILOG)(train_heads.train_heads)
app.command("collect-trajectories", epilog=collect_trajectories.EPILOG)(collect_trajectories.collect_trajectories)
app.command("distill", epilog=distill.EPILOG)(distill.distill)
app.command("export-mesh", epilog=export_mesh.EPILOG)(export_mesh.export_mesh)
app.command("train-upsampler", epilog=train_upsampler.EPILOG)(train_upsampler.train_upsampler)
app.command("env", epilog=env.EPILOG)(env.env)
app.add_typer(registry_cmd.app, name="registry")


def main() -> None:
    """Console-script entry point; SIGTERM (timeout, kill, pre-emption) unwinds like Ctrl-C, so cleanups run; the
    process then ends without the interpreter's teardown (`end`)."""
    def terminate(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    try:
        app()
    except SystemExit as e:
        end(e.code)


def end(code) -> None:
    """Exit as `sys.exit(code)` does, less the interpreter's teardown: freeing every module and object one by one and
    torch's static destructors, work for a process about to vanish (a tenth of a warm `generate`). Exit handlers run
    and stdout/stderr are flushed first. Under a profiler or tracer (cProfile, coverage: they report after the program
    returns) the exit is the ordinary one."""
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


if __name__ == "__main__":
    main()
