"""Tile ground truth and generated mesh previews into one image (the README's mesh gallery).

    specgen generate --method ar --model mesh-gpt-tiny --num 6 --out-dir runs/gallery/ar preview=true
    specgen generate --method xspecmesh --num 6 --out-dir runs/gallery/xspecmesh preview=true
    python scripts/mesh_gallery.py runs/gallery/ar runs/gallery/xspecmesh --out docs/mesh_gallery.png

Row 1 renders the procedural test meshes the point clouds were sampled from (`test-<seed>` names,
under the backbone's recorded ProceduralSpec); each further row is one `--out-dir` of `generate`.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from specgen import checkpoints
from specgen.image.grid import image_grid
from specgen.mesh.export import render_png
from specgen.mesh.procedural import ProceduralSpec, generate_mesh

TILE = 200  # pixels per preview


def ground_truth(names: list[str], model: str, tmp: Path) -> list[Path]:
    """Render the procedural test mesh behind each `test-<seed>` name."""
    spec = ProceduralSpec.from_meta(checkpoints.find(model).meta)
    paths = []
    for name in names:
        mesh = generate_mesh(int(name.split("-")[-1]), spec)
        paths.append(render_png(mesh.vertices, mesh.faces, tmp / f"{name}.png"))
    return paths


def tile(rows: list[tuple[str, list[Path]]], out: Path) -> None:
    """One labelled row of previews per (label, paths), tiled by `image_grid`; a missing preview stays blank."""
    label_w, cols = 110, max(len(p) for _, p in rows)
    blank = torch.ones(3, TILE, TILE)  # white in [-1, 1]
    tiles = []
    for _, paths in rows:
        for c in range(cols):
            path = paths[c] if c < len(paths) else None
            if path is None or not path.exists():
                tiles.append(blank)
                continue
            im = np.asarray(Image.open(path).convert("RGB").resize((TILE, TILE)), dtype=np.float32)  # [H, W, 3]
            tiles.append(torch.from_numpy(im).permute(2, 0, 1) / 127.5 - 1)  # [3, H, W]
    grid = image_grid(torch.stack(tiles), nrow=cols, pad=0)
    sheet = Image.new("RGB", (label_w + grid.width, grid.height), "white")
    sheet.paste(grid, (label_w, 0))
    draw = ImageDraw.Draw(sheet)
    for r, (label, _) in enumerate(rows):
        draw.text((8, r * TILE + TILE // 2), label, fill="black")
    out.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(out, optimize=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="generate --out-dir folders (one row each)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="mesh-gpt-tiny", help="backbone whose ProceduralSpec made the test meshes")
    args = ap.parse_args()
    names = sorted(p.stem for p in args.dirs[0].glob("test-*.obj"))
    if not names:
        raise SystemExit(f"error: no test-<seed>.obj files in {args.dirs[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [("ground truth", ground_truth(names, args.model, Path(tmp)))]
        rows += [(d.name, [d / f"{n}.png" for n in names]) for d in args.dirs]
        tile(rows, args.out)
    print(f"wrote {args.out} ({len(names)} meshes x {len(rows)} rows)")


if __name__ == "__main__":
    main()
