"""`specgen export-mesh`: BPT token sequences (generate's JSON lines, or stdin) -> obj/ply/stl/off/glb files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli import _output
from cli._errors import command
from cli._options import Format, FormatOpt, QuietOpt, out_path, prompt_source
from specgen.data.prompts import json_lines, read_text
from specgen.errors import UsageError
from specgen.paths import check_output_dir

EPILOG = """examples:

  specgen generate --method xspecmesh --num 2 --format json > meshes.jsonl

  specgen export-mesh meshes.jsonl --out-dir out/ --mesh-format glb --preview

  specgen generate --method ar --model mesh-gpt-tiny -n 1 -f json | specgen export-mesh - -o out/ --mesh-format ply
"""

COLUMNS = ["name", "valid", "faces", "vertices", "degenerate_removed", "duplicate_removed", "file", "error"]
#: a key of another modality's `generate --format json` record -> that modality (its token ids are no mesh's)
OTHER_RECORDS = {"completion": "a text", "images": "an image"}


def read_sequences(source: str | None) -> list[tuple[str, list[int]]]:
    """(name, tokens) per non-empty line of a file or stdin ("-", or no argument when stdin is not a terminal)."""
    if source is None and sys.stdin.isatty():
        raise UsageError("no input: name a JSONL file from `specgen generate --format json`, or pipe one in "
                         "(specgen generate ... -f json | specgen export-mesh -o out/)")
    src = read_text(source or "-", "token file")
    out = []
    for n, obj in json_lines(src):
        other = next((OTHER_RECORDS[k] for k in OTHER_RECORDS if isinstance(obj, dict) and k in obj), None)
        if other:
            raise UsageError(f"{src.name} line {n} is {other} generation ({obj.get('model', 'a model')}), not mesh "
                             "tokens: give the `specgen generate --format json` output of a mesh model")
        tokens = obj.get("token_ids") if isinstance(obj, dict) else obj
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise UsageError(f"{src.name} line {n}: expected a JSON list of integer token ids or an object with "
                             "token_ids")
        if any(abs(t) >= 2 ** 31 for t in tokens):
            raise UsageError(f"{src.name} line {n}: a token id beyond 2**31 is no token of any mesh tokenizer")
        name = obj.get("name") if isinstance(obj, dict) and obj.get("name") else f"mesh-{len(out):03d}"
        stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(name)[:100]).strip(".")  # 100: room for
        out.append((stem or "mesh", tokens))  # "-N.png" within a file name's 255 bytes, even in 2-byte characters
    if not out:
        raise UsageError("no token sequences in the input")
    return out


@command
def export_mesh(
    source: Annotated[Optional[str], typer.Argument(
        help="JSONL from `generate --format json` (token_ids per line), or - for stdin (the default when stdin is "
             "a pipe; on a terminal a file must be named).", parser=prompt_source, show_default=False)] = None,
    out_dir: Annotated[Path, typer.Option("--out-dir", "-o", parser=out_path, help="Folder for the mesh files; files already there are "
                                          "kept (new names get -1, -2, ...).")] = Path("meshes"),
    mesh_format: Annotated[str, typer.Option(
        "--mesh-format", help="File format of the meshes: obj, ply, stl, off or glb (the last three binary).")] = "obj",
    preview: Annotated[bool, typer.Option("--preview", help="Also write a PNG preview per mesh.")] = False,
    fmt: FormatOpt = Format.table,
    quiet: QuietOpt = False,
) -> None:
    """Turn generated mesh token sequences into mesh files (trimesh), reporting faces, vertices and validity."""
    from cli.generate_mesh import check_any_valid, export_sequences, format_name  # deferred: start-up (torch, trimesh)

    mesh_format = format_name(mesh_format)
    check_output_dir(out_dir)  # before reading: a file, an unwritable path or a full device is refused
    rows = export_sequences(read_sequences(source), out_dir, mesh_format, preview)  # a failed write: one line
    check_any_valid(rows, "sequences decodes to a mesh", "nothing written")
    bad = [r for r in rows if not r["valid"]]
    for r in bad if not quiet else []:
        _output.err.print(f"warning: {r['name']}: {r['error']}; nothing written for it", markup=False)
    if fmt == Format.json:
        for r in rows:
            _output.emit_json(r)
    else:
        _output.table(f"export-mesh -> {out_dir} ({mesh_format})", rows, COLUMNS, _output.out)
