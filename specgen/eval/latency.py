"""Per-sequence latency summaries (median, p90) for batched runs."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`, linearly interpolated between order statistics."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
