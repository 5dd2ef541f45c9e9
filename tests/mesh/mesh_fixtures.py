"""Tiny deterministic mesh models for the mesh tests (random weights, BPT vocabulary)."""

from __future__ import annotations

import numpy as np
import torch

from specgen import registry
from specgen.mesh.tokenizers import BPTTokenizer
from specgen.models.heads import HeadsConfig, XSpecMeshHeads
from specgen.models.mesh import MeshGPT
from tests.mesh.naive_tokenizer import NaiveTokenizer

NUM_POINTS = 256
TOKENIZERS: dict[str, type] = {"bpt": BPTTokenizer, "naive": NaiveTokenizer}


def tiny_kwargs(max_seq_len: int = 640) -> dict:
    decoder = dict(vocab_size=5121, dim=32, n_layers=2, n_heads=2, n_kv_heads=2, ffn_dim=64,
                   max_seq_len=max_seq_len, cross_dim=32)
    encoder = dict(width=32, num_latents=8, enc_layers=1, n_heads=2, num_freqs=4, out_dim=32)
    return {"decoder": decoder, "encoder": encoder}


def tiny_mesh_model(seed: int = 0) -> MeshGPT:
    torch.manual_seed(seed)
    return MeshGPT(**tiny_kwargs()).eval()


def tiny_heads(kind: str = "ca", seed: int = 1, num_heads: int = 3, scramble: bool = True,
               token_input: bool = False, res_layers: int = 1, history: int = 0) -> XSpecMeshHeads:
    torch.manual_seed(seed)
    heads = XSpecMeshHeads(**HeadsConfig(num_heads, kind, 32, 32, 2, 16, 5121, token_input, res_layers,
                                         history).to_dict())
    if scramble:  # leave the zero init so heads predict something other than the backbone
        for p in heads.parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, std=0.2)
    return heads.eval()


def register_tiny(target: str = "tiny-mesh", heads: str | None = "tiny-heads", parent: str | None = None) -> None:
    """target/<target> (+ heads/<heads> whose parent is `parent` or the target) in the test registry."""
    model = tiny_mesh_model()
    registry.save("target", target, model.state_dict(),
                  {"builder": "mesh_gpt", "kwargs": model.builder_kwargs(), "vocab_size": 5121,
                   "modality": "mesh", "tokenizer": "bpt", "num_points": NUM_POINTS, "max_tokens": 400}, force=True)
    if heads:
        h = tiny_heads()
        registry.save("heads", heads, h.state_dict(),
                      {"builder": "xspecmesh_heads", "kwargs": h.cfg.to_dict(), "parent": parent or target,
                       "vocab_size": 5121, "modality": "mesh"}, force=True)


def procedural_clouds(seeds) -> list[torch.Tensor]:
    """Point clouds [NUM_POINTS, 6] (float32) of the procedural test meshes of `seeds`."""
    from specgen.mesh.procedural import generate_mesh
    from specgen.mesh.pointcloud import point_cloud

    out = []
    for seed in seeds:
        g = generate_mesh(seed)
        out.append(torch.from_numpy(point_cloud(g.vertices, g.faces, NUM_POINTS, seed)))
    return out


def canonical_triangles(
    vertices: np.ndarray, faces: np.ndarray, *, oriented: bool = True
) -> list[tuple[tuple[float, float, float], ...]]:
    """Sorted faces as coordinate triples, independent of vertex and face order (round trips compare these).

    oriented=True rotates each triangle so its smallest corner comes first (winding kept); False sorts the corners.
    """
    v = np.asarray(vertices, dtype=np.float64)
    out = []
    for face in np.asarray(faces, dtype=np.int64).reshape(-1, 3):
        corners = [tuple(float(x) for x in v[i]) for i in face]
        if oriented:
            k = corners.index(min(corners))
            corners = corners[k:] + corners[:k]
        else:
            corners = sorted(corners)
        out.append(tuple(corners))
    return sorted(out)
