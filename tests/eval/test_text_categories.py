"""Text benchmark rows per category from records alone (a fake runner: no model)."""

from __future__ import annotations

from dataclasses import asdict

from specgen.eval.run_dir import Grid
from specgen.eval.text_rows import Run, text_rows

GRID = Grid(4, ("ar", "fast"), (1,), "b1/p{}", run=Run)


def run(tokens: list[int], seconds: float) -> dict:
    return asdict(Run(tokens, seconds, forwards=len(tokens), steps=len(tokens) - 1, accepted=0))


def test_rows_over_all_prompts_then_per_category():
    # fast is twice as fast as ar on category x, as fast on y; it differs from ar on y's second prompt
    cats = ["x", "y", "x", "y"]
    ar = [[1, 2, 3, 4]] * 4
    fast = [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [9, 9, 9, 9]]
    records = {f"b1/p{i}": {"runs": {"ar": run(ar[i], 1.0), "fast": run(fast[i], 0.5 if c == "x" else 1.0)}}
               for i, c in enumerate(cats)}
    meta = {"ar": {"model": "m", "lossless": True}, "fast": {"model": "m", "lossless": True}}
    rows = text_rows(records, GRID, meta, {}, cats)
    by = {(r["category"], r["method"]): r for r in rows}
    assert list(by) == [("all", "ar"), ("all", "fast"), ("x", "ar"), ("x", "fast"), ("y", "ar"), ("y", "fast")]
    assert by[("x", "fast")]["speedup_vs_ar"] == 2.0 and by[("y", "fast")]["speedup_vs_ar"] == 1.0
    assert by[("x", "fast")]["exact_match_vs_ar"] == 1.0 and by[("y", "fast")]["exact_match_vs_ar"] == 0.5
    assert by[("all", "fast")]["exact_match_vs_ar"] == 0.75 and by[("x", "ar")]["prompts"] == 2
    assert all("category" not in r for r in text_rows(records, GRID, meta, {}, ["x"] * 4))


def test_prompts_without_a_category_beside_categorised_ones_get_a_named_row():
    """A chat file whose first record has a category and the second none: the second's row was a blank category."""
    records = {f"b1/p{i}": {"runs": {"ar": run([1, 2], 1.0), "fast": run([1, 2], 0.5)}} for i in range(4)}
    meta = {"ar": {"model": "m", "lossless": True}, "fast": {"model": "m", "lossless": True}}
    rows = text_rows(records, GRID, meta, {}, ["math", "", "math", ""])
    assert [r["category"] for r in rows] == ["all", "all", "math", "math", "(none)", "(none)"]
    rows = text_rows(records, GRID, meta, {}, ["all", "x", "(none)", ""])  # a set's own `all`: not every prompt's
    assert [r["category"] for r in rows[::2]] == ["all", "all (category)", "x", "(none) (category)", "(none)"]
