"""The image benchmark's rows and pixels from its per-item records (no model: `benchmark report` uses it too)."""

from __future__ import annotations

import base64
import io
import statistics
from dataclasses import dataclass

import numpy as np
import torch
import PIL.Image

from specgen.decoding.stats import DecodeStats
from specgen.eval.run_dir import Grid
from specgen.eval.speed import Drafting, Timed, curves, merged
from specgen.eval.speed import efficiency as speed_efficiency
from specgen.image.grid import image_grid
from specgen.image.metrics import fid_from_features
from specgen.methods import get_method


def png_of(pixels: torch.Tensor) -> str:
    """[3, H, W] in [-1, 1] -> base64 PNG of its uint8 pixels (the quantisation every grid applies anyway)."""
    buf = io.BytesIO()
    image_grid(pixels[None], nrow=1, pad=0).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def pixels_of(png: str) -> torch.Tensor:
    """The inverse of `png_of`: [3, H, W] in [-1, 1]."""
    u8 = np.array(PIL.Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB"))
    return torch.from_numpy(u8).permute(2, 0, 1).float() / 127.5 - 1


@dataclass(frozen=True)
class Image:
    """One decoded image as a record holds it."""

    tokens: list[int]
    stats: DecodeStats
    shard: str
    nll: float | None = None
    features: list[float] | None = None
    correct: bool | None = None
    png: str = ""


def method_of(entry: str) -> str:
    """The method of a benchmark entry `method[@tag]`."""
    return entry.split("@", 1)[0]


def collect(records: dict[str, dict], grid: Grid, batch: int) -> tuple[dict[str, list[Image]], dict | None]:
    """(method -> images in index order, method -> shard -> wall; None at batch 1) of one batch size."""
    runs, walls = grid.runs(records, batch)
    return {m: [Image(**{**x, "stats": DecodeStats(**x["stats"])}) for x in rs] for m, rs in runs.items()}, walls


def summarise(method: str, temp: float, rs: list[Image], ar: list[Image], names: dict, dtype: str) -> dict:
    """One row: speed from per-image wall-time ratios (same shard), acceptance, exact match, NLL, conditions."""
    total = merged([s.stats for s in rs])
    ratio = [a.stats.wall_time / s.stats.wall_time for s, a in zip(rs, ar)]
    row = {
        "method": method, "temperature": temp, "dtype": dtype, "lossless": get_method(method_of(method)).lossless,
        "images": len(rs),
        "speedup_vs_ar": statistics.median(ratio), "tau": total.tau, "d_bar": total.d_bar,
        "nfe": total.target_forwards, "tpf": total.tpf, "drafter_share": total.drafter_share,
        "images_per_s": len(rs) / total.wall_time if total.wall_time else 0.0,
        "exact_match_vs_ar": sum(s.tokens == a.tokens for s, a in zip(rs, ar)) / len(rs),
    }
    if "skipped_steps" in total.extras:  # vvs: target forwards saved by skipped verifications
        row["skipped_steps"] = int(total.extras["skipped_steps"])
    if total.extras.get("draft_tokens"):  # mulo-sd: Eq. 5 pass rate and share re-sampled after expansion
        row["accept_rate"] = total.extras["pass_tokens"] / total.extras["draft_tokens"]
        row["resampled_share"] = total.extras["resampled_tokens"] / total.extras["draft_tokens"]
    row.update(names)
    if all(s.nll is not None for s in rs):
        row["nll"] = statistics.fmean(s.nll for s in rs)
    return row


def efficiency(rs: list[Image], ar: list[Image], machines: dict[str, dict], speedup: float) -> dict:
    """eta of a batch-1 row (`eval/speed.py`; a verify of N tokens per image runs b N rows, b = the CFG branches).
    {} for rows without drafts, for methods with their own steps (vvs skips verifications, mulo-sd drafts from
    another model: the model does not describe them), or without a cost curve in the machine files."""
    shards = []
    for shard, cost in curves(machines).items():
        count = sum(s.shard == shard for s in rs)
        if not count:
            continue
        mine, base = merged([s.stats for s in rs if s.shard == shard]), merged([a.stats for a in ar if a.shard == shard])
        d = Drafting(count, mine.steps, mine.target_tokens, sum(mine.accepted), mine.times.get("propose", 0.0),
                     base.wall_time / base.target_forwards, cost, machines[shard].get("branches", 1))
        if not d.drafts or {"skipped_steps", "draft_tokens"} & mine.extras.keys():
            return {}
        shards.append(d)
    return speed_efficiency(shards, speedup)


def timed(rs: list[Image], walls: dict[str, float]) -> Timed:
    return Timed([1.0] * len(rs), [r.shard for r in rs], walls)


def classifier_columns(rows: list[dict], images: dict, reference: list | None, note: str | None) -> None:
    """clf-FID (features pooled over shards vs the reference features) and class accuracy per row."""
    for r in rows:
        if note:
            r["quality_note"] = note
            continue
        rs = images[(r["method"], r["temperature"])]
        if any(s.features is None for s in rs) or reference is None:
            continue
        if len(rs) >= 2:
            r["clf_fid"] = fid_from_features(np.array([s.features for s in rs]), np.array(reference))
        else:  # a Gaussian needs two samples: report what can be computed, mark FID n/a
            r["clf_fid"] = None
            r["quality_note"] = "clf_fid n/a: it needs at least 2 images per row (--limit >= 2)"
        r["class_accuracy"] = sum(map(bool, (s.correct for s in rs))) / len(rs)


def image_rows(records: dict[str, dict], grids: dict[float, Grid], machines: dict[str, dict],
               dtype_of: dict[str, str]) -> tuple[list[dict], dict]:
    """(rows, pixels per (row, temperature)) of a finished run's records (`RunDir.finished`; `grids`: temperature ->
    its items). `dtype_of`: entry -> the precision it decoded at; each row is labelled with it, and a row whose
    precision differs from `ar`'s is also compared with the `ar` entry of its own precision (`exact_match_vs_own_ar`:
    1.0 for lossless methods)."""
    info = next(iter(machines.values()), {})
    names, reference, note = info.get("conditions", {}), info.get("reference_features"), info.get("quality_note")
    rows, images = [], {}
    for t, grid in grids.items():
        single = collect(records, grid, 1)[0]
        ar = single["ar"]
        for m in grid.rows:
            images[(m, t)] = rs = single[m]
            row = summarise(m, t, rs, ar, names, dtype_of[m])
            row.update(efficiency(rs, ar, machines, row["speedup_vs_ar"]))
            own = next((a for a in grid.rows if method_of(a) == "ar" and dtype_of[a] == dtype_of[m]), "ar")
            if own != "ar":
                row["exact_match_vs_own_ar"] = sum(s.tokens == a.tokens for s, a in zip(rs, single[own])) / grid.n
            rows.append(row)
        b1 = Timed.one_by_one([1.0] * len(ar), [a.shard for a in ar], [a.stats.wall_time for a in ar])
        for b in (b for b in grid.batch_sizes if b > 1):
            got, walls = collect(records, grid, b)
            for m in grid.rows:
                # `m@bB`: images/s from each shard's wall time (summed over shards, which run side by side), speedup
                # vs `ar` at the same B and vs batch-1 `ar`, both per shard and weighted by images
                images[(f"{m}@b{b}", t)], mine = got[m], timed(got[m], walls[m])
                rows.append({**summarise(m, t, got[m], got["ar"], names, dtype_of[m]), "method": f"{m}@b{b}",
                             "batch_size": b, "images_per_s": mine.total(),
                             "speedup_vs_ar": mine.vs(timed(got["ar"], walls["ar"])), "vs_ar_b1": mine.vs(b1)})
    classifier_columns(rows, images, reference, note)
    pixels = {k: torch.stack([pixels_of(s.png) for s in rs]) for k, rs in images.items()}
    return rows, pixels
