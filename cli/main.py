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


if __name__ == "__main__":
    main()
