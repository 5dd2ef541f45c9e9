"""Value checks of method options (`method_options.NAME=VALUE`): a table option name -> (predicate, expectation).

`MethodSpec.check_options` runs them on every method's options before a model is loaded, so a wrong type
(`block_size=abc`), a value out of range (`block_size=0`, `num_draft=-3`) or NaN (`delta=nan`) is one usage
error naming the option. Checks a method makes between options (adt-tree bounds, pcllm-mr spawn rules) stay
with the method; this table only says what each single value must be.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from specgen.errors import UsageError


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return (is_int(v) or isinstance(v, float)) and math.isfinite(v)


MAX_INT = 2 ** 31 - 1  # sizes beyond this are not sizes (and overflow int32 kernels)


def int_at_least(lo: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: is_int(v) and lo <= v <= MAX_INT), f">= {lo} (an integer below 2**31)"


def integer() -> tuple[Callable[[Any], bool], str]:
    """Any integer (the method checks its range itself)."""
    return (lambda v: is_int(v) and abs(v) <= MAX_INT), "an integer"


def number_in(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> tuple[Callable[[Any], bool], str]:
    def ok(v: Any) -> bool:
        return is_number(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)

    return ok, f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'} (a finite number)"


def text() -> tuple[Callable[[Any], bool], str]:
    return (lambda v: isinstance(v, str)), "a string"


def flag() -> tuple[Callable[[Any], bool], str]:
    return (lambda v: isinstance(v, bool)), "true or false"


NONNEG_NUMBER = ((lambda v: is_number(v) and v >= 0), ">= 0 (a finite number)")
POS_NUMBER = ((lambda v: is_number(v) and v > 0), "> 0 (a finite number)")
ANY_NUMBER = (is_number, "a finite number")

CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "seed": int_at_least(0),
    # text: jacobi / cllm / pcllm / pcllm-mr / ngram
    "block_size": int_at_least(1),
    "num_blocks": int_at_least(1),
    "spawn_ratio": number_in(0, 1, lo_open=True),
    "pool_size": int_at_least(0),
    "verify": int_at_least(1),
    "ngram": int_at_least(0),
    "num_draft": int_at_least(1),
    "max_ngram": int_at_least(1),
    "min_ngram": int_at_least(1),
    # mesh: xspecmesh
    "heads": text(),
    "num_heads": int_at_least(0),
    "criterion": text(),
    "delta": number_in(0, 1),
    "top_k_accept": int_at_least(1),
    "sampling": text(),
    "top_k_tree": int_at_least(1),
    "draft_dtype": text(),
    "lookup": int_at_least(0),
    "vertex_lookup": flag(),
    "min_path_prob": number_in(0, 1, hi_open=True),
    # image: eagle2 / adt-tree / lantern / vvs / mulo-sd
    "depth": int_at_least(1),
    "top_k": int_at_least(1),
    "total_tokens": int_at_least(1),
    "beta": POS_NUMBER,
    "l_d": int_at_least(0),
    "l_k": int_at_least(0),
    "d_min": int_at_least(0),
    "d_max": int_at_least(1),
    "k_min": int_at_least(0),
    "k_max": int_at_least(1),
    "d0": int_at_least(1),
    "k0": int_at_least(1),
    "init": text(),
    "lantern_k": int_at_least(0),
    "lantern_delta": NONNEG_NUMBER,
    "schedule": text(),
    "interval": int_at_least(1),
    "threshold": ANY_NUMBER,
    "alpha": NONNEG_NUMBER,
    "stride": int_at_least(1),
    "staleness": int_at_least(0),
    "refresh": flag(),
    "lowres": text(),
    "upsampler": text(),
    "tau": NONNEG_NUMBER,
    "radius": integer(),
    "rejection": text(),
    "draft_rows": int_at_least(1),
}


def check_option_values(method: str, options: dict[str, Any]) -> None:
    """Refuse the first option whose value is not what the table expects (names without a check pass)."""
    for name, value in options.items():
        ok, expected = CHECKS.get(name, (lambda v: True, ""))
        if not ok(value):
            raise UsageError(f"{name} must be {expected} (method_options.{name} of {method}), got {value!r}")
