"""The image benchmark's rows and pixels from its per-item records (no model: `benchmark report` uses it too)."""

from __future__ import annotations

import base64
import io
import statistics
from dataclasses import dataclass

import numpy as np
import torch
import PIL.Image

from specgen.decoding.cost import CostCurve
from specgen.decoding.stats import DecodeStats
from specgen.eval.image_metrics import fid_from_features
from specgen.eval.run_dir import RunNotFinished, batched, unrecorded
from specgen.methods import get_method


def png_of(pixels: torch.Tensor) -> str:
    """[3, H, W] in [-1, 1] -> base64 PNG of its uint8 pixels (the quantisation every grid applies anyway)."""
    u8 = ((pixels.detach().float().cpu().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    buf = io.BytesIO()
    PIL.Image.fromarray(u8.permute(1, 2, 0).contiguous().numpy()).save(buf, format="PNG")
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

    @classmethod
    def of(cls, d: dict) -> "Image":
        return cls(**{**d, "stats": DecodeStats(**d["stats"])})


def method_of(entry: str) -> str:
    """The method of a benchmark entry `method[@tag]`."""
    return entry.split("@", 1)[0]


def collect(records: dict[str, dict], order: list[str], num: int, temp: float, batch: int) -> dict | None:
    """(method -> images in index order, method -> shard -> wall) of one temperature and batch size; None while
    an item has no record."""
    if batch == 1:
        items = [records.get(f"T{temp:g}/i{i}") for i in range(num)]
        if any(r is None for r in items):
            return None
        return {"images": {m: [Image.of(r["runs"][m]) for r in items] for m in order}, "walls": None}
    images, walls = {}, {}
    for m in order:
        by_index, walls[m] = batched(records, f"T{temp:g}/b{batch}/{m}/")
        if len(by_index) < num:
            return None
        images[m] = [Image.of(by_index[i]) for i in range(num)]
    return {"images": images, "walls": walls}


def missing(records: dict[str, dict], order: list[str], num: int, temps: list[float], batches: list[int]) -> int:
    """Images (per method, temperature and batch size) no record holds yet."""
    gone = 0
    for t in temps:
        gone += sum(f"T{t:g}/i{i}" not in records for i in range(num))
        for b in (b for b in batches if b > 1):
            for m in order:
                gone += unrecorded(records, f"T{t:g}/b{b}/{m}/", num)
    return gone


def summarise(method: str, temp: float, rs: list[Image], ar: list[Image], names: dict) -> dict:
    """One row: speed from per-image wall-time ratios (same shard), acceptance, exact match, NLL, conditions."""
    total = DecodeStats()
    for s in rs:
        total.merge(s.stats)
    ratio = [a.stats.wall_time / s.stats.wall_time for s, a in zip(rs, ar)]
    row = {
        "method": method, "temperature": temp, "lossless": get_method(method_of(method)).lossless, "images": len(rs),
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
    """eta = speedup / predicted of a batch-1 row, predicted = tau / (c(b N) / c(b) + d), weighted over shards by
    images: a verify of N tokens per image runs b N rows (b = the CFG branches, 1 or 2) where an AR step runs b, and
    d = drafter seconds per step over AR's seconds per target forward (same shard). {} for rows without drafts, for
    methods with their own steps (vvs skips verifications, mulo-sd drafts from another model: the model does not
    describe them), or without a cost curve in the machine files."""
    parts = []
    for shard, info in machines.items():
        mine, theirs = [s.stats for s in rs if s.shard == shard], [a.stats for a in ar if a.shard == shard]
        if not mine or not info.get("cost_rows"):
            continue
        total, base = DecodeStats(), DecodeStats()
        for s in mine:
            total.merge(s)
        for a in theirs:
            base.merge(a)
        own_steps = {"skipped_steps", "draft_tokens"} & total.extras.keys()
        if not total.steps or total.target_tokens <= total.steps or own_steps:
            return {}
        cost, b = CostCurve(tuple(info["cost_rows"]), tuple(info["cost"])), info.get("branches", 1)
        n = total.target_tokens / total.steps
        d = total.times.get("propose", 0.0) / total.steps / (base.wall_time / base.target_forwards)
        parts.append((total.tau / (cost(b * n) / cost(b) + d), len(mine), n, d))
    if not parts:
        return {}
    count = sum(p[1] for p in parts)
    predicted = sum(p[0] * p[1] for p in parts) / count
    return {"verify_tokens": round(sum(p[2] * p[1] for p in parts) / count, 3),
            "draft_cost": round(sum(p[3] * p[1] for p in parts) / count, 4),
            "predicted_speedup": round(predicted, 4), "efficiency": round(speedup / predicted, 4)}


def batched_row(method: str, temp: float, batch: int, rs: list[Image], ar: list[Image], walls: dict, names: dict,
                ar_b1: list[Image] | None) -> dict:
    """A `method@b<B>` row: images/s from each shard's wall time (summed over shards, which run side by side),
    speedup vs `ar` at the same B and vs batch-1 `ar`, both per shard and weighted by images."""
    row = summarise(method, temp, rs, ar, names)

    def per_shard(value) -> float | None:
        parts = [(value(s, w), sum(r.shard == s for r in rs)) for s, w in walls[method].items()]
        parts = [(v, n) for v, n in parts if v is not None and n]
        return sum(v * n for v, n in parts) / sum(n for _, n in parts) if parts else None

    count = lambda s: sum(r.shard == s for r in rs)  # noqa: E731
    row.update(method=f"{method}@b{batch}", batch_size=batch,
               images_per_s=sum(count(s) / w for s, w in walls[method].items()),
               speedup_vs_ar=per_shard(lambda s, w: walls["ar"][s] / w if "ar" in walls else 1.0))
    if ar_b1 is not None:
        def vs_b1(s: str, w: float) -> float | None:
            ref = [a for a in ar_b1 if a.shard == s]
            return (count(s) / w) / (len(ref) / sum(a.stats.wall_time for a in ref)) if ref else None

        row["vs_ar_b1"] = per_shard(vs_b1)
    return row


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


def image_rows(records: dict[str, dict], order: list[str], num: int, temps: list[float], batches: list[int],
               machines: dict[str, dict], dtype_of: dict[str, str] | None = None) -> tuple[list[dict], dict]:
    """(rows, pixels per (row, temperature)) of a finished run; refuses one with missing items. `dtype_of`: entry ->
    the precision it decoded at; each row is labelled with it, and a row whose precision differs from `ar`'s is
    also compared with the `ar` entry of its own precision (`exact_match_vs_own_ar`: 1.0 for lossless methods)."""
    dtype_of = dtype_of or {}
    gone = missing(records, order, num, temps, batches)
    if gone:
        raise RunNotFinished(f"the run is not finished: {gone} of its images have no record yet "
                             "(rerun the same command, or wait for the other shards)")
    info = next(iter(machines.values()), {})
    names, reference, note = info.get("conditions", {}), info.get("reference_features"), info.get("quality_note")
    rows, images = [], {}
    for t in temps:
        single = collect(records, order, num, t, 1)["images"]
        for m in order:
            images[(m, t)] = single[m]
            rows.append(summarise(m, t, single[m], single["ar"], names))
            rows[-1].update(efficiency(single[m], single["ar"], machines, rows[-1]["speedup_vs_ar"]))
            own = next((a for a in order if method_of(a) == "ar" and dtype_of.get(a) == dtype_of.get(m)), None)
            if dtype_of:
                rows[-1]["dtype"] = dtype_of.get(m)
            if own and own != "ar":
                same = sum(s.tokens == a.tokens for s, a in zip(single[m], single[own]))
                rows[-1]["exact_match_vs_own_ar"] = same / num
        for b in (b for b in batches if b > 1):
            got = collect(records, order, num, t, b)
            for m in order:
                images[(f"{m}@b{b}", t)] = got["images"][m]
                rows.append(batched_row(m, t, b, got["images"][m], got["images"]["ar"], got["walls"], names,
                                        single.get("ar")))
                if dtype_of:
                    rows[-1]["dtype"] = dtype_of.get(m)
    classifier_columns(rows, images, reference, note)
    pixels = {k: torch.stack([pixels_of(s.png) for s in rs]) for k, rs in images.items()}
    return rows, pixels
