"""The `specgen` app: registers one function per command (each wrapped by the error boundary)."""

from __future__ import annotations

import signal

import typer

from cli import (benchmark, collect_trajectories, distill, env, export_mesh, generate, registry_cmd, train_heads,
                 train_upsampler)
from cli._errors import OneLineGroup
from cli._process import end

app = typer.Typer(
    name="specgen",
    cls=OneLineGroup,
    help="Speculative and parallel decoding for autoregressive generators (text, image, mesh).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
for module in (generate, benchmark, train_heads, collect_trajectories, distill, export_mesh, train_upsampler, env):
    name = module.__name__.removeprefix("cli.")  # each command is its module's function of the same name
    app.command(name.replace("_", "-"), epilog=module.EPILOG)(getattr(module, name))
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


if __name__ == "__main__":
    main()
