"""`specgen benchmark --suite meshes`: XSpecMesh's table 3 and threshold sweep on the procedural test split.

Rows (same point clouds, same seeds, same process; configurations interleaved per mesh so load
changes on a shared machine hit every row alike):
  A ar               backbone alone (one token per forward, condition K/V cached once per mesh)
  B mlp              MLP heads, stage 1 (backbone unchanged)
  C mlp+lora         MLP heads, stage 2 (their LoRA merged into a copy of the backbone)
  D ca               cross-attention heads, stage 1
  E ca+lora          cross-attention heads, stage 2 (the shipped default)
  sweep              E with delta in `deltas` (and top-K_a rows for `topk_accept`, PTS rows for `tree_k`,
                     fewer heads for `depths`: on a CPU every verified token costs, so D < 4 can win;
                     the heads' LM-head projection in another precision for `draft_dtypes`: candidates only,
                     acceptance stays float32; n-gram lookup for `lookups`, a path cut for `path_cuts`)
Metrics: CD / HD exactly as BPT (`mesh.metrics.mesh_distances`: each mesh normalised on its own,
1,024 seeded surface samples, L2 Chamfer = sum of both directed means, symmetric Hausdorff)
against the ground-truth test mesh, averaged over meshes that decode to at least one face
(BPT's tolerant decoding; `scored` counts them); `valid_rate` = share of sequences that decode
strictly with >= 1 non-degenerate face; SCR = committed tokens / decoding steps; step latency =
decode time without the prefill / steps; `speedup_vs_ar` = tokens/s over AR's tokens/s (measured
wall clock, per token so different lengths do not bias it); `speedup_scr_lat` = the paper's
SCR x (AR step latency / step latency).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from specgen.decoding.sampling import SamplingParams
from specgen.decoding.stats import DecodeStats
from specgen.mesh.procedural import ProceduralSpec, generate_mesh, split_seeds


@dataclass
class MeshBenchConfig:
    """Recipe keys of the mesh benchmark."""

    suite: str = "meshes"
    model: str = "mesh-gpt-tiny"
    limit: int = 8  # test meshes
    offset: int = 0
    rows: list = field(default_factory=lambda: ["ar", "mlp", "mlp+lora", "ca", "ca+lora"])
    heads: dict = field(default_factory=lambda: {
        "mlp": "xspecmesh-mlp-tiny-s1", "mlp+lora": "xspecmesh-mlp-tiny",
        "ca": "xspecmesh-ca-tiny-s1", "ca+lora": "xspecmesh-ca-tiny"})
    deltas: list = field(default_factory=lambda: [0.1, 0.3, 0.7, 0.9])  # sweep on sweep_row (0.5 is row E)
    topk_accept: list = field(default_factory=lambda: [1])  # top-K_a rows on sweep_row
    tree_k: list = field(default_factory=lambda: [2])  # PTS rows on sweep_row
    depths: list = field(default_factory=lambda: [2, 3])  # D rows on sweep_row (a CPU pays per verified token)
    draft_dtypes: list = field(default_factory=list)  # e.g. [bfloat16]: sweep_row, its heads' LM-head product in that dtype
    lookups: list = field(default_factory=list)  # e.g. [2]: sweep_row with n-gram lookup candidates (beyond the paper)
    path_cuts: list = field(default_factory=list)  # e.g. [0.3]: sweep_row with min_path_prob (beyond the paper)
    options: dict = field(default_factory=dict)  # more XSpecMesh options for every heads row, e.g. {top_k_tree: 1}
    row_options: dict = field(default_factory=dict)  # row -> options over `options` for that row (and its sweeps)
    merged_ar: list = field(default_factory=list)  # heads rows whose LoRA-merged backbone also decodes plain AR ("ar+ROW")
    sweep_row: str = "ca+lora"
    batch_sizes: list = field(default_factory=lambda: [1])  # B > 1: ROW@bB rows, B point clouds per forward
    num_heads: int = 4
    delta: float = 0.5
    temperature: float = 0.5
    top_k: int = 50
    top_p: float = 0.95
    max_new_tokens: int = 0
    seed: int = 0
    threads: int = 1
    device: str = "cpu"


@dataclass(frozen=True)
class Variant:
    """One benchmark row: which heads, which options."""

    label: str
    heads: str | None
    opts: object  # XSpecMeshOptions
    plain: bool = False  # AR on the backbone these heads load (their LoRA merged), heads unused


def variants(cfg: MeshBenchConfig) -> list[Variant]:
    from specgen.errors import UsageError
    from specgen.methods.xspecmesh import OPTION_NAMES, XSpecMeshOptions

    allowed = [o for o in OPTION_NAMES if o != "heads"]  # heads come from `heads`
    for where, opts in [("options", cfg.options), *((f"row_options.{r}", o) for r, o in cfg.row_options.items())]:
        unknown = sorted(set(opts or {}) - set(allowed))
        if unknown:
            raise UsageError(f"`{where}` has no XSpecMesh option {unknown[0]!r}; its options: {', '.join(allowed)}")
    common = {"num_heads": cfg.num_heads, "delta": cfg.delta, **cfg.options}
    out = []
    for r in cfg.rows:
        if r != "ar" and r not in cfg.heads:
            raise UsageError(f"row {r!r} has no heads in `heads`; known rows: ar, {', '.join(cfg.heads)}")
        out.append(Variant(r, None if r == "ar" else cfg.heads[r],
                           XSpecMeshOptions(**{**common, **(cfg.row_options.get(r) or {})})))
    for r in cfg.merged_ar:
        if r not in cfg.heads:
            raise UsageError(f"merged_ar row {r!r} has no heads in `heads`; known rows: {', '.join(cfg.heads)}")
        out.append(Variant(f"ar+{r}", cfg.heads[r], XSpecMeshOptions(**common), plain=True))
    if cfg.sweep_row in cfg.heads:
        h = cfg.heads[cfg.sweep_row]
        base = {**common, **(cfg.row_options.get(cfg.sweep_row) or {})}
        out += [Variant(f"{cfg.sweep_row} p>{d:g}", h, XSpecMeshOptions(**{**base, "delta": d})) for d in cfg.deltas]
        out += [Variant(f"{cfg.sweep_row} top-{k}", h, XSpecMeshOptions(**{**base, "criterion": "topk", "top_k_accept": k}))
                for k in cfg.topk_accept]
        out += [Variant(f"{cfg.sweep_row} PTS K_s={k}", h, XSpecMeshOptions(**{**base, "sampling": "tree", "top_k_tree": k}))
                for k in cfg.tree_k]
        out += [Variant(f"{cfg.sweep_row} D={d}", h, XSpecMeshOptions(**{**base, "num_heads": d}))
                for d in cfg.depths if d != cfg.num_heads]
        out += [Variant(f"{cfg.sweep_row} {t}", h, XSpecMeshOptions(**{**base, "draft_dtype": t})) for t in cfg.draft_dtypes]
        out += [Variant(f"{cfg.sweep_row} lookup {n}", h, XSpecMeshOptions(**{**base, "lookup": n})) for n in cfg.lookups]
        out += [Variant(f"{cfg.sweep_row} cut {c:g}", h, XSpecMeshOptions(**{**base, "min_path_prob": c}))
                for c in cfg.path_cuts]
    return out


def tolerant_mesh(tokens: list[int]):
    """BPT-style tolerant decode (skips bad patches) -> (vertices, faces) or None when no face."""
    from specgen.mesh.export import clean_mesh
    from specgen.mesh.tokenizers import BPTTokenizer

    d = BPTTokenizer().decode_partial(np.asarray(tokens, dtype=np.int64))
    if len(d.faces) == 0:
        return None
    c = clean_mesh(d.vertices, d.faces)
    return (c.vertices, c.faces) if len(c.faces) else None


def run_mesh_benchmark(cfg: MeshBenchConfig, on_mesh: Callable[[int], None] | None = None) -> list[dict]:
    """Every variant on every test mesh; returns one summary row per variant (AR first)."""
    from specgen.errors import UsageError
    from specgen.mesh.generate import decode_tokens
    from specgen.mesh.metrics import mesh_distances
    from specgen.methods.xspecmesh import MeshDecoder, load_mesh

    if cfg.limit < 1 or cfg.offset < 0:
        raise UsageError("--limit must be >= 1 and --offset >= 0")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    params = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)
    vs = variants(cfg)
    loaded = {h: load_mesh(cfg.model, h, cfg.device) for h in dict.fromkeys(v.heads for v in vs)}
    ar = loaded[None] if None in loaded else load_mesh(cfg.model, None, cfg.device)
    decoders = {v.label: MeshDecoder(loaded[v.heads].decoder.model, None, loaded[v.heads].decoder.eos_id) if v.plain
                else loaded[v.heads].decoder for v in vs}
    max_tokens = token_budget(ar.decoder.model, ar.target.meta, cfg.num_heads, cfg.max_new_tokens)
    clouds = benchmark_clouds(ar.target.meta, cfg.limit, cfg.offset, cfg.device)
    refs = reference_distances([ref for ref, _ in clouds])

    def streams(i: int) -> tuple[torch.Generator, torch.Generator]:
        return torch.Generator().manual_seed(cfg.seed + i), torch.Generator().manual_seed(10_000_019 + cfg.seed + i)

    def record(a: dict, res, ref) -> None:
        a["stats"].merge(res.stats)
        a["tokens"] += len(res.tokens)
        a["valid"] += not decode_tokens(res.tokens)[2]
        mesh = tolerant_mesh(res.tokens)
        if mesh is not None:
            d = mesh_distances(mesh[0], mesh[1], ref.vertices, ref.faces)
            a["cd"].append(d.chamfer)
            a["hd"].append(d.hausdorff)

    acc = {v.label: new_acc() for v in vs}
    for i, (ref, pc) in enumerate(clouds):
        for v in vs:
            record(acc[v.label], decoders[v.label].generate(pc, params, max_tokens, v.opts, *streams(i)), ref)
        if on_mesh:
            on_mesh(i)
    rows = summarize(cfg, vs, acc, loaded)
    for batch in (b for b in cfg.batch_sizes if b > 1):  # every variant over all clouds through B slots
        acc = {v.label: new_acc() for v in vs}
        for v in vs:
            gens, dgens = zip(*(streams(i) for i in range(len(clouds))))
            results = decoders[v.label].generate_batch([pc for _, pc in clouds], params, max_tokens, v.opts, gens,
                                                       dgens, batch)
            for (ref, _), res in zip(clouds, results):
                record(acc[v.label], res, ref)
            acc[v.label]["wall"] = max(r.stats.extras["latency_s"] for r in results)
        rows += batched_rows(summarize(cfg, vs, acc, loaded), acc, batch, rows)
    return [{**r, **refs} for r in rows]


def new_acc() -> dict:
    return {"stats": DecodeStats(), "cd": [], "hd": [], "valid": 0, "tokens": 0}


def batched_rows(rows: list[dict], acc: dict, batch: int, single: list[dict]) -> list[dict]:
    """`ROW@bB` rows: tokens/s and meshes/s over the batch's wall time (not the sum of per-mesh latencies), speedup
    vs AR at the same B and vs batch-1 AR (`vs_ar_b1`); step latency is a per-sequence measure and left out."""
    ar_b1 = next((r for r in single if r["heads"] is None), None)
    for r in rows:
        a = acc[r["row"]]
        r.update(row=f"{r['row']}@b{batch}", batch_size=batch, wall_s=round(a["wall"], 2),
                 tokens_per_s=round(a["tokens"] / a["wall"], 2), meshes_per_s=round(r["meshes"] / a["wall"], 3),
                 step_latency_ms=None, speedup_scr_lat=None)
    ar = next((r for r in rows if r["heads"] is None), None)
    for r in rows:
        r["speedup_vs_ar"] = round(r["tokens_per_s"] / ar["tokens_per_s"], 3) if ar else None
        r["vs_ar_b1"] = round(r["tokens_per_s"] / ar_b1["tokens_per_s"], 3) if ar_b1 else None
    return rows


def benchmark_clouds(meta: dict, limit: int, offset: int = 0, device: str = "cpu") -> list[tuple[object, torch.Tensor]]:
    """(ground-truth mesh, point cloud [N, 6]) of `limit` test-split meshes from `offset`, drawn from the
    backbone's own procedural distribution and point count (its config.json `meta`)."""
    from specgen.train.mesh import point_cloud

    spec, num_points = ProceduralSpec.from_meta(meta), int(meta.get("num_points", 2048))
    out = []
    for seed in split_seeds("test", limit, offset):
        ref = generate_mesh(int(seed), spec)
        out.append((ref, torch.from_numpy(point_cloud(ref.vertices, ref.faces, num_points, int(seed))).to(device)))
    return out


def token_budget(model, meta: dict, num_heads: int, max_new_tokens: int = 0) -> int:
    """Committed-token limit of a run: `max_new_tokens`, else twice the backbone's training length limit, within
    its context (room for the D + 1 verified tokens and the start vector)."""
    room = model.dec_cfg.max_seq_len - num_heads - 2
    return min(max_new_tokens or 2 * int(meta.get("max_tokens", room)), room)


def reference_distances(meshes: list) -> dict[str, float]:
    """What CD means on this test set: mean CD to each ground truth of a plain box (no information) and of
    the next test mesh (a plausible shape that ignores the point cloud); a model that reads its
    condition scores well below `cd_other_mesh`."""
    import trimesh

    from specgen.mesh.metrics import mesh_distances

    box = trimesh.creation.box()
    cd_box = [mesh_distances(box.vertices, box.faces, m.vertices, m.faces).chamfer for m in meshes]
    nxt = meshes[1:] + meshes[:1]
    cd_other = [mesh_distances(o.vertices, o.faces, m.vertices, m.faces).chamfer for o, m in zip(nxt, meshes)]
    return {"cd_box": round(float(np.mean(cd_box)), 4),
            "cd_other_mesh": round(float(np.mean(cd_other)), 4) if len(meshes) > 1 else None}


def rule_label(opts) -> str:
    """A heads row's rule, marked `(lossy)` unless it keeps the (LoRA-merged) backbone's distribution."""
    return opts.label() + ("" if opts.lossless else " (lossy)")


def summarize(cfg: MeshBenchConfig, vs: list[Variant], acc: dict, loaded: dict) -> list[dict]:
    """One row per variant with the metrics of the module docstring."""
    rows = []
    for v in vs:
        a, st = acc[v.label], acc[v.label]["stats"]
        decode_s = st.wall_time - st.times.get("prefill", 0.0)
        rows.append({
            "method": "ar" if v.heads is None or v.plain else "xspecmesh", "row": v.label, "heads": v.heads,
            "rule": "lossless" if v.heads is None or v.plain else rule_label(v.opts),
            "meshes": cfg.limit, "scored": len(a["cd"]),
            "cd": round(float(np.mean(a["cd"])), 4) if a["cd"] else None,
            "hd": round(float(np.mean(a["hd"])), 4) if a["hd"] else None,
            "valid_rate": round(a["valid"] / cfg.limit, 3),
            "scr": round(st.tau, 3) if st.steps else 1.0,
            "step_latency_ms": round(1000 * decode_s / max(st.steps, 1), 3),
            "tokens_per_s": round(a["tokens"] / st.wall_time, 2) if st.wall_time else 0.0,
            "mean_tokens": round(a["tokens"] / cfg.limit, 1), "wall_s": round(st.wall_time, 2),
            "meshes_per_s": round(cfg.limit / st.wall_time, 3) if st.wall_time else 0.0, "batch_size": 1,
            "nfe": st.target_forwards,
            # where a step's time goes (propose = heads + sampling, verify = the backbone forward)
            "phase_ms_per_step": {k: round(1000 * t / max(st.steps, 1), 3)
                                  for k, t in sorted(st.times.items()) if k != "prefill"},
        })
    ar = next((r for r in rows if r["heads"] is None), None)
    for r in rows:
        r["speedup_vs_ar"] = round(r["tokens_per_s"] / ar["tokens_per_s"], 3) if ar and ar["tokens_per_s"] else None
        r["speedup_scr_lat"] = (round(r["scr"] * ar["step_latency_ms"] / r["step_latency_ms"], 3)
                                if ar and r["step_latency_ms"] else None)
        r["cd_vs_ar"] = round(r["cd"] / ar["cd"], 3) if ar and ar["cd"] and r["cd"] is not None else None
    return rows
