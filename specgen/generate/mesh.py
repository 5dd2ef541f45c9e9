"""Mesh generation from point clouds (user files, else procedural TEST ones) with `ar` or `xspecmesh` (docs/mesh.md)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import trimesh

from specgen import checkpoints
from specgen.data.arrays import read_npy
from specgen.errors import UsageError
from specgen.limits import decoder_context_of
from specgen.mesh.errors import MeshDecodeError, MeshInputError
from specgen.mesh.export import clean_mesh
from specgen.mesh.pointcloud import point_cloud, validate_point_cloud
from specgen.mesh.procedural import MESH_SUFFIXES, ProceduralSpec, generate_mesh, load_mesh, split_seeds
from specgen.mesh.quantize import normalize_bbox
from specgen.mesh.tokenizers import BPTTokenizer
from specgen.methods.options import ArOptions
from specgen.methods.xspecmesh import DEFAULT_TARGET, XSpecMeshOptions, load_mesh as load_mesh_parts
from specgen.models.graphs import attach
from specgen.models.layout import decode_layout
from specgen.precision import in_memory, load_precision
from specgen.request import DecodeRequest


@dataclass
class MeshGenConfig:
    """Options of `specgen generate` for meshes (recipe keys)."""

    method: str = "xspecmesh"
    model: str | None = None  # backbone; default: the heads' parent (xspecmesh) or mesh-gpt-tiny
    num: int = 4  # procedural test meshes when no point clouds are given
    max_new_tokens: int = 0  # 0: twice the backbone's training length limit, within its context
    temperature: float = 0.5  # BPT's sampling: T 0.5, top-k 50, top-p 0.95
    top_k: int = 50
    top_p: float = 0.95
    seed: int = 0
    device: str = "cpu"  # cpu | cuda | cuda:N | auto (specgen/devices.py)
    graphs: str = "auto"  # auto | on | off: CUDA-graph captured decode steps (auto: on for CUDA; models/graphs.py)
    dtype: str | None = None  # float32 | bfloat16 | float16: backbone's and heads' weights, activations, KV cache
    #                           (default float32; bfloat16 when quantized)
    quantize: str | None = None  # int8 | int4: the backbone decoder's weights, weight-only, quantized at load (CPU)
    mesh_format: str = "obj"  # with --out-dir: obj | ply | stl | off | glb
    preview: bool = False  # with --out-dir: also a PNG per mesh
    batch_size: int = 1  # point clouds decoded together (continuous batching on the shared loop)
    method_options: dict = field(default_factory=dict)  # xspecmesh: heads, num_heads, delta, criterion, ...


@dataclass(frozen=True)
class Condition:
    """One named input point cloud [N, 6]."""

    name: str
    points: np.ndarray  # [N, 6] float32, normalised


def prepare_cloud(arr: object, num_points: int, seed: int, name: str) -> np.ndarray:
    """Validate, normalise to [-0.95, 0.95] and resample to num_points: [num_points, 6] float32."""
    try:
        points, normals = validate_point_cloud(arr, min_points=16)
    except MeshInputError as e:
        raise MeshInputError(f"{name}: {e}") from None
    pts = normalize_bbox(points)
    idx = np.random.default_rng(seed).choice(len(pts), num_points, replace=len(pts) < num_points)
    return np.concatenate([pts[idx], normals[idx]], axis=1).astype(np.float32)


def _ply_points(path: Path) -> np.ndarray | None:
    """Points+normals [N, 6] of a face-less PLY with nx/ny/nz, else None."""
    try:
        cloud = trimesh.load(path, process=False)
    except Exception as exc:  # noqa: BLE001 - trimesh raises many types for corrupt files (as load_mesh)
        raise MeshInputError(f"{path}: cannot read PLY ({type(exc).__name__}: {exc})") from None
    raw = getattr(cloud, "metadata", {}).get("_ply_raw", {}).get("vertex", {}).get("data")
    if raw is None or getattr(cloud, "faces", None) is not None and len(getattr(cloud, "faces", [])):
        return None
    names = set(raw.dtype.names or ()) if hasattr(raw, "dtype") else set(raw)  # binary: a record array; ASCII: a dict
    if not {"x", "y", "z"} <= names:
        raise MeshInputError(f"{path}: PLY has no x/y/z vertex properties")
    if not {"nx", "ny", "nz"} <= names:
        raise MeshInputError(f"{path}: point cloud has no normals (nx, ny, nz); give [N, 6] points+normals")
    return np.stack([np.reshape(raw[k], -1) for k in ("x", "y", "z", "nx", "ny", "nz")], axis=1).astype(np.float64)


def read_file(path: Path, num_points: int, seed: int) -> list[Condition]:
    """Conditions from one file (.npy may hold a batch [B, N, 6])."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            arr = read_npy(path, "[N, 6] points and normals (or a batch [B, N, 6])")
        except UsageError as e:  # the mesh package's inputs refuse as MeshInputError
            raise MeshInputError(str(e)) from None
        if arr.ndim == 3:
            if len(arr) == 0:
                raise MeshInputError(f"{path}: holds no point clouds (shape {list(arr.shape)})")
            return [Condition(f"{path.stem}-{i}", prepare_cloud(a, num_points, seed, f"{path}[{i}]"))
                    for i, a in enumerate(arr)]
        return [Condition(path.stem, prepare_cloud(arr, num_points, seed, str(path)))]
    if suffix == ".ply" and (pts := _ply_points(path)) is not None:  # a PLY with faces is read as a mesh below
        return [Condition(path.stem, prepare_cloud(pts, num_points, seed, str(path)))]
    if suffix in MESH_SUFFIXES:
        m = load_mesh(path)
        try:
            return [Condition(path.stem, point_cloud(normalize_bbox(m.vertices), m.faces, num_points, seed))]
        except MeshInputError as e:  # e.g. every face has zero area: say which file
            raise MeshInputError(f"{path}: {e}") from None
    raise MeshInputError(f"{path}: unsupported input; give .npy point clouds or {', '.join(MESH_SUFFIXES)} files")


def named_apart(files: list[Path], groups: list[list[Condition]]) -> list[Condition]:
    """Every file's conditions (`groups[i]` read from `files[i]`), uniquely named: the files whose names another
    file also gives (`sphere` of sphere.obj and sphere.stl; `a-0` of a.npy's batch and of a-0.obj) are named by their
    whole file name (`sphere.obj`, `a.npy-0`), which no two files of a folder share; a lone stem keeps its name."""
    whole: set[Path] = set()
    while True:  # a whole-named file may clash with another file's stem (x.obj, x.obj.ply): that one goes whole too
        named = [[replace(c, name=f.name + c.name[len(f.stem):]) if f in whole else c for c in g]
                 for f, g in zip(files, groups)]
        counts = Counter(c.name for g in named for c in g)
        clash = {f for f, g in zip(files, named) if any(counts[c.name] > 1 for c in g)} - whole
        if not clash:
            return [c for g in named for c in g]
        whole |= clash


def load_conditions(path: Path | None, num: int, num_points: int, seed: int,
                    spec: ProceduralSpec | None = None) -> list[Condition]:
    """User point clouds (file or folder) or `num` procedural test meshes (of the model's own
    distribution `spec`); all validated up front."""
    if path is None:
        meshes = {s: generate_mesh(s, spec) for s in map(int, split_seeds("test", num))}
        return [Condition(f"test-{s}", point_cloud(m.vertices, m.faces, num_points, s)) for s, m in meshes.items()]
    path, seed = Path(path), seed % 2 ** 64  # numpy takes no negative seed; ours may be any integer (SIGNED)
    if path.is_dir():
        files = sorted(f for f in path.iterdir() if f.suffix.lower() in (".npy", *MESH_SUFFIXES))
        if not files:
            raise MeshInputError(f"{path}: no .npy or mesh files")
        return named_apart(files, [read_file(f, num_points, seed) for f in files])
    if not path.is_file():
        raise MeshInputError(f"{path}: no such file or folder")
    return read_file(path, num_points, seed)


@dataclass(frozen=True)
class MeshSample:
    """One generated mesh: tokens, decoded geometry (cleaned) and what went wrong, if anything."""

    name: str
    tokens: list[int]
    vertices: np.ndarray | None  # [V, 3] (cleaned) or None when nothing decodes
    faces: np.ndarray | None  # [F, 3]
    error: str  # "" when valid; else e.g. "token 17: ..." or "no faces"
    degenerate_removed: int
    duplicate_removed: int
    stats: dict


def decode_tokens(tokens: list[int]) -> tuple[np.ndarray | None, np.ndarray | None, str, int, int]:
    """Strict BPT decode + cleaning: (vertices, faces, error, degenerate removed, duplicates removed); a grammar
    error (named at its first bad position) or no usable face makes the sequence invalid."""
    try:
        v, f = BPTTokenizer().decode(np.asarray(tokens, dtype=np.int64))
    except (MeshDecodeError, MeshInputError) as e:
        return None, None, str(e), 0, 0
    if len(f) == 0:
        return None, None, "decodes to no faces", 0, 0
    c = clean_mesh(v, f)
    if len(c.faces) == 0:
        return None, None, "every face is degenerate or duplicate", c.degenerate_removed, c.duplicate_removed
    return c.vertices, c.faces, "", c.degenerate_removed, c.duplicate_removed


def load_mesh_model(target: str | None = None, heads: str | None = None, device: str = "cpu",
                    dtype: str | None = None, quantize: str | None = None, graphs: str = "auto"):
    """`methods.xspecmesh.load_mesh` on `device` in `dtype` / `quantize` (`dtype` may name it; docs/precision.md)."""
    device, dtype, quantize, torch_dtype = load_precision(dtype, quantize, device)
    loaded = load_mesh_parts(target, heads, device)
    if torch_dtype != torch.float32:  # quantized (bfloat16 activations) or cast: laid out again for its kernels
        decode_layout(in_memory(loaded.decoder.model, dtype, quantize))
        if loaded.decoder.heads is not None:
            loaded.decoder.heads.to(torch_dtype)
    for module in (loaded.decoder.model.decoder, loaded.decoder.heads):  # captured steps on CUDA (models/graphs.py)
        if module is not None:
            attach(module, graphs)
    return loaded


def mesh_options(req: DecodeRequest[MeshGenConfig]) -> XSpecMeshOptions:
    """The decoder's options: xspecmesh's parsed ones; `ar` decodes without heads, so the defaults (never read)."""
    return req.options if isinstance(req.options, XSpecMeshOptions) else XSpecMeshOptions()


def mesh_streams(seed: int, i: int) -> tuple[torch.Generator, torch.Generator]:
    """Mesh i's sampling and draft streams under `seed`: a benchmark's row draws what `generate` draws."""
    return torch.Generator().manual_seed(seed + i), torch.Generator().manual_seed(10_000_019 + seed + i)


def generate_meshes(loaded, conds: list[Condition], req: DecodeRequest[MeshGenConfig],
                    on_mesh=None) -> list[MeshSample]:
    """Decode every condition with `loaded.decoder` (heads present = xspecmesh, absent = ar). `on_mesh(i, sample)`:
    mesh i as soon as it is decoded, before the batch ends (its `stats` are filled in the returned samples)."""
    cfg, opts, heads = req.cfg, mesh_options(req), loaded.decoder.heads
    max_tokens = token_budget(loaded, 0 if heads is None else opts.num_heads or heads.num_heads, cfg.max_new_tokens)
    streams = [mesh_streams(cfg.seed, i) for i in range(len(conds))]
    gens, draft_gens = [g for g, _ in streams], [d for _, d in streams]
    tokens: list[list[int]] = [[] for _ in conds]  # as accepted: a finished mesh's tokens before the batch ends
    samples: dict[int, MeshSample] = {}

    def done(i: int) -> None:
        samples[i] = MeshSample(conds[i].name, tokens[i], *decode_tokens(tokens[i]), {})
        if on_mesh is not None:
            on_mesh(i, samples[i])

    ahead = req.options.run_ahead if isinstance(req.options, ArOptions) else 1  # `ar`'s greedy steps a host read
    results = loaded.decoder.generate_batch([torch.from_numpy(c.points).to(req.device) for c in conds], req.params,
                                            max_tokens, opts, gens, draft_gens,
                                            cfg.batch_size, done, lambda i, new: tokens[i].extend(new), run_ahead=ahead)
    return [replace(samples[i], stats=step_summary(r.stats)) for i, r in enumerate(results)]


def check_budget(target: str | None, heads: str | None, cfg: MeshGenConfig, opts: XSpecMeshOptions) -> None:
    """Refuse a token budget past the backbone's context less the heads' look-ahead and two slots, from the entries'
    configs (installed or shipped: nothing is materialised or loaded; `load_mesh_model` resolves the same names, and
    the loop guards the context too). The one budget check of mesh commands: `check_config` leaves them to it."""
    h = checkpoints.declared_meta(heads) if heads else {}
    name = target or h.get("parent") or DEFAULT_TARGET
    t = checkpoints.declared_meta(name)
    context = decoder_context_of(t)
    d = opts.num_heads or (h.get("kwargs") or {}).get("num_heads", 0)
    if context is not None and isinstance(d, int) and cfg.max_new_tokens > context - d - 2:
        raise UsageError(f"max-new-tokens {cfg.max_new_tokens} does not fit {t.get('kind', 'target')}/"
                         f"{t.get('name', name)}: its context is {context} tokens, less {d} heads' look-ahead and 2 "
                         f"slots; use at most {context - d - 2}")


def token_budget(loaded, num_heads: int, max_new_tokens: int = 0) -> int:
    """Committed-token limit: `max_new_tokens`, else twice the backbone's training length limit, within its context
    less D = `num_heads` look-ahead tokens and two slots."""
    room = loaded.decoder.model.dec_cfg.max_seq_len - num_heads - 2
    return min(max_new_tokens or 2 * int(loaded.target.meta.get("max_tokens", room)), room)


def step_summary(stats) -> dict:
    """DecodeStats summary plus SCR and step latency (XSpecMesh's names)."""
    s = stats.summary()
    s["scr"] = round(stats.tau if stats.steps else 1.0, 4)
    s["step_latency_ms"] = round(1000 * (stats.wall_time - stats.times.get("prefill", 0.0)) / max(stats.steps, 1), 3)
    return s
