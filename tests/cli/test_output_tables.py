"""Result tables: whole columns in a file or a pipe, a terminal's width on a terminal."""

from __future__ import annotations

import io

from rich.console import Console

from cli import _output

COLUMNS = ["method", "exact_match_vs_ar", "exact_match_vs_own_ar", "weight_mb_per_token", "bandwidth_share",
           "tokens_per_s", "speedup_vs_ar", "prefix_vs_ar", "nll_base", "pass_at_1", "latency_p90_s"]


def rendered(terminal: bool) -> str:
    console = Console(file=io.StringIO(), width=80, force_terminal=terminal, soft_wrap=True)
    _output.table("rows", [{c: 1.0 for c in COLUMNS} | {"method": "ngram"}], COLUMNS, console)
    assert console.width == 80  # the console's own width is left as it was
    return console.file.getvalue()


def test_a_table_written_to_a_file_keeps_every_column_name_whole():
    text = rendered(terminal=False)
    assert all(c in text for c in COLUMNS) and "…" not in text


def test_a_table_on_a_narrow_terminal_is_shortened_to_its_width():
    text = rendered(terminal=True)
    assert "…" in text and not all(c in text for c in COLUMNS)  # the control: the same rows, cut to 80 columns
