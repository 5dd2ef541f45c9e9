"""Image benchmark: image methods x temperatures on the same conditions and seeds, interleaved, in one process."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable

import torch

from specgen import checkpoints
from specgen.decoding.cost import Tokens, cost_of
from specgen.errors import UnknownNameError, UsageError
from specgen.eval import plots
from specgen.eval.graph_use import GraphUse
from specgen.eval.image_rows import Image, image_rows, method_of, png_of
from specgen.eval.run_dir import Grid
from specgen.eval.sweeps import (Entries, SweptRow, check_own_entry, check_rows, dtypes_on, entries, methods_on,
                                 sweeps_of, sweeps_on, with_sweep_rows)
from specgen.generate.image import (ImageGenConfig, ImageModel, conditioned, decode_pixels, generate_images,
                                    image_conditions, load_image_model)
from specgen.generate.image_methods import build_image_method
from specgen.image import metrics as image_metrics
from specgen.image.captions import Caption
from specgen.image.grid import image_grid
from specgen.methods import METHODS, get_method
from specgen.methods.mulo_sd import MuLoSD
from specgen.paths import check_folder, free_path, write_linked
from specgen.request import parse_request
from specgen.shard import Shard


@dataclass
class ImageBenchConfig:
    """Options of `specgen benchmark --suite images` (recipe keys)."""

    suite: str = "images"
    methods: list[str] = field(default_factory=lambda: ["ar", "eagle2", "adt-tree", "lantern", "adt-tree+lantern",
                                                        "vvs@u", "vvs@d", "mulo-sd"])
    model: str = "tiny-image-gpt"
    drafter: str = ""
    temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0])
    num: int = 16  # images per method and temperature (classes or captions cycled)
    classes: list[str] = field(default_factory=list)  # c2i: names or ids; empty = cycle through all classes
    captions: str = ""  # t2i: caption-features file, as `generate --captions` (.safetensors/.npz/.npy)
    cfg_scale: float = 4.0
    seed: int = 0
    device: str = "cpu"  # cpu | cuda | cuda:N | auto
    graphs: str = "auto"  # auto | on | off: CUDA-graph captured decode steps (auto: on for CUDA; models/graphs.py)
    dtype: str = "float32"  # the GPT's and drafter's weights, activations and KV cache (the VQ and classifier: float32)
    dtypes: dict = field(default_factory=dict)  # entry -> its own precision (e.g. {"ar@bf16": bfloat16, "ar@int8":
    #   int8}, int8/int4 = weight-only quantized GPT): rows at several precisions interleaved in one run; NLL is
    #   always under `dtype`'s model
    threads: int = 0
    quality: bool = True
    classifier: str = "tiny-image-classifier"
    out_dir: str = "specgen-bench-images"  # grids and plots (also of `benchmark report`); "" = none
    mulo_ablations: bool = False  # add mulo-sd@raster and mulo-sd@no-expand rows (MuLo-SD Fig. 5c)
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # B > 1: `method@bB` rows, B images per forward
    # method (or method@tag entry) -> {option: value}
    options: dict = field(default_factory=lambda: {"vvs@u": {"schedule": "uniform"}, "vvs@d": {"schedule": "dynamic"}})
    sweep: dict = field(default_factory=dict)  # row -> {option: [values]}: one row per value (specgen/eval/sweeps.py)
    method_options: dict = field(default_factory=dict)  # the older name of `options`, read as well


DEFAULT_ENTRIES = tuple(ImageBenchConfig().options)  # vvs@u, vvs@d: in every run's table, whatever its rows


def options_of(cfg: ImageBenchConfig, entry: str) -> dict:
    """Options of an entry of a plan (`checked_rows`): the method's, updated by the entry's own (`method@tag`)."""
    return {**cfg.options.get(method_of(entry), {}), **cfg.options.get(entry, {})}


MULO_ABLATIONS = {"mulo-sd@raster": {"rejection": "raster"}, "mulo-sd@no-expand": {"radius": 0}}
# the sweeps the papers plot: (file name stem, the rows drawn with the swept ones), the names they always had; another
# sweep `S` (rows `S=<v>`) is drawn as `S-pareto` with `ar`, `lantern` and the row it varies (`eagle2@top_k` varies
# eagle2; `vvs@u`, a tagged row's sweep, varies vvs@u)
PLOTS = {"mulo-sd@tau": ("mulo-sd-pareto", ("ar", "lantern", "mulo-sd")),
         "vvs@i": ("vvs-u-pareto", ("ar", "lantern", "vvs@u")),
         "vvs@thr": ("vvs-d-pareto", ("ar", "lantern", "vvs@d"))}


def entries_of(cfg: ImageBenchConfig) -> Entries:
    """What the `options` entries of cfg may name: its rows, its MuLo-SD ablations' and sweeps', an image method or
    a default entry (vvs@u, vvs@d: in every run's table)."""
    ablations = list(MULO_ABLATIONS) if cfg.mulo_ablations else []
    return entries([*cfg.methods, *ablations], sweeps_of(cfg.sweep), [*methods_on("image"), *DEFAULT_ENTRIES],
                   "a method")


def picked(cfg: ImageBenchConfig) -> ImageBenchConfig:
    """cfg as `--methods` picks its rows: only the sweeps, MuLo-SD ablations, `options` entries and `dtypes` of the
    rows they make (a recipe's of another method or row are left out, as its rows are)."""
    methods = {method_of(m) for m in cfg.methods}
    cfg = replace(cfg, sweep=sweeps_on(cfg.sweep, lambda row: method_of(row) in methods),
                  mulo_ablations=cfg.mulo_ablations and "mulo-sd" in methods)
    read = entries_of(cfg)
    cfg = replace(cfg, options=read.kept(cfg.options), method_options=read.kept(cfg.method_options))
    return replace(cfg, dtypes=dtypes_on(cfg.dtypes, lambda: expanded(cfg).methods,
                                         lambda row: method_of(row) in METHODS))


def expanded(cfg: ImageBenchConfig) -> ImageBenchConfig:
    """cfg with the MuLo-SD ablation and sweep entries added to `methods`, `options` holding every entry's."""
    extra = [SweptRow(m, "mulo-sd", o) for m, o in MULO_ABLATIONS.items()] if cfg.mulo_ablations else []
    return with_sweep_rows(cfg, "image", method_of, extra)[0]


def checked_rows(cfg: ImageBenchConfig) -> ImageBenchConfig:
    """The plan a run measures and summarises: cfg `expanded`, every row and precision checked."""
    cfg = expanded(cfg)
    check_rows(cfg.methods, cfg.dtype, cfg.dtypes, cfg.device)
    for m in cfg.methods:
        spec = get_method(method_of(m), methods_on("image"))
        if not spec.runs_on("image"):
            raise UsageError(f"method {m} is for {spec.modality}; the images suite is image methods")
        check_own_entry(m, method_of(m), {"options": cfg.options, "dtypes": cfg.dtypes})
        spec.parse_options(options_of(cfg, m)).check_use("image", greedy=not any(cfg.temperatures))
    return cfg


def check_out_dir(cfg: ImageBenchConfig) -> None:
    """The grids and plots' folder can be written (before the work, and before a report, whose recorded folder may
    be gone); the dry run makes the same check."""
    if cfg.out_dir:
        check_folder(Path(cfg.out_dir), f"cannot write out_dir={cfg.out_dir} (the grids and plots: out_dir=DIR "
                                        "writes them elsewhere, out_dir= none)")


@torch.inference_mode()
def target_nll(im: ImageModel, cfg_scale: float, cond: int | Caption, tokens: list[int]) -> float:
    """Mean NLL per token of `tokens` under the target's CFG distribution at temperature 1, given the
    image's condition (class id, c2i; Caption, t2i)."""
    parts, prompt = conditioned(im, cfg_scale, cond)
    target, p, device = parts.target, len(prompt), parts.target.device
    cache = target.new_cache(1, p + len(tokens) + 1)
    first = target.prefill(torch.tensor([prompt]), cache)
    seq = torch.tensor([tokens[:-1]], device=device)
    out = target.forward(seq, torch.arange(p, p + len(tokens) - 1, device=device).unsqueeze(0), cache, None)
    logits = torch.cat([first.logits[0, -1:], out.logits[0]], 0).float()  # [N, V]
    return float(-logits.log_softmax(-1).gather(1, torch.tensor(tokens, device=device)[:, None]).mean())


def check_classifier(cfg: ImageBenchConfig) -> None:
    """A `classifier` no entry has (a typo) is refused before any model loads, as its dry run's entry row fails; one
    that cannot load is the run's note (`classifier_state`), and `classifier=` none."""
    if cfg.quality and cfg.classifier:
        try:
            checkpoints.find(cfg.classifier)
        except UnknownNameError as e:
            raise UsageError(f"classifier={cfg.classifier}: {e} (classifier= or quality=false for none)") from None


def classifier_state(im: ImageModel, cfg: ImageBenchConfig, conditions) -> tuple[object, dict]:
    """(the offline classifier or None, what the machine file says of it: reference features or why not)."""
    if not cfg.quality:
        return None, {}
    if any(isinstance(c, Caption) for c in conditions):
        return None, {"quality_note": "no classifier metrics: t2i images have captions, not class labels"}
    try:
        entry = checkpoints.find(cfg.classifier)
        # another kind of model (a target, a VQ) has no features: it would fail later as an attribute error
        clf = checkpoints.load_module(entry, cfg.device) if entry.meta.get("builder") == "image-classifier" else None
    except Exception as e:  # the classifier is optional: say why it is missing, never fake a number
        return None, {"quality_note": f"no classifier metrics: {str(e).splitlines()[0][:80]}"}
    if clf is None:
        raise UsageError(f"classifier={cfg.classifier}: {entry.ref} is not an image classifier (builder "
                         f"{entry.meta.get('builder')!r}); name one such as tiny-image-classifier, or set "
                         "quality=false")
    # reference: unseen train-region crops (seed + 1; seed 0 are the GPT's own training crops)
    ref = image_metrics.reference_features(clf, max(256, 4 * len(conditions)), cfg.seed + 1)
    return clf, {"reference_features": ref.tolist()}


def image_record(im: ImageModel, cfg: ImageBenchConfig, sample, pixels: torch.Tensor, cond, clf, shard: Shard) -> dict:
    """What a record keeps of one image: tokens, statistics, NLL, classifier features and verdict, PNG."""
    out = {"tokens": sample.tokens, "stats": asdict(sample.stats), "shard": shard.label, "png": png_of(pixels)}
    if cfg.quality:
        out["nll"] = target_nll(im, cfg.cfg_scale, cond, sample.tokens)
    if clf is not None:
        out["features"] = image_metrics.image_features(clf, pixels[None])[0].tolist()
        out["correct"] = image_metrics.class_accuracy(clf, pixels[None], torch.tensor([cond])) == 1.0
    return out


def entry_models(im: ImageModel, cfg: ImageBenchConfig) -> dict[str, ImageModel]:
    """entry -> the model it decodes: `im`, or `im`'s checkpoints loaded once per other dtype in `dtypes`."""
    others = dict.fromkeys(d for d in cfg.dtypes.values() if d != cfg.dtype)
    by_dtype = {cfg.dtype: im, **{d: load_image_model(cfg.model, cfg.drafter, cfg.device, dtype=d, graphs=cfg.graphs,
                                                      need_drafter=im.drafter_net is not None) for d in others}}
    return {m: by_dtype[cfg.dtypes.get(m, cfg.dtype)] for m in cfg.methods}


def grids(cfg: ImageBenchConfig) -> dict[float, Grid]:
    """temperature -> its items: the `num` images, every method on each (batch-1 rows always: the batched ones'
    `vs_ar_b1` reads them)."""
    return {t: Grid(cfg.num, tuple(cfg.methods), (1, *cfg.batch_sizes), f"T{t:g}/i{{}}", f"T{t:g}/", run=Image)
            for t in cfg.temperatures}


def measure_images(im: ImageModel, cfg: ImageBenchConfig, sink, shard: Shard = Shard(), on_item=lambda: None,
                   machine: Callable[[], str] = str) -> None:
    """Decode this shard's images that `sink` (its shard started) has no record of (`Grid.measure`, per temperature):
    at batch 1 an image with every method interleaved on it, at B > 1 one method over the shard's images.
    `cfg`: a plan (`checked_rows`)."""
    # [num] class ids or captions, checked as `generate` checks them (its flags named as the benchmark's keys)
    conditions = image_conditions(im, ImageGenConfig(num=cfg.num, classes=list(cfg.classes), captions=cfg.captions),
                                  {"classes": "classes=[...]", "captions": "captions=FILE", "num": "num (--limit)"})
    parts = conditioned(im, cfg.cfg_scale, conditions[0])[0]
    # a method that cannot run here (mulo-sd on t2i, no EAGLE drafter): one line, up front
    drafters = [build_image_method(method_of(m), parts, options_of(cfg, m))[0] for m in cfg.methods]
    clf, quality = classifier_state(im, cfg, conditions)
    cost = cost_of(Tokens(im.model))  # c(m) of the efficiency of drafting rows; each image runs its CFG branches
    models = entry_models(im, cfg)  # entry -> the model it decodes (its `dtypes` precision, else `im`)
    use = GraphUse(stepped(cfg, models, drafters), sink, shard)
    use.write({"machine": machine(),
               # what the rows record of the conditions: caption indices (t2i) or class names
               "conditions": {"captions": [c.index for c in conditions]} if im.text_conditional else
               {"classes": [im.classes[c] if c < len(im.classes) else c for c in conditions]},
               **quality, "cost_rows": list(cost.rows), "cost": list(cost.cost), "branches": parts.target.branches})
    base = ImageGenConfig(model=cfg.model, cfg_scale=cfg.cfg_scale, seed=cfg.seed, device=cfg.device, num=1,
                          dtype=cfg.dtype, temperature=cfg.temperatures[0])  # a run's own temperature for its checks
    requests = {m: parse_request(replace(base, method=method_of(m), method_options=options_of(cfg, m)), "image")
                for m in cfg.methods}

    def one(temp: float, i: int) -> dict:
        runs = {}
        for m in cfg.methods:
            req = requests[m].with_cfg(temperature=temp, seed=cfg.seed * 7919 + i)
            with use.timing(m):
                samples, px = generate_images(models[m], req, conditions=[conditions[i]])
            runs[m] = image_record(im, cfg, samples[0], px[0], conditions[i], clf, shard)
        return runs

    def decode_batch(temp: float, b: int, m: str, mine: list[int]):
        req = requests[m].with_cfg(num=len(mine), batch_size=b, seed=cfg.seed, temperature=temp)
        return generate_images(models[m], req, conditions=[conditions[i] for i in mine], indices=mine)

    def batch(temp: float, b: int, m: str, mine: list[int]) -> tuple[list[dict], float]:
        with use.timing(f"{m}@b{b}"):
            samples, _ = decode_batch(temp, b, m, mine)
        # each image's pixels decoded alone, as at batch 1: a VQ decode's rounding depends on its batch
        return [image_record(im, cfg, s, decode_pixels(im, [s.tokens])[0], conditions[i], clf, shard)
                for s, i in zip(samples, mine)], max(s.stats.extras["latency_s"] for s in samples)

    # warm-up (allocations, neighbour tables; on CUDA the tree shapes the images meet, their growths captured)
    use.warm(cfg.methods, conditions, lambda m, c: generate_images(models[m], requests[m], conditions=[c]),
             [(work, partial(decode_batch, temp)) for temp, work in grids(cfg).items()])
    for temp, work in grids(cfg).items():
        work.measure(sink, shard, partial(one, temp), partial(batch, temp), use.after_item(on_item))
    use.write()


def stepped(cfg: ImageBenchConfig, models: dict[str, ImageModel], drafters: list) -> dict[str, torch.nn.Module]:
    """The modules whose steps may be captured (`GraphUse`), by name: each precision's target and EAGLE drafter, and
    mulo-sd's low-res drafter (its steps attached at its first batch)."""
    out = {}
    for m, own in models.items():
        dtype = cfg.dtypes.get(m, cfg.dtype)
        out |= {f"target {dtype}": own.model, f"drafter {dtype}": own.drafter_net}
    return out | {"mulo-sd drafter": d.lowres for d in drafters if isinstance(d, MuLoSD)}


def image_rows_of(cfg: ImageBenchConfig, sink) -> tuple[list[dict], dict]:
    """(rows, pixels per (row, temperature)) of a finished run of plan `cfg`: single-process, or shards merged."""
    dtype_of = {m: cfg.dtypes.get(m, cfg.dtype) for m in cfg.methods}
    work = grids(cfg)
    return image_rows(sink.finished(list(work.values()), "images"), work, sink.machines(), dtype_of)


def swept_groups(names) -> list[str]:
    """The sweeps among row names, in order: `S` of every `S=<value>` row whose `S` has a tag (`mulo-sd@tau`)."""
    return list(dict.fromkeys(n.partition("=")[0] for n in names if "=" in n and "@" in n.partition("=")[0]))


def write_outputs(rows: list[dict], pixels: dict, out_dir: Path) -> list[Path]:
    """A PNG grid per (method, temperature) and a speed-quality plot; returns the paths written. Files of an
    earlier run in `out_dir` are kept: a taken name gets a number (`-1`, `-2`, ...)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for (m, t), px in pixels.items():
        grid = image_grid(px, nrow=8)
        paths.append(write_linked(out_dir / f"{m}-T{t:g}-grid.png", lambda tmp: grid.save(tmp, format="PNG")))
    y = "clf_fid" if all(r.get("clf_fid") is not None for r in rows) else "nll"
    for t in sorted({r["temperature"] for r in rows}):
        pts = [r for r in rows if r["temperature"] == t]
        paths.append(plots.speed_quality_plot(pts, y=y, path=free_path(out_dir / f"speed-quality-T{t:g}.png")))
        for sweep in swept_groups(p["method"] for p in pts):  # Pareto fronts of speed vs quality, one per sweep
            stem, reference = PLOTS.get(sweep) or (sweep.replace("@", "-") + "-pareto",
                                                   ("ar", "lantern", sweep.partition("@")[0], sweep))
            group = [p for p in pts if p["method"] in reference or p["method"].startswith(f"{sweep}=")]
            if len(group) > 1:
                paths.append(plots.speed_quality_plot(group, y=y, path=free_path(out_dir / f"{stem}-T{t:g}.png"),
                                                      title=f"{sweep} sweep (T={t:g}): {y} vs speedup"))
    return paths
