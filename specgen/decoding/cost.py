"""The measured cost curve c(m) of a forward over m new tokens, for the `auto` draft budget and benchmark rows."""

from __future__ import annotations

import bisect
import hashlib
import json
import weakref
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from specgen import native, registry
from specgen.devices import is_cpu, module_device, now
from specgen.models import kernel_choice, plan_cache, quantize
from specgen.models.layout import layout_name

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class CostCurve:
    """c(m) at measured row counts (ascending), relative to one row; `unit`: that one row's seconds, which puts two
    models' curves in one unit (`relative`; 1.0 where unknown: a curve given by hand)."""

    rows: tuple[int, ...]
    cost: tuple[float, ...]
    unit: float = 1.0

    def __call__(self, m: int) -> float:
        i = bisect.bisect_left(self.rows, m)
        if i == 0 or (i < len(self.rows) and self.rows[i] == m):
            return self.cost[i]
        i = min(i, len(self.rows) - 1)  # past the last row: extrapolate with the last segment's slope
        r0, r1, c0, c1 = self.rows[i - 1], self.rows[i], self.cost[i - 1], self.cost[i]
        return c0 + (c1 - c0) * (m - r0) / (r1 - r0)


@dataclass(frozen=True)
class Scaled:
    """A curve in another curve's unit: c(m) x `scale`."""

    curve: CostCurve
    scale: float

    def __call__(self, m: int) -> float:
        return self.curve(m) * self.scale


def relative(curve: CostCurve, to: CostCurve) -> Scaled:
    """`curve` in units of one row of `to` (a drafter's forwards next to its target's verify): their one-row times'
    ratio, both timed on this machine."""
    return Scaled(curve, curve.unit / to.unit)


PREFIX = 128


class Timed(Protocol):
    """A model's forward over m new tokens after a committed prefix, as `measure_cost` times it: what a decode step
    runs, its fixed inputs (a condition) included."""

    module: nn.Module  # the model it runs: its structure, tensors and layout key the stored curve

    @property
    def limit(self) -> int:
        """The longest sequence a forward may reach."""

    @property
    def vocab(self) -> int:
        """The token ids it takes: [0, vocab)."""

    def describe(self) -> str:
        """What the time depends on besides the module (its config, a condition's shape): part of the curve's key."""

    def prepare(self, ids: torch.Tensor, positions: torch.Tensor, prefix: int):
        """The state the forwards run over (a cache), its first `prefix` of ids [1, T] committed; T bounds the rest."""

    def forward(self, state, ids: torch.Tensor, positions: torch.Tensor) -> None:
        """ids [1, m] at positions [1, m] after the committed prefix, left pending (never committed)."""


@dataclass(frozen=True)
class Tokens:
    """`Timed` of a Transformer over token ids (a text model, an image GPT)."""

    module: nn.Module

    @property
    def limit(self) -> int:
        return self.module.cfg.max_seq_len

    @property
    def vocab(self) -> int:
        return self.module.cfg.vocab_size

    def describe(self) -> str:
        return repr(self.module.cfg)

    def prepare(self, ids: torch.Tensor, positions: torch.Tensor, prefix: int):
        cache = self.module.new_cache(1, ids.shape[1])
        self.module(ids[:, :prefix], positions[:, :prefix], cache)
        cache.commit(0, list(range(prefix)))
        return cache

    def forward(self, state, ids: torch.Tensor, positions: torch.Tensor) -> None:
        self.module(ids, positions, state)


@torch.inference_mode()
def measure_cost(timed: Timed, rows: tuple[int, ...] = ROWS, rounds: int = 5, prefix: int = PREFIX) -> CostCurve:
    """Best-of-`rounds` time (rounds interleaved over the row counts) of `timed`'s forward over m new tokens after
    `prefix` cached ones, relative to m = 1."""
    device, limit = module_device(timed.module), timed.limit
    rows = tuple(m for m in rows if 2 * m < limit) or rows[:1]  # a short model (an image grid) measures fewer
    prefix = max(1, min(prefix, limit - max(rows) - 1))
    rows = tuple(m for m in rows if prefix + m < limit) or rows[:1]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, timed.vocab, (1, prefix + max(rows)), generator=g).to(device)
    positions = torch.arange(prefix + max(rows), device=device)[None]
    state = timed.prepare(ids, positions, prefix)

    def one(m: int) -> float:
        t = now(device)  # synchronised: on a GPU the forward is only queued when it returns
        timed.forward(state, ids[:, prefix : prefix + m], positions[:, prefix : prefix + m])
        return now(device) - t

    for m in rows:  # warm-up: every kernel touched once
        one(m)
    # rounds over every row count in turn: a burst of other work slows one round of each count, not all of one count
    # (a curve that misjudges drafting is stored for every later start)
    times = [[one(m) for m in rows] for _ in range(rounds)]
    best = [min(t) for t in zip(*times)]
    best = list(accumulate(best[::-1], min))[::-1]  # fewer tokens never cost more (they could be padded): no spikes
    return CostCurve(tuple(rows), tuple(b / best[0] for b in best), best[0])


_CURVES: "weakref.WeakKeyDictionary[nn.Module, dict[tuple[str, int], CostCurve]]" = weakref.WeakKeyDictionary()


def cost_of(timed: Timed) -> CostCurve:
    """`measure_cost(timed)` once per model, what is timed and thread count in this process (a run of many prompts
    measures once), and on the CPU once per machine (`stored_or_measured`), so a start reads it instead of timing
    forwards."""
    per_kind = _CURVES.setdefault(timed.module, {})
    kind = (timed.describe(), torch.get_num_threads())
    if kind not in per_kind:
        per_kind[kind] = stored_or_measured(timed)
    return per_kind[kind]


def path() -> Path:
    return registry.home() / "plans" / "cost-curves.json"


def key(timed: Timed) -> str | None:
    """machine (CPU model and flags, torch) | threads | a digest of what else a forward's time depends on: what is
    timed (`Timed.describe`: the model's config, a condition's shape), the model's layers (quantization mode and group)
    and tensors' shapes and dtypes, its weight layout, and which kernels run, by their rule and sources (a changed
    kernel measures again). None: not stored (a GPU)."""
    module = timed.module
    if not is_cpu(module_device(module)):
        return None
    tensors = [(n, list(t.shape), str(t.dtype)) for n, t in module.state_dict(keep_vars=True).items()]
    model = json.dumps([timed.describe(), repr(module), tensors, layout_name(), kernel_choice.cpu_rule(),
                        quantize.VERSION, ROWS, PREFIX])
    kernels = [native.describe()] + [native.key(name, native.FLAGS) for name in native.SIGNATURES]  # their sources
    digest = hashlib.sha256("\0".join([model, *kernels]).encode()).hexdigest()[:16]
    return f"{plan_cache.machine()}|{torch.get_num_threads()}|{digest}"


def stored_or_measured(timed: Timed) -> CostCurve:
    """The curve stored under `key(timed)`, else measured (and stored where it has a key, is `plausible` and was
    timed on a quiet machine: `plan_cache.timed_quietly`); a missing entry, one that does not parse or an implausible
    one is measured and replaced."""
    k = key(timed)
    stored = plan_cache.read(path()).get(k) if k else None
    try:  # an entry stored before curves kept their `unit` has none: measured again and replaced
        rows, cost = tuple(int(r) for r in stored["rows"]), tuple(float(c) for c in stored["cost"])
        curve = CostCurve(rows, cost, float(stored["unit"]))
        if rows and rows == tuple(sorted(set(rows))) and len(cost) == len(rows) and curve.unit > 0 and plausible(curve):
            return curve
    except (TypeError, KeyError, ValueError):
        pass
    # timed once: a quiet timing was never implausible here (0 of 24; 0 of 36 busy ones either), and a busy one,
    # implausible or not, is this process's alone
    curve, quiet = plan_cache.timed_quietly(lambda: measure_cost(timed))
    if k is not None and quiet and plausible(curve):  # kept for every later start: never a busy machine's
        plan_cache.add(path(), k, {"rows": list(curve.rows), "cost": list(curve.cost), "unit": curve.unit})
    return curve


def plausible(curve: CostCurve) -> bool:
    """A curve a forward can have: m tokens in one forward cost more than nothing and at most what m one-token
    forwards would, twice over for noise. One timed while another process shared the cores can show c(16) = 150 (the
    one-token forward timed alone, the others beside it), and would be kept for every later start."""
    return all(0 < c <= 2 * m for m, c in zip(curve.rows, curve.cost))
