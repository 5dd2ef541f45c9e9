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


def test_names_in_a_table_are_printed_as_given_not_read_as_markup_or_emoji():
    # a prompt set's categories and row names are the user's text: `[red]` is no style, `:b:` no emoji
    console = Console(file=io.StringIO(), width=80, force_terminal=False, soft_wrap=True)
    _output.table("of [bold]p.jsonl", [{"method": "ngram@a:b:c", "category": "[red]chat"}], ["category", "method"],
                  console)
    text = console.file.getvalue()
    assert "[red]chat" in text and "ngram@a:b:c" in text and "of [bold]p.jsonl" in text
