"""`specgen benchmark --suite meshes`: XSpecMesh's table 3 and threshold sweep on the procedural test split."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import numpy as np
import torch
import trimesh

from specgen.decoding.sampling import SamplingParams
from specgen.decoding.stats import DecodeStats
from specgen.errors import UsageError
from specgen.eval.graph_use import GraphUse
from specgen.eval.run_dir import Grid, RunNotFinished
from specgen.eval.speed import Timed, merged
from specgen.eval.sweeps import (Entries, Sweep, check_rows, dtypes_on, entries, expand, merged_table, sweeps_of,
                                 sweeps_on)
from specgen.generate.mesh import check_budget, decode_tokens, load_mesh_model, mesh_streams, token_budget
from specgen.mesh.export import clean_mesh
from specgen.mesh.metrics import mesh_distances
from specgen.mesh.pointcloud import point_cloud
from specgen.mesh.procedural import ProceduralSpec, generate_mesh, split_seeds
from specgen.mesh.tokenizers import BPTTokenizer
from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions
from specgen.shard import Shard


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
    # XSpecMesh options: bare ones for every heads row ({top_k_tree: 1}), mappings per row ({vertex: {num_heads: 1}})
    options: dict = field(default_factory=dict)
    sweep: dict = field(default_factory=dict)  # row -> {option: [values]}: one row per value (specgen/eval/sweeps.py)
    row_options: dict = field(default_factory=dict)  # the older name of `options`' per-row mappings, read as well
    merged_ar: list = field(default_factory=list)  # heads rows whose LoRA-merged backbone also decodes plain AR ("ar+ROW")
    sweep_row: str = "ca+lora"
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # B > 1: ROW@bB rows, B point clouds per forward
    num_heads: int = 4
    delta: float = 0.5
    temperature: float = 0.5
    top_k: int = 50
    top_p: float = 0.95
    max_new_tokens: int = 0
    seed: int = 0
    threads: int = 1
    device: str = "cpu"  # cpu | cuda | cuda:N | auto
    graphs: str = "auto"  # auto | on | off: CUDA-graph captured decode steps (auto: on for CUDA; models/graphs.py)
    dtype: str = "float32"  # backbone and heads: weights, activations, KV cache (LoRA merged in float32 first)
    dtypes: dict = field(default_factory=dict)  # row label -> its own dtype: rows at several precisions in one run


@dataclass(frozen=True)
class Variant:
    """One benchmark row: which heads, which options."""

    label: str
    heads: str | None
    opts: object  # XSpecMeshOptions
    plain: bool = False  # AR on the backbone these heads load (their LoRA merged), heads unused


# older sweep keys -> (the option each sets on `sweep_row`, the settings it adds, the row names it always gave)
OLD_SWEEPS = {
    "deltas": ("delta", (), "{} p>"),
    "topk_accept": ("top_k_accept", (("criterion", "topk"),), "{} top-"),
    "tree_k": ("top_k_tree", (("sampling", "tree"),), "{} PTS K_s="),
    "depths": ("num_heads", (), "{} D="),
    "draft_dtypes": ("draft_dtype", (), "{} "),
    "lookups": ("lookup", (), "{} lookup "),
    "path_cuts": ("min_path_prob", (), "{} cut "),
}


def mesh_sweeps(cfg: MeshBenchConfig) -> list[Sweep]:
    """The older keys' sweeps on `sweep_row` (none with `sweep_row=none`), then `sweep`'s; a `sweep_row` that names
    no heads is refused (it was no sweep, unsaid)."""
    if cfg.sweep_row != "none" and cfg.sweep_row not in cfg.heads:
        raise UsageError(f"sweep_row {cfg.sweep_row!r} has no heads in `heads`; known rows: {', '.join(cfg.heads)}, "
                         "or none for no sweep")
    old = []
    if cfg.sweep_row != "none":
        for key, (option, fixed, label) in OLD_SWEEPS.items():
            # depths: D = num_heads is the sweep row itself
            values = [d for d in cfg.depths if d != cfg.num_heads] if key == "depths" else getattr(cfg, key)
            if values:
                old.append(Sweep(cfg.sweep_row, option, tuple(values), fixed, label.format(cfg.sweep_row) + "{}", key))
    return old + sweeps_of(cfg.sweep)


def entries_of(cfg: MeshBenchConfig) -> Entries:
    """What the per-row entries of `options` and `row_options` may name: a row, merged AR's (`ar+ROW`), a sweep's,
    `ar` or a `heads` row."""
    return entries([*cfg.rows, *(f"ar+{r}" for r in cfg.merged_ar)], mesh_sweeps(cfg), ["ar", *cfg.heads],
                   "a `heads` row")


def entry_tables(cfg: MeshBenchConfig) -> dict[str, dict]:
    """The per-row options tables, as a refusal names them (`options`' bare values are every heads row's)."""
    return {"options": {k: v for k, v in cfg.options.items() if isinstance(v, dict)}, "row_options": cfg.row_options}


def picked(cfg: MeshBenchConfig) -> MeshBenchConfig:
    """cfg as `--methods` picks its rows: only the sweeps (`sweep`, `sweep_row`'s keys) and `merged_ar` rows of heads
    rows among them, and the `dtypes` of the rows they make (a recipe's on another row are left out, as that row is)."""
    rows = set(cfg.rows)
    sweep_row = cfg.sweep_row if cfg.sweep_row in rows else "none"
    cfg = replace(cfg, sweep=sweeps_on(cfg.sweep, rows.__contains__), sweep_row=sweep_row,
                  merged_ar=[r for r in cfg.merged_ar if r in rows])
    return replace(cfg, dtypes=dtypes_on(cfg.dtypes, lambda: [v.label for v in variants(replace(cfg, dtypes={}))],
                                         lambda row: names_a_row(row, cfg.heads)))


def names_a_row(name: str, heads: dict) -> bool:
    """Could `name` be a row of a run with these `heads`: `ar`, a heads row, `ar+` one (merged AR), or one of those
    with a sweep's `@...` or ` ...` after it?"""
    base = name.removeprefix("ar+")
    return base == "ar" or any(base == h or base.startswith((f"{h}@", f"{h} ")) for h in heads)


def variants(cfg: MeshBenchConfig) -> list[Variant]:
    allowed = [o for o in XSpecMeshOptions.__dataclass_fields__ if o != "heads"]  # heads come from `heads`
    bare, tables = {k: v for k, v in cfg.options.items() if not isinstance(v, dict)}, entry_tables(cfg)

    def check(where: str, opts: dict) -> None:
        unknown = sorted(set(opts) - set(allowed))
        if unknown:
            whose = f"`{where}` has no XSpecMesh option" if where else "XSpecMesh has no option"
            raise UsageError(f"{whose} {unknown[0]!r}; its options: {', '.join(allowed)}")

    check("options", bare)
    per_row = merged_table(cfg.row_options, tables["options"], "row_options")  # refuses an entry that is no mapping
    for name, table in tables.items():  # (an entry no row reads is refused as the config loads: `entries_of`)
        for r, o in table.items():
            check(f"{name}.{r}", o)
    common = {"num_heads": cfg.num_heads, "delta": cfg.delta, **bare}

    def options_of(row: str, over: dict | None = None) -> object:
        return XSpecMeshOptions(**{**common, **per_row.get(row, {}), **(over or {})})

    out = []
    for r in cfg.rows:
        if r != "ar" and r not in cfg.heads:
            raise UsageError(f"row {r!r} has no heads in `heads`; known rows: ar, {', '.join(cfg.heads)}")
        out.append(Variant(r, None if r == "ar" else cfg.heads[r], options_of(r)))
    for r in cfg.merged_ar:
        if r not in cfg.heads:
            raise UsageError(f"merged_ar row {r!r} has no heads in `heads`; known rows: {', '.join(cfg.heads)}")
        out.append(Variant(f"ar+{r}", cfg.heads[r], XSpecMeshOptions(**common), plain=True))
    for s in expand(mesh_sweeps(cfg), cfg.heads, lambda row, o: check("", o)):
        out.append(Variant(s.name, cfg.heads[s.base], options_of(s.base, {**s.options, **per_row.get(s.name, {})})))
    check_rows([v.label for v in out], cfg.dtype, cfg.dtypes, cfg.device)
    return out


@dataclass(frozen=True)
class MeshRun:
    """What a record keeps of one decoded mesh: token count, statistics, strict validity, CD/HD (None when the
    tolerant decode leaves no face)."""

    tokens: int
    stats: DecodeStats
    valid: bool
    cd: float | None
    hd: float | None
    shard: str


def mesh_run(res, ref, shard: Shard) -> dict:
    """A record's run of one decoded mesh (`MeshRun`; BPT-style tolerant decode: bad patches skipped)."""
    d = BPTTokenizer().decode_partial(np.asarray(res.tokens, dtype=np.int64))
    mesh = clean_mesh(d.vertices, d.faces) if len(d.faces) else None
    cd = hd = None
    if mesh is not None and len(mesh.faces):
        dist = mesh_distances(mesh.vertices, mesh.faces, ref.vertices, ref.faces)
        cd, hd = dist.chamfer, dist.hausdorff
    return asdict(MeshRun(len(res.tokens), res.stats, not decode_tokens(res.tokens)[2], cd, hd, shard.label))


def grid(cfg: MeshBenchConfig, vs: list[Variant]) -> Grid:
    """The run's items: its test meshes, every row on each (batch-1 rows always: the batched ones' `vs_ar_b1`)."""
    return Grid(cfg.limit, tuple(v.label for v in vs), (1, *cfg.batch_sizes), "m{}", run=MeshRun)


def check_run(cfg: MeshBenchConfig) -> None:
    """What a run checks from its config before any model loads, beyond its rows (`variants`); the dry run makes the
    same checks: the test split holds the meshes, the token budget fits the backbone's context as `token_budget`
    reserves (from the entries' configs: nothing is materialised)."""
    split_seeds("test", cfg.limit, cfg.offset)
    check_budget(cfg.model, None, cfg, XSpecMeshOptions(num_heads=cfg.num_heads))


def measure_meshes(cfg: MeshBenchConfig, sink, shard: Shard = Shard(), on_item=lambda: None,
                   machine: Callable[[], str] = str) -> None:
    """Decode this shard's meshes that `sink` (its shard started) has no record of (`Grid.measure`): at batch 1 a
    mesh with every row interleaved on it, at B > 1 one row over the shard's point clouds through B slots."""
    vs = variants(cfg)
    by_label = {v.label: v for v in vs}
    params = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)
    dtype_of = {v.label: cfg.dtypes.get(v.label, cfg.dtype) for v in vs}
    loaded = {(h, d): load_mesh_model(cfg.model, h, cfg.device, d, graphs=cfg.graphs)
              for h, d in dict.fromkeys((v.heads, dtype_of[v.label]) for v in vs)}  # once per (heads, dtype)
    ar = loaded.get((None, cfg.dtype)) or load_mesh_model(cfg.model, None, cfg.device, cfg.dtype, graphs=cfg.graphs)
    own = {v.label: loaded[v.heads, dtype_of[v.label]] for v in vs}
    decoders = {v.label: MeshDecoder(own[v.label].decoder.model, None, own[v.label].decoder.eos_id) if v.plain
                else own[v.label].decoder for v in vs}
    max_tokens = token_budget(ar, cfg.num_heads, cfg.max_new_tokens)
    clouds = benchmark_clouds(ar.target.meta, cfg.limit, cfg.offset, cfg.device)
    steps = {f"{h or 'ar'} {d} {part}": m for (h, d), mm in loaded.items()
             for part, m in (("backbone", mm.decoder.model.decoder), ("heads", mm.decoder.heads))}
    use = GraphUse(steps, sink, shard)
    use.write({"machine": machine(), "references": reference_distances([ref for ref, _ in clouds])})

    def decode(label: str, i: int):
        return decoders[label].generate_batch([clouds[i][1]], params, max_tokens, by_label[label].opts,
                                              *zip(mesh_streams(cfg.seed, i)))[0]

    def one(i: int) -> dict:
        runs = {}
        for v in vs:
            with use.timing(v.label):
                res = decode(v.label, i)
            runs[v.label] = mesh_run(res, clouds[i][0], shard)
        return runs

    def decode_batch(b: int, label: str, mine: list[int]):
        gens, dgens = zip(*(mesh_streams(cfg.seed, i) for i in mine))
        return decoders[label].generate_batch([clouds[i][1] for i in mine], params, max_tokens, by_label[label].opts,
                                              gens, dgens, b)

    def batch(b: int, label: str, mine: list[int]) -> tuple[list[dict], float]:
        with use.timing(f"{label}@b{b}"):
            results = decode_batch(b, label, mine)
        return ([mesh_run(r, clouds[i][0], shard) for r, i in zip(results, mine)],
                max(r.stats.extras["latency_s"] for r in results))

    # warm-up (allocations; on CUDA the shapes the meshes meet, their steps captured) on the test meshes' seeds
    work = grid(cfg, vs)
    use.warm([v.label for v in vs], range(cfg.limit), decode, [(work, decode_batch)])
    work.measure(sink, shard, one, batch, use.after_item(on_item))
    use.write()


def mesh_rows_of(cfg: MeshBenchConfig, sink) -> list[dict]:
    """One summary row per variant (AR first), batched rows after; a run with missing items is refused."""
    vs = variants(cfg)
    work = grid(cfg, vs)
    records = sink.finished([work], "meshes")
    references = next((m["references"] for m in sink.machines().values() if "references" in m), None)
    if references is None:  # written by every shard as it starts: a torn or removed file
        raise RunNotFinished(f"{sink.path} has no machine file with the test meshes' reference distances "
                             "(machine-*.json): rerun the same command to write it")
    single = work.runs(records, 1)[0]
    rows = summarize(cfg, vs, single)
    ar_b1 = next((single[v.label] for v in vs if v.heads is None), None)  # batch-1 AR's runs
    for b in (b for b in cfg.batch_sizes if b > 1):
        runs, walls = work.runs(records, b)
        rows += batched_rows(summarize(cfg, vs, runs), runs, walls, b, ar_b1)
    return [{**r, **references} for r in rows]


def batched_rows(rows: list[dict], runs: dict, walls: dict, batch: int, ar_b1: list[dict] | None) -> list[dict]:
    """`ROW@bB` rows: tokens/s and meshes/s over each shard's wall time (not the sum of per-mesh latencies; summed
    over shards, which run side by side), speedup vs AR at the same B and vs batch-1 AR (`vs_ar_b1`), per shard and
    weighted by its meshes; step latency is a per-sequence measure and left out."""
    ar_label = next((r["row"] for r in rows if r["heads"] is None), None)
    for r in rows:
        label = r["row"]
        mine = timed(runs[label], walls[label])
        r.update(row=f"{label}@b{batch}", batch_size=batch, wall_s=round(max(walls[label].values()), 2),
                 tokens_per_s=round(mine.total(), 2),
                 meshes_per_s=round(Timed([1.0] * len(mine.work), mine.shards, mine.walls).total(), 3),
                 step_latency_ms=None, speedup_scr_lat=None,
                 speedup_vs_ar=round(mine.vs(timed(runs[ar_label], walls[ar_label])), 3) if ar_label else None,
                 vs_ar_b1=round(mine.vs(timed(ar_b1)), 3) if ar_b1 is not None and ar_label else None)
    return rows


def timed(runs: list[dict], walls: dict[str, float] | None = None) -> Timed:
    """Runs' tokens over their shards' walls (batched), else over their own decode times (batch 1)."""
    work, shards = [x["tokens"] for x in runs], [x["shard"] for x in runs]
    if walls is None:
        return Timed.one_by_one(work, shards, [DecodeStats(**x["stats"]).wall_time for x in runs])
    return Timed(work, shards, walls)


def benchmark_clouds(meta: dict, limit: int, offset: int = 0, device: str = "cpu") -> list[tuple[object, torch.Tensor]]:
    """(ground-truth mesh, point cloud [N, 6]) of `limit` test-split meshes from `offset`, as the backbone's `meta`."""
    spec, num_points = ProceduralSpec.from_meta(meta), int(meta.get("num_points", 2048))
    refs = {seed: generate_mesh(seed, spec) for seed in map(int, split_seeds("test", limit, offset))}
    return [(m, torch.from_numpy(point_cloud(m.vertices, m.faces, num_points, s)).to(device)) for s, m in refs.items()]


def reference_distances(meshes: list) -> dict[str, float]:
    """What CD means on this test set: mean CD to each ground truth of a plain box (no information) and of
    the next test mesh (a plausible shape that ignores the point cloud); a model that reads its
    condition scores well below `cd_other_mesh`."""
    box = trimesh.creation.box()
    cd_box = [mesh_distances(box.vertices, box.faces, m.vertices, m.faces).chamfer for m in meshes]
    nxt = meshes[1:] + meshes[:1]
    cd_other = [mesh_distances(o.vertices, o.faces, m.vertices, m.faces).chamfer for o, m in zip(nxt, meshes)]
    return {"cd_box": round(float(np.mean(cd_box)), 4),
            "cd_other_mesh": round(float(np.mean(cd_other)), 4) if len(meshes) > 1 else None}


def summarize(cfg: MeshBenchConfig, vs: list[Variant], runs: dict[str, list[dict]]) -> list[dict]:
    """One row per variant with the metrics of the module docstring (runs: label -> records in mesh order)."""
    rows = []
    for v in vs:
        xs = runs[v.label]
        st = merged([DecodeStats(**x["stats"]) for x in xs])
        cd, hd = [x["cd"] for x in xs if x["cd"] is not None], [x["hd"] for x in xs if x["hd"] is not None]
        tokens = sum(x["tokens"] for x in xs)
        decode_s = st.wall_time - st.times.get("prefill", 0.0)
        rows.append({
            "method": "ar" if v.heads is None or v.plain else "xspecmesh", "row": v.label, "heads": v.heads,
            # a heads row's rule, marked `(lossy)` unless it keeps the (LoRA-merged) backbone's distribution
            "rule": "lossless" if v.heads is None or v.plain else v.opts.label() + " (lossy)" * (not v.opts.lossless),
            "meshes": cfg.limit, "scored": len(cd),
            "cd": round(float(np.mean(cd)), 4) if cd else None,
            "hd": round(float(np.mean(hd)), 4) if hd else None,
            "valid_rate": round(sum(x["valid"] for x in xs) / cfg.limit, 3),
            "scr": round(st.tau, 3) if st.steps else 1.0,
            "step_latency_ms": round(1000 * decode_s / max(st.steps, 1), 3),
            "tokens_per_s": round(tokens / st.wall_time, 2) if st.wall_time else 0.0,
            "mean_tokens": round(tokens / cfg.limit, 1), "wall_s": round(st.wall_time, 2),
            "meshes_per_s": round(cfg.limit / st.wall_time, 3) if st.wall_time else 0.0, "batch_size": 1,
            "nfe": st.target_forwards, "dtype": cfg.dtypes.get(v.label, cfg.dtype),
            # where a step's time goes (propose = heads + sampling, verify = the backbone forward)
            "phase_ms_per_step": {k: round(1000 * t / max(st.steps, 1), 3)
                                  for k, t in sorted(st.times.items()) if k != "prefill"},
        })
    ar = next((r for r in rows if r["heads"] is None), None)
    for r in rows:
        r["speedup_vs_ar"] = (round(timed(runs[r["row"]]).vs(timed(runs[ar["row"]])), 3)
                              if ar and ar["tokens_per_s"] else None)
        r["speedup_scr_lat"] = (round(r["scr"] * ar["step_latency_ms"] / r["step_latency_ms"], 3)
                                if ar and r["step_latency_ms"] else None)
        r["cd_vs_ar"] = round(r["cd"] / ar["cd"], 3) if ar and ar["cd"] and r["cd"] is not None else None
    return rows
