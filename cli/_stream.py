"""Completions streamed to stdout as tokens are accepted: JSON lines (`--stream`) or, on a terminal, the text itself."""

from __future__ import annotations

import json
import signal
import sys

#: Signals that unwind a command (Ctrl-C; SIGTERM, which `cli.main` turns into Ctrl-C): held back during one write.
UNWINDING = {signal.SIGINT, signal.SIGTERM}


def write(text: str) -> None:
    """`text` on stdout at once, an interrupt mid-write taken after it (a JSON line stays whole). The handlers are
    swapped, not the signal mask: a signal another thread receives still runs its Python handler in this one."""
    held: list[int] = []
    before = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in UNWINDING}
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        if held:
            signal.raise_signal(held[0])  # taken now, by the command's own handler


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def sink_for(json_lines: bool, table: bool, rows: int) -> JsonLines | Terminal | None:
    """Where a text run's pieces go (`sink(row, piece)` as accepted, `sink.done(row)` after a row's last one): JSON
    lines (`--stream`), the text itself on a terminal in table format, else None (printed whole at the end)."""
    if json_lines:
        return JsonLines()
    return Terminal(rows) if table and stdout_is_terminal() else None


class JsonLines:
    """`{"row": i, "text": piece}` per piece, in the order accepted; a row's pieces, joined, are its completion."""

    def __call__(self, row: int, text: str) -> None:
        write(json.dumps({"row": row, "text": text}) + "\n")

    def done(self, row: int) -> None:
        pass

    def interrupted(self) -> None:
        pass  # every line written is whole


class Terminal:
    """The completions in prompt order as the unstreamed output prints them: a later prompt's text is held back
    until those before it are done."""

    def __init__(self, rows: int) -> None:
        self.held: list[list[str]] = [[] for _ in range(rows)]
        self.finished = [False] * rows
        self.front = 0  # the prompt whose text goes out as it comes
        self.mid_line = False  # the last text written did not end its line

    def __call__(self, row: int, text: str) -> None:
        if row == self.front:
            self.put(text)
        else:
            self.held[row].append(text)

    def done(self, row: int) -> None:
        self.finished[row] = True
        while self.front < len(self.finished) and self.finished[self.front]:
            self.front += 1
            later = self.held[self.front] if self.front < len(self.held) else []
            self.put("\n\n" + "".join(later))
            later.clear()

    def put(self, text: str) -> None:
        if text:  # set first: an interrupt during the write is taken after it
            self.mid_line = not text.endswith("\n")
        write(text)

    def interrupted(self) -> None:
        """Ctrl-C mid-run: a line the text left open is ended, so the error line that follows starts its own."""
        if self.mid_line:
            write("\n")
