"""Which kernels a forward runs, per device x dtype x shape: the one rule (its table and why: docs/precision.md)."""

from __future__ import annotations

import os
import time
import weakref
from dataclasses import dataclass, field, replace
from itertools import takewhile

import torch
import torch.nn.functional as F

from specgen import native
from specgen.devices import onednn_packs
from specgen.errors import UsageError
from specgen.models import plan_cache, prompt
from specgen.native import cuda_ops, ops

ENV = "SPECGEN_PACKED_MIN_ROWS"
#: Activation dtypes whose cached CPU forwards run the native kernels (attention and the norms around it).
NATIVE_DTYPES = (torch.bfloat16, torch.float32)
#: Weight dtypes whose CPU decode products run tiled.c at every row count (`step_products`; bfloat16 over float32
#: tiles, each product exact in float32, the sum rounded once to bfloat16).
STEP_DTYPES = (torch.float32, torch.bfloat16)
#: Activation dtypes whose cached CUDA forwards attend over the same lists (native/cuda_ops.py).
CUDA_LIST_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Weight dtypes whose GPU products run as GEMMs of one row count (SlicedLinear): the library picks a GEMM's kernel,
#: and each row's order of sums, by its shape in every float dtype (docs/precision.md).
SLICED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Row counts timed: AR steps, verification of a few tokens, Jacobi blocks, batched steps.
ROWS = (1, 2, 3, 4, 8, 16, 32)
#: MKL is timed up to here: from 8 rows on oneDNN always beat it (by ~2x at 16 on every machine measured).
MKL_MAX_ROWS = 8
ROUNDS = 2
#: Used when the weights to measure are gone (a copy outlived its model): the crossover of cache-resident models.
FALLBACK_MIN_ROWS = 4
_MEASURED: dict[tuple, Plan] = {}  # (weight signature, threads) -> plan, for this process
CAPPED_CHUNKED = [False]  # whether this process attended a softcapped model chunked on the CPU (`attention_path`)


@dataclass(frozen=True)
class Plan:
    """The kernel of an r-row prompt prefill's product (a decode step's is tiled.c at every count: `step_products`):
    native for `native` = (lo, hi) with lo <= r <= hi (hi None: no bound), else oneDNN from `min_rows` rows, else
    MKL."""

    min_rows: int
    native: tuple[int, int | None] | None = None
    # timed while other processes took the core (`plan_cache.timed_quietly`): used, not kept (`KernelChoice.kept`)
    busy: bool = field(default=False, compare=False, repr=False)

    def kernel(self, rows: int) -> str:
        """"native", "onednn" or "mkl"."""
        if self.native is not None and self.native[0] <= rows and (self.native[1] is None or rows <= self.native[1]):
            return "native"
        return "onednn" if rows >= self.min_rows else "mkl"

    @property
    def uses_onednn(self) -> bool:
        """False when the native loop takes every row count (oneDNN's packed copies can go)."""
        return self.native != (1, None)

    def describe(self) -> str:
        """'native 1-16 rows, oneDNN from 2 rows' (the native part first: it wins where both name a count)."""
        lo, hi = self.native or (0, 0)
        parts = [] if self.native is None else [f"native from {lo} rows" if hi is None else f"native {lo}-{hi} rows"]
        return ", ".join(parts + ([f"oneDNN from {self.min_rows} rows"] if self.uses_onednn else []))


@dataclass(frozen=True)
class Timing:
    """ms of one pass over a model's linear weights per row count, on each kernel (inf: not timed there; no
    `native_ms`: the native loop was not timed)."""

    rows: tuple[int, ...]
    mkl_ms: tuple[float, ...]
    dnn_ms: tuple[float, ...]
    native_ms: tuple[float, ...] = ()

    @property
    def min_rows(self) -> int:
        """The smallest row count from which oneDNN is faster at every larger measured count (else past the last)."""
        wins = list(takewhile(lambda t: t[2] < t[1], reversed(list(zip(self.rows, self.mkl_ms, self.dnn_ms)))))
        return wins[-1][0] if wins else self.rows[-1] + 1

    @property
    def native(self) -> tuple[int, int | None] | None:
        """The first run of consecutive measured counts where the native loop beats both others: (lo, hi), hi None
        when the run reaches the last count; None when it never wins."""
        wins = [nat < min(mkl, dnn) for mkl, dnn, nat in zip(self.mkl_ms, self.dnn_ms, self.native_ms)]
        if True not in wins:
            return None
        lo = wins.index(True)
        end = wins.index(False, lo) if False in wins[lo:] else None  # the first count after the run
        return self.rows[lo], (None if end is None else self.rows[end - 1])

    @property
    def plan(self) -> Plan:
        return Plan(self.min_rows, self.native)


def distinct(linears: list) -> list:
    """`linears` with each weight once (tied layers, e.g. an LM head sharing the embedding, count once)."""
    return list({id(lin.weight): lin for lin in linears}.values())


def cpu_packable(w: torch.Tensor) -> bool:
    """A CPU weight in float32 or bfloat16 that this CPU's oneDNN packs (`devices.onednn_packs`: an AVX2-only CPU
    refuses bfloat16). The measurement times CPU kernels (MKL vs oneDNN): only such weights are ever measured."""
    return w.device.type == "cpu" and w.dtype in (torch.float32, torch.bfloat16) and onednn_packs(w.dtype)


def pinned_min_rows() -> int | None:
    """`SPECGEN_PACKED_MIN_ROWS` as a positive int, None when unset."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise UsageError(f"{ENV} must be a positive integer (products of at least that many rows use oneDNN), "
                         f"got {raw!r}")
    return int(raw)


def inference_on_cpu(dtypes: tuple, *tensors: torch.Tensor) -> bool:
    """CPU tensors of one dtype among `dtypes`, grad mode off (the native kernels have no backward; decode forwards
    all run under inference mode, so all of a model's decode steps take the same path)."""
    first = tensors[0]
    return (not torch.is_grad_enabled() and first.dtype in dtypes
            and all(t.dtype == first.dtype and t.device.type == "cpu" for t in tensors))


def attention_path(dtype: torch.dtype, device: torch.device | str, softcap: float = 0.0) -> str:
    """The attention of a cached forward: "native" (each query over its list of visible slots: attention.c on a CPU, a
    Triton kernel on CUDA), "chunked" or "sdpa" (the table above); a prompt prefill's: sdpa, but `prompts_as_steps`.
    A model whose scores are softcapped (`softcap` > 0, Gemma 2) decodes chunked on a CPU: attention.c has no cap (the
    C kernels stay frozen), and SDPA none either (`Attention.attend` computes it dense there)."""
    if prompt.active() and not prompts_as_steps(dtype, device):
        return "sdpa"
    kind = torch.device(device).type
    if softcap and kind == "cpu" and not torch.is_grad_enabled():
        CAPPED_CHUNKED[0] = True  # for machine labels (`machine.label`): the step kernels attention.c is not
        return "chunked"
    if not torch.is_grad_enabled() and (
            (kind == "cpu" and dtype in NATIVE_DTYPES and native.library("attention") is not None)
            or cuda_kernels(dtype, device)):
        return "native"
    return "sdpa" if dtype == torch.float32 else "chunked"


def native_norms(*tensors: torch.Tensor) -> bool:
    """Whether a norm (or residual add and norm) over these tensors runs one native kernel: glue.c on a CPU, Triton on
    CUDA (native/cuda_ops.py), grad mode off."""
    first = tensors[0]
    if first.device.type == "cuda":
        return cuda_kernels(first.dtype, first.device) and all(t.dtype == first.dtype and t.device == first.device
                                                               for t in tensors)
    return inference_on_cpu(NATIVE_DTYPES, *tensors) and native.library("glue") is not None


def one_pass(x: torch.Tensor) -> bool:
    """Whether a step over x runs as one of the CUDA-only Triton ops (native/ops.py: RoPE, the gate, a step's plan, a
    tree growth's; torch's ops elsewhere): CUDA, grad mode off. Asked per layer: a CPU tensor answers at the first
    test."""
    return x.is_cuda and cuda_kernels(x.dtype, x.device)


def cuda_kernels(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether a CUDA forward in `dtype` runs the Triton kernels (native/cuda_ops.py): grad mode off (they have no
    backward), a dtype they take, Triton here and not turned off (`cuda_ops.available`)."""
    return (torch.device(device).type == "cuda" and not torch.is_grad_enabled() and dtype in CUDA_LIST_DTYPES
            and cuda_ops.available())


def prompts_as_steps(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether a prompt prefill attends as a decode step does (the list attention, whose sums do not depend on how many
    queries a forward holds), so that a prompt may run as chunks of captured steps with the bits of one forward
    (`StepGraphs.prefill`): on CUDA with the Triton kernels. A CPU prefills with SDPA, its faster kernel for many
    queries; a prefill's bits are then its own, as every method prefills alike."""
    return cuda_kernels(dtype, device)


def tiled_products(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a product the plan gives tiled.c may run there: float32 on the CPU, grad mode off, tiled.c built."""
    return inference_on_cpu((torch.float32,), x, weight) and native.library("tiled") is not None


def step_products(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a product is a decode step's that runs tiled.c whatever its row count: float32 or bfloat16 on the CPU,
    grad mode off, outside a prompt prefill, tiled.c built. The invariant: a row's bits never depend on how many rows
    share the product, so a verify scores each token as its AR step did. MKL's and oneDNN's products give a row other
    bits at other row counts (a bfloat16 SmolLM2's w2 from 3 rows: n-gram's greedy text then left AR's on 14 of 20
    HumanEval prompts), and a plan that switches kernels by row count does too (docs/precision.md)."""
    return (not prompt.active() and inference_on_cpu(STEP_DTYPES, x, weight)
            and native.library("tiled") is not None)


def sliced_products(weight: torch.Tensor) -> bool:
    """Whether a Linear's products run as GEMMs of one fixed row count (`models/sliced_linear.py`): float weights off
    the CPU, where the GPU library picks a GEMM's reduction order by its shape."""
    return weight.dtype in SLICED_DTYPES and weight.device.type != "cpu"


@torch.inference_mode()
def time_passes(linears: list, rows: tuple[int, ...] = ROWS, rounds: int = ROUNDS) -> Timing:
    """Best-of-`rounds` ms of r-row products over every distinct weight of `linears` (PackedLinears), per kernel."""
    weights = distinct(linears)
    inputs = {(lin.in_features, lin.weight.dtype): torch.randn(max(rows), lin.in_features).to(lin.weight.dtype)
              for lin in weights}
    packed = [lin.packed_weight() for lin in weights]
    timeable = native.library("tiled") is not None and all(lin.weight.dtype == torch.float32 for lin in weights)
    kernels = ("mkl", "onednn", "native") if timeable else ("mkl", "onednn")
    tiles = [lin.tiled_weight() for lin in weights] if "native" in kernels else []

    def one_pass(r: int, kernel: str) -> float:
        t = time.perf_counter()
        for i, lin in enumerate(weights):
            x = inputs[(lin.in_features, lin.weight.dtype)][:r]  # [r, in]
            if kernel == "onednn":
                torch.ops.mkldnn._linear_pointwise(x, packed[i], None, "none", [], "")
            elif kernel == "native":
                ops.tiled_linear(x, tiles[i][0], None, lin.out_features, torch.get_num_threads())
            else:
                F.linear(x, lin.weight)
        return (time.perf_counter() - t) * 1e3

    timed = [(r, k) for r in rows for k in kernels if k != "mkl" or r <= MKL_MAX_ROWS]
    best = {(r, k): float("inf") for r in rows for k in kernels}
    for r, k in timed:  # warm-up: touch every weight once per kernel
        one_pass(r, k)
    for _ in range(rounds):
        for r, k in timed:
            best[(r, k)] = min(best[(r, k)], one_pass(r, k))
    per = {k: tuple(best[(r, k)] for r in rows) for k in kernels}
    return Timing(rows, per["mkl"], per["onednn"], per.get("native", ()))


def describe() -> str:
    """The kernel plans in use at the current thread count, for benchmark headers: 'native from 1 rows' or 'oneDNN
    from 2 rows' (several models: joined by ' / '), the pinned value, or '' when nothing was measured yet."""
    if (pinned := pinned_min_rows()) is not None:
        return f"oneDNN from {pinned} rows (pinned)"
    threads = torch.get_num_threads()
    return " / ".join(sorted({p.describe() for (_, t), p in _MEASURED.items() if t == threads}))


def stored_or_measured(linears: list, signature: tuple, threads: int) -> Plan:
    """The plan stored for this machine, torch, thread count and shapes (`plan_cache`), else measured and stored. One
    timed on a busy machine (`plan_cache.timed_quietly`) serves only starts that find the machine busy too: a quiet
    start times it again and replaces it, and nothing is laid out or costed for it (`kept`)."""
    k = plan_cache.key(signature, threads)
    if (stored := plan_cache.load(k)) is not None:
        return Plan(*stored)
    busy = plan_cache.load(k, busy=True)  # timed while other processes took the core: read by starts that find
    if busy is not None and not plan_cache.quiet_now():  # them there too (timing again costs seconds, no better)
        return Plan(*busy, busy=True)
    timing, quiet = plan_cache.timed_quietly(lambda: time_passes(linears))
    plan = replace(timing.plan, busy=not quiet)
    if quiet or busy is None:  # a tuple: a JSON list
        plan_cache.add(plan_cache.path(), k, {"min_rows": plan.min_rows, "native": plan.native,
                                              **({} if quiet else {"busy": True})})
    return plan


class KernelChoice:
    """Shared by one model's PackedLinears: the kernel plan at the current thread count."""

    def __init__(self, linears: list, fixed: Plan | None = None) -> None:
        self.fixed = fixed
        linears = distinct(linears)
        self._linears = [weakref.ref(lin) for lin in linears]  # weak: a copied layer must not drag the model along
        self.signature = tuple((lin.in_features, lin.out_features, lin.weight.dtype) for lin in linears)
        self._threads = -1  # no plan yet: the first `plan()` reads or measures one

    def known(self) -> bool:
        """Whether the plan at this thread count needs no timing: pinned, measured in this process, or stored."""
        return self.kept() or (self.signature, torch.get_num_threads()) in _MEASURED

    def kept(self) -> bool:
        """Whether every start reads the plan at this thread count: pinned, or from a quiet timing (stored, or this
        process's); a busy machine's is timed again by a quiet start, so what a load lays out for it is not kept
        (`layout_cache.plan_of`)."""
        threads = torch.get_num_threads()
        if self.fixed is not None:
            return True
        if (measured := _MEASURED.get((self.signature, threads))) is not None:  # this process's: quiet, or not
            return not measured.busy
        return plan_cache.load(plan_cache.key(self.signature, threads)) is not None

    def plan(self) -> Plan:
        """Pinned, else measured once per thread count (and shared by models with the same weight shapes)."""
        if self.fixed is not None:
            return self.fixed
        threads = torch.get_num_threads()
        if threads != self._threads:
            self._plan, self._threads = self._measure(threads), threads
        return self._plan

    def _measure(self, threads: int) -> Plan:
        key, linears = (self.signature, threads), [ref() for ref in self._linears]
        if any(lin is None for lin in linears):  # a copy outlived its model: what was measured, if anything
            return _MEASURED.get(key, Plan(FALLBACK_MIN_ROWS))
        if key not in _MEASURED:
            if not all(cpu_packable(lin.weight) for lin in linears):  # CPU kernels only: never timed on a GPU
                return Plan(FALLBACK_MIN_ROWS)
            _MEASURED[key] = stored_or_measured(linears, self.signature, threads)
        plan = _MEASURED[key]
        for lin in linears:  # the copy this plan never reads (remade on use should another thread count need it); the
            lin._packed = lin._packed if plan.uses_onednn else None  # tiles stay: every decode step reads them
        return plan

    def __deepcopy__(self, memo: dict) -> KernelChoice:
        """Shared, not copied: a copied layer (e.g. a bfloat16 draft LM head) keeps its model's measurement."""
        return self


def quantized_product(in_features: int, group: int) -> str:
    """The kernel of an int8 / int4 layer's decode products: "native" (qmm.c, 15-bit activations) where its library is
    built and the widths fit its 32-input blocks, else "torch" (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`,
    bfloat16 activations). Decided per process and shape, so every forward of a model takes one path."""
    fits = in_features % ops.QMM_BLOCK == 0 and group % ops.QMM_BLOCK == 0
    return "native" if fits and native.library("qmm") is not None else "torch"
