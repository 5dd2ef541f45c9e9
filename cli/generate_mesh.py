"""Mesh runner of `specgen generate`: rows on stdout (JSON lines carry the `token_ids` export-mesh reads), files."""

from __future__ import annotations

from pathlib import Path

from cli import _output
from cli._options import Format
from specgen.config import load_config
from specgen.errors import RuntimeFailure, UsageError
from specgen.generate.mesh import (MeshGenConfig, check_budget, decode_tokens, generate_meshes, load_conditions,
                                  load_mesh_model, mesh_options)
from specgen.mesh.export import export_mesh, format_name, render_png
from specgen.mesh.procedural import ProceduralSpec
from specgen.methods import MethodSpec
from specgen.paths import check_output_dir, free_stem, write_linked
from specgen.request import parse_request

COLUMNS = ["name", "method", "num_tokens", "faces", "vertices", "valid", "scr", "step_latency_ms", "wall_s", "file"]


def run(args, spec: MethodSpec) -> None:
    if args.point_clouds is not None and args.num is not None:  # else --num would be silently ignored
        raise UsageError("--num counts the procedural test meshes; with --point-clouds each cloud is decoded once")
    cfg = load_config(MeshGenConfig, args.config, args.overrides, spec, method=spec.name,
                      max_new_tokens=args.max_new_tokens, num=args.num, **args.recipe)
    req = parse_request(cfg, "mesh", spec)
    cfg = req.cfg  # as parsed: `model: NAME+int8` is NAME with quantize int8
    mesh_format = format_name(cfg.mesh_format)
    if args.out_dir is not None:
        check_output_dir(args.out_dir)  # before the load; created with the first mesh file
    elif cfg.preview or mesh_format != MeshGenConfig.mesh_format:  # they shape files: else silently no file at all
        raise UsageError("preview and mesh_format shape the files --out-dir writes: add --out-dir DIR (or pipe "
                         "--format json into `specgen export-mesh`)")
    opts = mesh_options(req)
    heads = opts.heads if spec.name == "xspecmesh" else None
    check_budget(cfg.model, heads, cfg, opts)  # from the configs: before the weights load
    loaded = load_mesh_model(cfg.model, heads, req.device, cfg.dtype, cfg.quantize, cfg.graphs)
    conds = load_conditions(args.point_clouds, cfg.num, int(loaded.target.meta.get("num_points", 2048)), cfg.seed,
                            ProceduralSpec.from_meta(loaded.target.meta))  # MeshInputError: exit 2 (cli/_errors.py)
    files: dict[int, list[str]] = {}

    def done(i: int, s) -> None:  # each file as its mesh is done: an interrupted run keeps the finished ones
        files[i] = []
        if args.out_dir is not None and not s.error:  # an invalid mesh writes nothing
            path, png = write_files(s.vertices, s.faces, args.out_dir, s.name, mesh_format, cfg.preview)
            files[i] = [str(path)] + ([png] if png else [])
        detail = files[i][0] if files[i] else f"{s.name} decoded"
        _output.item_done("mesh", len(files), len(conds), detail, args.quiet)

    samples = generate_meshes(loaded, conds, req, on_mesh=done)
    rows = [row(s, req, loaded, files[i], opts) for i, s in enumerate(samples)]
    for r in rows:
        if args.fmt == Format.json:
            _output.emit_json(r)
        elif r["error"] and not args.quiet:
            _output.err.print(f"warning: {r['name']}: {r['error']}; nothing written for it", markup=False)
    if args.fmt == Format.table:
        label = spec.name + (f" ({opts.label()}, {fidelity(opts, loaded)})" if spec.name == "xspecmesh" else "")
        _output.table(f"{label} on {req.model_label(loaded.target.ref)}", [{**r, **r["stats"]} for r in rows], COLUMNS,
                      _output.out)
    if args.out_dir is not None:
        check_any_valid(rows, "meshes decodes", f"nothing written to {args.out_dir}")


def fidelity(opts, loaded) -> str:
    """Whose distribution an xspecmesh run keeps: the model's, the LoRA-merged model's, or none (lossy rules)."""
    if not opts.lossless:
        return "lossy"
    return "lossless w.r.t. the LoRA-merged backbone" if loaded.adapter else "lossless"


def row(s, req, loaded, files: list[str], opts) -> dict:
    """The JSON row of one sample and its written files. `lossless`: distributed as the named model's own samples
    (ar, or xspecmesh with criterion rejection, no merged adapter)."""
    cfg = req.cfg
    return {"name": s.name, "method": cfg.method, "model": req.model_label(loaded.target.ref),
            "heads": loaded.heads.ref if loaded.heads else None,
            "adapter": loaded.adapter.ref if loaded.adapter else None,
            "lossless": cfg.method == "ar" or fidelity(opts, loaded) == "lossless",
            "token_ids": s.tokens, "num_tokens": len(s.tokens),
            "faces": 0 if s.faces is None else len(s.faces), "vertices": 0 if s.vertices is None else len(s.vertices),
            "valid": not s.error, "error": s.error, "degenerate_removed": s.degenerate_removed,
            "duplicate_removed": s.duplicate_removed, "files": files, "file": files[0] if files else "-",
            "stats": s.stats}


def write_files(vertices, faces, out_dir: Path, name: str, mesh_format: str, preview: bool) -> tuple:
    """(the mesh file's path, the PNG preview's path or None) of one mesh under a free name (earlier files are kept)."""
    with _output.writing("meshes", out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = free_stem(out_dir, name, (f".{mesh_format}", ".png"))
        # each file linked to a free name (never replacing one another run wrote meanwhile), as images are
        path = write_linked(out_dir / f"{stem}.{mesh_format}",
                            lambda tmp: export_mesh(vertices, faces, tmp, mesh_format))
        png = write_linked(path.with_suffix(".png"), lambda tmp: render_png(vertices, faces, tmp)) if preview else None
        return path, None if png is None else str(png)


def check_any_valid(rows: list[dict], what: str, outcome: str) -> None:
    """A run of which no row decoded to a mesh wrote nothing: one line, exit 1 (generate -o and export-mesh alike)."""
    if rows and not any(r["valid"] for r in rows):
        raise RuntimeFailure(f"none of the {len(rows)} {what} ({rows[0]['name']}: {rows[0]['error']}); {outcome}")


def export_sequences(seqs: list[tuple[str, list[int]]], out_dir: Path, mesh_format: str, preview: bool) -> list[dict]:
    """`specgen export-mesh`: decode and write each (name, tokens) sequence; one row each."""
    rows = []
    for name, tokens in seqs:  # a name given twice: its second file is numbered (`write_files`), as any other's
        v, f, err, deg, dup = decode_tokens(tokens)
        r = {"name": name, "num_tokens": len(tokens), "valid": not err, "error": err, "faces": 0, "vertices": 0,
             "degenerate_removed": deg, "duplicate_removed": dup, "file": "-", "preview": None}
        if not err:
            path, r["preview"] = write_files(v, f, out_dir, name, mesh_format, preview)
            r.update(faces=len(f), vertices=len(v), file=str(path))  # decode_tokens cleaned it: as written
        rows.append(r)
    return rows
