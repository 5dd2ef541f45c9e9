"""The text benchmark's rows from its per-item records (no model: `benchmark report` uses it too)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Annotated

import numpy as np

from specgen.decoding.cost import CostCurve
from specgen.eval.run_dir import Grid
from specgen.eval.speed import Drafting, Timed, curves, efficiency, per_shard, summed


@dataclass(frozen=True)
class Run:
    """One method on one prompt (batched: `seconds` is the sequence's latency, queueing included)."""

    tokens: list[int]
    seconds: Annotated[float, "> 0"]  # (bounds: eval/json_shape.BOUNDS, checked on the records read back)
    forwards: int
    steps: int
    accepted: int
    draft_seconds: float = 0.0  # time in the drafter (specgen rows)
    verify_tokens: int = 0  # tokens fed to verify forwards, prefill excluded (specgen rows)
    prefill_seconds: float | None = None  # prompt prefill (specgen rows; batched: the batch's, shared equally)
    nll_sum: float | None = None  # the original model's -log p of `tokens` (teacher-forced), when measured
    nll_count: int = 0
    passed: bool | None = None  # HumanEval tests pass on the completion, when executed
    shard: str = "0-of-1"  # the shard (process, device) that measured it


@dataclass(frozen=True)
class Measured:
    """Runs of one batch size, ready to summarise: method -> runs in prompt order; method -> shard -> wall."""

    runs: dict[str, list[Run]]
    walls: dict[str, dict[str, float]]


def collect(records: dict[str, dict], grid: Grid, batch: int) -> Measured:
    """The runs of `batch` from the records of a finished run (`RunDir.finished`)."""
    runs, walls = grid.runs(records, batch)
    runs = {m: [Run(**r) for r in rs] for m, rs in runs.items()}
    return one_by_one(runs) if walls is None else Measured(runs, walls)


def one_by_one(runs: dict[str, list[Run]]) -> Measured:
    """Batch-1 runs: a shard's wall time is the sum of its runs' times."""
    return Measured(runs, {m: summed([r.shard for r in rs], [r.seconds for r in rs]) for m, rs in runs.items()})


def roofline(row: str, rs: list[Run], walls: dict[str, float], machines: dict[str, dict]) -> dict:
    """Weight bytes a batch-1 row streams per generated token (one forward's weights / TPF), and the share of its
    shard's measured copy bandwidth that this rate of bytes uses (weighted over shards). {} when not measured."""
    infos = {s: machines.get(s, {}) for s in walls}
    if not all(i.get("bandwidth_gbs") and (i.get("streamed_bytes") or {}).get(row) for i in infos.values()):
        return {}
    tokens, forwards = sum(len(r.tokens) for r in rs), sum(r.forwards for r in rs)
    per_token = next(iter(infos.values()))["streamed_bytes"][row] * forwards / max(tokens, 1)
    share = per_shard(rs, [r.shard for r in rs], walls, lambda s, xs, w: per_token * sum(len(r.tokens) for r in xs)
                      / w / (infos[s]["bandwidth_gbs"] * 1e9))
    return {"weight_mb_per_token": round(per_token / 1e6, 2), "bandwidth_share": round(share, 4)}


def batch_rows(measured: Measured, batch: int, meta: dict[str, dict], costs: dict[str, CostCurve],
               reference: Measured | None, machines: dict[str, dict] | None = None) -> list[dict]:
    """One row per method of one batch size. `meta`: method -> {model, lossless}; `reference`: batch-1 runs."""
    runs, walls, ar = measured.runs, measured.walls, measured.runs["ar"]
    rows = []
    for m, rs in runs.items():
        shards = [r.shard for r in rs]
        tps = [len(r.tokens) / r.seconds for r in rs]
        ratio = [t / (len(a.tokens) / a.seconds) for t, a in zip(tps, ar)]  # same prompt, same shard
        tokens, forwards, steps = sum(len(r.tokens) for r in rs), sum(r.forwards for r in rs), sum(r.steps for r in rs)
        own = runs.get(f"ar@{meta[m]['model']}", ar)
        row = {
            "method": m, **meta[m], "prompts": len(rs),
            "tokens_per_s": statistics.median(tps),
            "aggregate_tokens_per_s": tokens / sum(r.seconds for r in rs),
            "speedup_vs_ar": statistics.median(ratio),
            "tpf": tokens / forwards,
            "tau": (sum(r.accepted for r in rs) + steps) / steps if steps else None,
            "nfe": forwards,
            "exact_match_vs_ar": sum(r.tokens == a.tokens for r, a in zip(rs, ar)) / len(rs),
            "exact_match_vs_own_ar": sum(r.tokens == a.tokens for r, a in zip(rs, own)) / len(rs),
            "new_tokens": tokens,
            "throughput_tokens_per_s": timed(rs, walls[m]).total(),
            # the same without the prompts' prefill (compute-bound on a CPU, so batching cannot amortise it)
            "decode_tokens_per_s": (timed(rs, {s: w - sum(r.prefill_seconds for r in rs if r.shard == s)
                                               for s, w in walls[m].items()}).total()
                                    if all(r.prefill_seconds is not None for r in rs) else None),
            "latency_median_s": float(np.percentile([r.seconds for r in rs], 50)),
            "latency_p90_s": float(np.percentile([r.seconds for r in rs], 90)),
            "c_batch": round(per_shard(rs, shards, walls[m], lambda s, xs, w: costs[s](batch) if s in costs else None)
                             or 0, 3)
            if costs else None,
        }
        row["throughput_vs_ar"] = timed(rs, walls[m]).vs(timed(ar, walls["ar"]))
        if reference is not None:
            ref = reference.runs["ar"]
            row["throughput_vs_ar_b1"] = timed(rs, walls[m]).vs(timed(ref, reference.walls["ar"]))
            row["exact_match_vs_ar_b1"] = sum(r.tokens == a.tokens for r, a in zip(rs, ref)) / len(rs)
        if m.startswith("ar@"):
            row["prefix_vs_ar"] = statistics.mean(common_prefix(r.tokens, a.tokens) for r, a in zip(rs, ar))
        if all(r.nll_sum is not None for r in rs):
            row["nll_base"] = sum(r.nll_sum for r in rs) / max(1, sum(r.nll_count for r in rs))
        if all(r.passed is not None for r in rs):
            row["pass_at_1"] = sum(r.passed for r in rs) / len(rs)  # one greedy sample per problem
        if batch == 1:
            row.update(roofline(m, rs, walls[m], machines or {}))
            drafting = [drafting_of([r for r in rs if r.shard == s], [a for a in ar if a.shard == s], costs[s])
                        for s in walls[m] if s in costs]
            row.update(efficiency([d for d in drafting if d.drafts], row["speedup_vs_ar"]))
        row["batch_size"] = batch
        rows.append(row)
    return rows


def timed(rs: list[Run], walls: dict[str, float]) -> Timed:
    return Timed([len(r.tokens) for r in rs], [r.shard for r in rs], walls)


def drafting_of(rs: list[Run], ar: list[Run], cost: CostCurve) -> Drafting:
    """A row's verify steps on one shard (`rs`), with that shard's AR runs."""
    return Drafting(len(rs), sum(r.steps for r in rs), sum(r.verify_tokens for r in rs), sum(r.accepted for r in rs),
                    sum(r.draft_seconds for r in rs), sum(a.seconds for a in ar) / sum(a.forwards for a in ar), cost)


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


OVERALL, UNCATEGORIZED = "all", "(none)"  # the rows over every prompt; of prompts without a category beside others


def text_rows(records: dict[str, dict], grid: Grid, meta: dict[str, dict], machines: dict[str, dict],
              categories: list[str] | None = None) -> list[dict]:
    """Every row of a finished run's records (`RunDir.finished`; batch sizes in `grid.batch_sizes` order), with
    batch-1 rows per category when the prompts (`categories`, one per prompt) have several."""
    costs = curves(machines)
    rows, reference = [], None
    for batch in grid.batch_sizes:
        measured = collect(records, grid, batch)
        rows += batch_rows(measured, batch, meta, costs, reference if batch > 1 else None, machines)
        if batch == 1:
            reference = measured
            split = by_category(measured, categories or [], meta, costs, machines)
            rows = [{**r, "category": OVERALL} if split and r["batch_size"] == 1 else r for r in rows] + split
    return rows


def by_category(measured: Measured, categories: list[str], meta: dict[str, dict], costs: dict[str, CostCurve],
                machines: dict[str, dict]) -> list[dict]:
    """Batch-1 rows of each category's prompts (in order of first appearance); none for prompts of one category.
    A category's speedups and exact match are over its own prompts' runs."""
    names = list(dict.fromkeys(categories))
    if len(names) < 2:
        return []
    rows = []
    for name in names:
        keep = [i for i, c in enumerate(categories) if c == name]
        part = one_by_one({m: [rs[i] for i in keep] for m, rs in measured.runs.items()})
        rows += [{**r, "category": label(name)} for r in batch_rows(part, 1, meta, costs, None, machines)]
    return rows


def label(category: str) -> str:
    """A category's rows' label: a prompt set's own `all` or `(none)` is told from the rows over every prompt and
    those of prompts without a category (two `all` rows of one method were one category's and every prompt's)."""
    if category in (OVERALL, UNCATEGORIZED):
        return f"{category} (category)"
    return category or UNCATEGORIZED
