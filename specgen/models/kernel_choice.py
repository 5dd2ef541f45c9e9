"""Which kernel runs a few-row product on this machine: the row count from which oneDNN beats MKL, measured per model.

A decoder's products have 1 row (an AR step), a few (verification, Jacobi blocks) or many (prefill). MKL's GEMV
over the column-major weight and oneDNN's GEMM over a packed copy (`models/packed_linear.py`) trade places at a
row count that depends on the CPU, the thread count and whether the model's weights fit in the cache, and two
machines of this project, both sold as AMD EPYC, disagree on it for one row (`python scripts/layout_forward_times.py`;
numbers in docs/results/text.md, "Kernel micro-benchmarks").

A constant tuned on one machine would make AR (the baseline of every speedup) slower on another and inflate
every ratio. So the choice is measured: one pass of r-row products over all of a model's linear weights
(the weight traffic of one forward, from memory when they exceed the cache and from the cache when they do
not), MKL vs oneDNN, for r in `ROWS`, interleaved, best of `ROUNDS`; products of at least `min_rows` rows go to
oneDNN, where `min_rows` is the smallest measured r from which oneDNN is faster at every larger measured r.
`decode_layout` measures at load, at the thread count of that moment; a later thread count is measured on the
first product that runs under it (benchmarks warm up first). One measurement takes 20 passes: tens of ms for
the tiny models, ~1 s for SmolLM2 on one idle core (many times that on oversubscribed cores, like everything
else). It is shared by every model with the same weight shapes in the process and can be pinned with
`SPECGEN_PACKED_MIN_ROWS=N` (reproducing a run, or skipping the measurement).
"""

from __future__ import annotations

import os
import time
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ENV = "SPECGEN_PACKED_MIN_ROWS"
#: Row counts timed: AR steps, verification of a few tokens, Jacobi blocks; more rows always favoured oneDNN.
ROWS = (1, 2, 3, 4, 8)
ROUNDS = 2
#: Used when the weights to measure are gone (a copy outlived its model): the crossover of cache-resident models.
FALLBACK_MIN_ROWS = 4
_MEASURED: dict[tuple, int] = {}  # (weight signature, threads) -> min_rows, for this process


@dataclass(frozen=True)
class Timing:
    """ms of one pass over a model's linear weights per row count, on each kernel."""

    rows: tuple[int, ...]
    mkl_ms: tuple[float, ...]
    dnn_ms: tuple[float, ...]

    @property
    def min_rows(self) -> int:
        """The smallest row count from which oneDNN is faster at every larger measured count (else past the last)."""
        best = self.rows[-1] + 1
        for r, mkl, dnn in reversed(list(zip(self.rows, self.mkl_ms, self.dnn_ms))):
            if dnn >= mkl:
                break
            best = r
        return best


def distinct(linears: list) -> list:
    """`linears` with each weight once (tied layers, e.g. an LM head sharing the embedding, count once)."""
    return list({id(lin.weight): lin for lin in linears}.values())


def cpu_packable(w: torch.Tensor) -> bool:
    """The measurement times CPU kernels (MKL vs oneDNN): only CPU weights of a packable dtype are ever measured."""
    return w.device.type == "cpu" and w.dtype in (torch.float32, torch.bfloat16)


def pinned_min_rows() -> int | None:
    """`SPECGEN_PACKED_MIN_ROWS` as a positive int, None when unset."""
    from specgen.errors import UsageError

    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise UsageError(f"{ENV} must be a positive integer (products of at least that many rows use oneDNN), "
                         f"got {raw!r}")
    return int(raw)


@torch.inference_mode()
def time_passes(linears: list, rows: tuple[int, ...] = ROWS, rounds: int = ROUNDS) -> Timing:
    """Best-of-`rounds` ms of r-row products over every distinct weight of `linears` (PackedLinears), per kernel."""
    weights = distinct(linears)
    inputs = {(lin.in_features, lin.weight.dtype): torch.randn(max(rows), lin.in_features).to(lin.weight.dtype)
              for lin in weights}
    packed = [lin.packed_weight() for lin in weights]

    def one_pass(r: int, onednn: bool) -> float:
        t = time.perf_counter()
        for lin, p in zip(weights, packed):
            x = inputs[(lin.in_features, lin.weight.dtype)][:r]  # [r, in]
            if onednn:
                torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
            else:
                F.linear(x, lin.weight)
        return (time.perf_counter() - t) * 1e3

    best = {(r, k): float("inf") for r in rows for k in (False, True)}
    for r in rows:  # warm-up: touch every weight once per kernel
        one_pass(r, False), one_pass(r, True)
    for _ in range(rounds):
        for r in rows:
            for k in (False, True):
                best[(r, k)] = min(best[(r, k)], one_pass(r, k))
    return Timing(rows, tuple(best[(r, False)] for r in rows), tuple(best[(r, True)] for r in rows))


def describe() -> str:
    """The crossovers in use at the current thread count, for benchmark headers: 'oneDNN from 2 rows' (several
    models: '2 / 4 rows'), the pinned value, or '' when nothing was measured yet."""
    pinned = pinned_min_rows()
    if pinned is not None:
        return f"oneDNN from {pinned} rows (pinned)"
    threads = torch.get_num_threads()
    rows = sorted({r for (_, t), r in _MEASURED.items() if t == threads})
    return f"oneDNN from {' / '.join(map(str, rows))} rows" if rows else ""


class KernelChoice:
    """Shared by one model's PackedLinears: the smallest product sent to oneDNN at the current thread count."""

    def __init__(self, linears: list, fixed: int | None = None) -> None:
        self.fixed = fixed
        linears = distinct(linears)
        self._linears = [weakref.ref(lin) for lin in linears]  # weak: a copied layer must not drag the model along
        self.signature = tuple((lin.in_features, lin.out_features, lin.weight.dtype) for lin in linears)
        self._threads = -1
        self._min_rows = FALLBACK_MIN_ROWS

    def min_rows(self) -> int:
        """Pinned, else measured once per thread count (and shared by models with the same weight shapes)."""
        if self.fixed is not None:
            return self.fixed
        threads = torch.get_num_threads()
        if threads != self._threads:
            self._min_rows, self._threads = self._measure(threads), threads
        return self._min_rows

    def _measure(self, threads: int) -> int:
        key = (self.signature, threads)
        if key not in _MEASURED:
            linears = [ref() for ref in self._linears]
            if not linears or any(lin is None for lin in linears):
                return FALLBACK_MIN_ROWS
            if not all(cpu_packable(lin.weight) for lin in linears):  # CPU kernels only: never timed on a GPU
                return FALLBACK_MIN_ROWS
            _MEASURED[key] = time_passes(linears).min_rows
        return _MEASURED[key]

    def __deepcopy__(self, memo: dict) -> KernelChoice:
        """Shared, not copied: a copied layer (e.g. a bfloat16 draft LM head) keeps its model's measurement."""
        return self

    def __getstate__(self) -> dict:
        """Pickled without the (unpicklable) weak references: an unpickled model measures nothing, uses the fallback."""
        return {**self.__dict__, "_linears": []}
