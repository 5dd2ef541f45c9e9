"""Image benchmark: image methods x temperatures on the same conditions and seeds, interleaved, in one process.

Rows (one per method and temperature): speedup vs `ar` (median of per-image wall-time ratios), tau,
d-bar, NFE, TPF, drafter time share, exact match vs `ar` (lossless methods at T = 0 must be 1.0), the
images' conditions (`classes`: class names, c2i; `captions`: caption indices in the features file, t2i)
and quality: mean target NLL of the generated tokens (teacher-forced under the CFG distribution the
sampler uses, T = 1, with each image's class or caption), class accuracy and FID in the feature space of
the offline classifier trained by `recipes/tiny/image-classifier.yaml` (labelled "clf-FID": it is not
Inception FID).

Text-conditional (t2i) models decode one image per caption of `captions` (a caption-features file, as
`generate --captions`; cycled to `num`). Their rows have NLL but no class accuracy or clf-FID: both
measure images against class labels (and the classifier's class photos), which captions do not give.

A method entry may carry a variant tag, `method@tag` (e.g. `vvs@u`, `vvs@d`): its row is labelled with
the entry and decoded by `method` with `method_options[method]` updated by `method_options[entry]`, so
one run can hold several settings of a method (VVS-U and VVS-D are `vvs` with schedule uniform/dynamic).

MuLo-SD (LOSSY): `mulo_ablations: true` adds `mulo-sd@raster` (raster-scan rejection) and `mulo-sd@no-expand`
(local verification without expansion, l = 0), the paper's Fig. 5c; `mulo_taus: [...]` adds one
`mulo-sd@tau=<v>` row per acceptance threshold (the paper's Pareto sweep, Fig. 8) and a
`mulo-sd-pareto-T<t>.png` plot of those rows with `ar`. Their rows add `accept_rate` (draft tokens passing
Eq. 5) and `resampled_share` (draft tokens re-sampled by the target after expansion).

VVS (LOSSY) sweeps the same way: `vvs_intervals: [...]` adds `vvs@i=<v>` rows (VVS-U, skip every v-th step)
and `vvs_thresholds: [...]` adds `vvs@thr=<v>` rows (VVS-D, skip when the path similarity >= v), each
with a `<name>-pareto-T<t>.png` plot of its rows, `ar`, the never-skipping reference `lantern` and the
default-setting row (`vvs@u`, `vvs@d`; `mulo-sd` for the tau sweep).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from specgen.decoding.stats import DecodeStats
from specgen.errors import UsageError
from specgen.image.captions import Caption
from specgen.image.generate import ImageGenConfig, ImageModel, conditioned, generate_images, image_conditions
from specgen.image.methods import build_image_method
from specgen.methods import get_method


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
    device: str = "cpu"
    threads: int = 0
    quality: bool = True
    classifier: str = "tiny-image-classifier"
    out_dir: str = "specgen-bench-images"
    mulo_ablations: bool = False  # add mulo-sd@raster and mulo-sd@no-expand rows (MuLo-SD Fig. 5c)
    mulo_taus: list[float] = field(default_factory=list)  # MuLo-SD Pareto sweep: one mulo-sd@tau=<v> row per value
    vvs_intervals: list[int] = field(default_factory=list)  # VVS-U sweep: one vvs@i=<v> row per skip interval
    vvs_thresholds: list[float] = field(default_factory=list)  # VVS-D sweep: one vvs@thr=<v> row per threshold
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # B > 1: `method@bB` rows, B images per forward
    # method (or method@tag entry) -> {option: value}
    method_options: dict = field(default_factory=lambda: {"vvs@u": {"schedule": "uniform"},
                                                          "vvs@d": {"schedule": "dynamic"}})


def method_of(entry: str) -> str:
    """The method of a benchmark entry `method[@tag]`."""
    return entry.split("@", 1)[0]


def options_of(cfg: ImageBenchConfig, entry: str) -> dict:
    """Options of an entry: the method's, updated by the entry's own (`method@tag`)."""
    return {**cfg.method_options.get(method_of(entry), {}), **cfg.method_options.get(entry, {})}


MULO_ABLATIONS = {"mulo-sd@raster": {"rejection": "raster"}, "mulo-sd@no-expand": {"radius": 0}}


@dataclass(frozen=True)
class Sweep:
    """A Pareto sweep: one `<method>@<tag>=<value>` row per value of a config list, setting one option."""

    method: str
    tag: str
    option: str
    fixed: tuple = ()  # (option, value) pairs every row of the sweep also sets
    plot: str = ""  # file stem of the sweep's speed-quality plot
    reference: tuple = ("ar",)  # rows drawn with the sweep for comparison
    cast: type = float  # type of the swept values

    def entry(self, value) -> str:
        return f"{self.method}@{self.tag}={value:g}"

    def options(self, value) -> dict:
        return {**dict(self.fixed), self.option: value}


# config field -> the sweep it adds (MuLo-SD Fig. 8: tau; VVS Fig. 5/6: skip interval and similarity threshold)
SWEEPS = {
    "mulo_taus": Sweep("mulo-sd", "tau", "tau", plot="mulo-sd-pareto", reference=("ar", "lantern", "mulo-sd")),
    "vvs_intervals": Sweep("vvs", "i", "interval", fixed=(("schedule", "uniform"),), plot="vvs-u-pareto",
                           reference=("ar", "lantern", "vvs@u"), cast=int),
    "vvs_thresholds": Sweep("vvs", "thr", "threshold", fixed=(("schedule", "dynamic"),), plot="vvs-d-pareto",
                            reference=("ar", "lantern", "vvs@d")),
}


def sweep_entries(cfg: ImageBenchConfig) -> dict[str, dict]:
    """Entry -> options of every sweep row the config asks for (in config order)."""
    values = {name: [sweep.cast(v) for v in getattr(cfg, name)] for name, sweep in SWEEPS.items()}
    return {sweep.entry(v): sweep.options(v) for name, sweep in SWEEPS.items() for v in values[name]}


def with_extra_rows(cfg: ImageBenchConfig) -> ImageBenchConfig:
    """cfg with the MuLo-SD ablation entries and every sweep's entries (and their options) added to `methods`."""
    extra = dict(MULO_ABLATIONS) if cfg.mulo_ablations else {}
    extra.update(sweep_entries(cfg))
    if not extra:
        return cfg
    methods, options = list(cfg.methods), dict(cfg.method_options)
    for entry, o in extra.items():
        if entry not in methods:
            methods.append(entry)
        options[entry] = {**o, **options.get(entry, {})}
    return replace(cfg, methods=methods, method_options=options)


def check_image_methods(cfg: ImageBenchConfig) -> None:
    cfg = with_extra_rows(cfg)
    if "ar" not in cfg.methods:
        raise UsageError("the benchmark needs the 'ar' row: speedups and exact match are measured against it")
    for m in cfg.methods:
        spec = get_method(method_of(m))
        if not spec.runs_on("image"):
            raise UsageError(f"method {m} is for {spec.modality}; the images suite is image methods")
        spec.check_options(options_of(cfg, m))
    if cfg.num < 1 or not cfg.temperatures:
        raise UsageError("the images suite needs num >= 1 and at least one temperature")
    if not cfg.batch_sizes or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1
                                      for b in cfg.batch_sizes):
        raise UsageError(f"batch_sizes must be integers >= 1, got {cfg.batch_sizes}")


@torch.inference_mode()
def target_nll(im: ImageModel, cfg_scale: float, cond: int | Caption, tokens: list[int]) -> float:
    """Mean NLL per token of `tokens` under the target's CFG distribution at temperature 1, given the
    image's condition (class id, c2i; Caption, t2i)."""
    parts, prompt, _ = conditioned(im, cfg_scale, cond)
    target, p = parts.target, len(prompt)
    cache = target.new_cache(1, p + len(tokens) + 1)
    first = target.prefill(torch.tensor([prompt]), cache)
    seq = torch.tensor([tokens[:-1]])
    out = target.forward(seq, torch.arange(p, p + len(tokens) - 1).unsqueeze(0), cache, None)
    logits = torch.cat([first.logits[0, -1:], out.logits[0]], 0).float()  # [N, V]
    return float(-logits.log_softmax(-1).gather(1, torch.tensor(tokens)[:, None]).mean())


# flags of the conditioning errors: the benchmark takes them as config keys
BENCH_FLAGS = {"num": "num (--limit)", "classes": "classes=[...]", "captions": "captions=FILE"}


def bench_conditions(im: ImageModel, cfg: ImageBenchConfig) -> list[int] | list[Caption]:
    """The `num` conditions every method decodes, checked against the model (as `generate` checks them)."""
    return image_conditions(im, ImageGenConfig(num=cfg.num, classes=list(cfg.classes), captions=cfg.captions),
                            BENCH_FLAGS)


def check_builds(im: ImageModel, cfg: ImageBenchConfig, cond: int | Caption) -> None:
    """Build every entry's drafter once on the model, so a method that cannot run on it (mulo-sd on t2i, no
    EAGLE drafter, bad options) fails with one line before any image is decoded."""
    parts = conditioned(im, cfg.cfg_scale, cond)[0]
    for m in cfg.methods:
        build_image_method(method_of(m), parts, options_of(cfg, m))


def condition_names(im: ImageModel, conditions: list[int] | list[Caption]) -> dict[str, list]:
    """What the rows record about the images' conditions: class names (c2i) or caption indices (t2i)."""
    if im.text_conditional:
        return {"captions": [c.index for c in conditions]}
    return {"classes": [im.classes[c] if c < len(im.classes) else c for c in conditions]}


def run_image_benchmark(im: ImageModel, cfg: ImageBenchConfig, on_step=None) -> tuple[list[dict], dict]:
    """Every method on every (temperature, image) pair; returns rows and pixels per (method, T)."""
    cfg = with_extra_rows(cfg)
    check_image_methods(cfg)
    conditions = bench_conditions(im, cfg)  # [num] class ids or captions, refused before any decoding
    check_builds(im, cfg, conditions[0])
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    base = ImageGenConfig(model=cfg.model, cfg_scale=cfg.cfg_scale, seed=cfg.seed, device=cfg.device, num=1)
    # warm-up: one image per method (allocations, neighbour tables)
    for m in cfg.methods:
        generate_images(im, replace(base, method=method_of(m), method_options=options_of(cfg, m)),
                        conditions=conditions[:1])
    rows, pixels = [], {}
    for temp in cfg.temperatures:
        runs: dict[str, list] = {m: [] for m in cfg.methods}
        for i, cond in enumerate(conditions):
            for m in cfg.methods:
                one = replace(base, method=method_of(m), temperature=temp, seed=cfg.seed * 7919 + i,
                              method_options=options_of(cfg, m))
                samples, px = generate_images(im, one, conditions=[cond])
                runs[m].append((samples[0], px[0]))
            if on_step:
                on_step()
        for m, rs in runs.items():
            pixels[(m, temp)] = torch.stack([p for _, p in rs])
            rows.append(summarise(im, cfg, m, temp, rs, runs["ar"], conditions))
        ar_b1 = rows[-len(runs) + list(runs).index("ar")]["images_per_s"] if "ar" in runs else None
        for b in (b for b in cfg.batch_sizes if b > 1):
            rows += batched_rows(im, cfg, replace(base, temperature=temp), b, conditions, pixels, ar_b1)
    if cfg.quality:
        add_classifier_metrics(cfg, rows, pixels, conditions)
    return rows, pixels


def batched_rows(im: ImageModel, cfg: ImageBenchConfig, base: ImageGenConfig, batch: int,
                 conditions: list[int] | list[Caption], pixels: dict, ar_b1: float | None) -> list[dict]:
    """`method@b<B>` rows: every method over all images through B slots (methods one after another); images/s from
    the batch's wall time, speedup vs `ar` at the same B (`speedup_vs_ar`) and vs batch-1 `ar` (`vs_ar_b1`)."""
    runs, walls = {}, {}
    for m in cfg.methods:
        one = replace(base, method=method_of(m), method_options=options_of(cfg, m), num=len(conditions),
                      batch_size=batch, seed=cfg.seed)
        samples, px = generate_images(im, one, conditions=conditions)
        runs[m] = list(zip(samples, px))
        walls[m] = max(s.stats.extras["latency_s"] for s in samples)
    rows = []
    for m, rs in runs.items():
        name = f"{m}@b{batch}"
        pixels[(name, base.temperature)] = torch.stack([p for _, p in rs])
        row = summarise(im, cfg, m, base.temperature, rs, runs.get("ar", rs), conditions)
        row.update(method=name, batch_size=batch, images_per_s=len(rs) / walls[m],
                   speedup_vs_ar=walls.get("ar", walls[m]) / walls[m])
        if ar_b1:
            row["vs_ar_b1"] = row["images_per_s"] / ar_b1
        rows.append(row)
    return rows


def summarise(im: ImageModel, cfg: ImageBenchConfig, method: str, temp: float, rs: list, ar: list,
              conditions: list[int] | list[Caption]) -> dict:
    total = DecodeStats()
    for s, _ in rs:
        total.merge(s.stats)
    ratio = [a.stats.wall_time / s.stats.wall_time for (s, _), (a, _) in zip(rs, ar)]
    row = {
        "method": method, "temperature": temp, "lossless": get_method(method_of(method)).lossless, "images": len(rs),
        "speedup_vs_ar": statistics.median(ratio), "tau": total.tau, "d_bar": total.d_bar,
        "nfe": total.target_forwards, "tpf": total.tpf, "drafter_share": total.drafter_share,
        "images_per_s": len(rs) / total.wall_time if total.wall_time else 0.0,
        "exact_match_vs_ar": sum(s.tokens == a.tokens for (s, _), (a, _) in zip(rs, ar)) / len(rs),
    }
    if "skipped_steps" in total.extras:  # vvs: target forwards saved by skipped verifications
        row["skipped_steps"] = int(total.extras["skipped_steps"])
    if total.extras.get("draft_tokens"):  # mulo-sd: Eq. 5 pass rate and share re-sampled after expansion
        row["accept_rate"] = total.extras["pass_tokens"] / total.extras["draft_tokens"]
        row["resampled_share"] = total.extras["resampled_tokens"] / total.extras["draft_tokens"]
    row.update(condition_names(im, conditions))
    if cfg.quality:
        row["nll"] = statistics.fmean(target_nll(im, cfg.cfg_scale, c, s.tokens) for (s, _), c in zip(rs, conditions))
    return row


def add_classifier_metrics(cfg: ImageBenchConfig, rows: list[dict], pixels: dict,
                           conditions: list[int] | list[Caption]) -> None:
    """clf-FID and class accuracy from the offline classifier, when it is available (c2i rows only)."""
    if any(isinstance(c, Caption) for c in conditions):
        for r in rows:
            r["quality_note"] = "no classifier metrics: t2i images have captions, not class labels"
        return
    try:
        from specgen import registry
        from specgen.eval import image_metrics

        clf = registry.load_module(registry.find(cfg.classifier), cfg.device)
    except Exception as e:  # the classifier is optional: say why it is missing, never fake a number
        for r in rows:
            r["quality_note"] = f"no classifier metrics: {str(e).splitlines()[0][:80]}"
        return
    # reference: unseen train-region crops (seed + 1; seed 0 are the GPT's own training crops)
    ref = image_metrics.reference_features(clf, max(256, 4 * len(conditions)), cfg.seed + 1)
    y = torch.tensor(conditions)
    for r in rows:
        px = pixels[(r["method"], r["temperature"])]
        feats = image_metrics.image_features(clf, px)
        if len(feats) >= 2:
            r["clf_fid"] = image_metrics.fid_from_features(feats, ref)
        else:  # a Gaussian needs two samples: report what can be computed, mark FID n/a
            r["clf_fid"] = None
            r["quality_note"] = "clf_fid n/a: it needs at least 2 images per row (--limit >= 2)"
        r["class_accuracy"] = image_metrics.class_accuracy(clf, px, y)


def write_outputs(rows: list[dict], pixels: dict, out_dir: Path) -> list[Path]:
    """A PNG grid per (method, temperature) and a speed-quality plot; returns the paths written. Files of an
    earlier run in `out_dir` are kept: a taken name gets a number (`-1`, `-2`, ...)."""
    from specgen.eval import plots
    from specgen.image.generate import prepare_out_dir
    from specgen.paths import free_path, link_into_place

    prepare_out_dir(out_dir)
    paths = []
    for (m, t), px in pixels.items():
        path = out_dir / f"{m}-T{t:g}-grid.png"
        grid = plots.image_grid(px, nrow=min(8, len(px)))
        tmp = path.with_name(f".{path.name}.tmp")
        grid.save(tmp, format="PNG")
        paths.append(link_into_place(tmp, path))
    y = "clf_fid" if all(r.get("clf_fid") is not None for r in rows) else "nll"
    for t in sorted({r["temperature"] for r in rows}):
        pts = [dict(r, label=f"{r['method']}") for r in rows if r["temperature"] == t]
        path = free_path(out_dir / f"speed-quality-T{t:g}.png")
        plots.speed_quality_plot(pts, x="speedup_vs_ar", y=y, label="label", path=path)
        paths.append(path)
        for sweep in SWEEPS.values():  # Pareto fronts of speed vs quality, one plot per sweep
            prefix = f"{sweep.method}@{sweep.tag}="
            group = [p for p in pts if p["method"] in sweep.reference or p["method"].startswith(prefix)]
            if any(p["method"].startswith(prefix) for p in group) and len(group) > 1:
                path = free_path(out_dir / f"{sweep.plot}-T{t:g}.png")
                plots.speed_quality_plot(group, x="speedup_vs_ar", y=y, label="label", path=path,
                                         title=f"{sweep.method} {sweep.option} sweep (T={t:g}): {y} vs speedup")
                paths.append(path)
    return paths
