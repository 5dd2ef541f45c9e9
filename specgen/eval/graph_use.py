"""A benchmark's captured decode steps (models/graphs.py): what they hold, the timed items' captures, the warm-up."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from functools import partial
from itertools import islice, repeat
from typing import Callable, Iterable, Iterator, Sequence

import torch

from specgen.eval.run_dir import Grid, RunDir
from specgen.models.graphs import StepGraphs
from specgen.shard import Shard

WARM_RUNS = 4  # the most discarded runs a row makes before timing (`GraphUse.warm`)


class GraphUse:
    """The captured steps of a shard's models (name -> a module `graphs.attach` may give steps to: looked up at each
    use, so steps attached during the run count, as mulo-sd's drafter's), the captures its timed items made by row
    (a resumed shard's earlier processes' included, from its machine file), and that machine file."""

    def __init__(self, models: dict[str, torch.nn.Module | None], sink: RunDir, shard: Shard) -> None:
        self.models = {name: m for name, m in models.items() if m is not None}
        self.sink, self.shard, self.info = sink, shard, {}
        self.timed = Counter((sink.machines().get(shard.label) or {}).get("timed_captures") or {})
        self.saved = dict(self.timed)

    def steps(self) -> dict[str, StepGraphs]:
        """name -> steps, each StepGraphs once (models of one precision may share a module)."""
        found = {}
        for name, m in self.models.items():
            if m.graphs is not None and all(m.graphs is not g for g in found.values()):
                found[name] = m.graphs
        return found

    def captures(self) -> int:
        """Captures made so far (their prompts' chunk steps included: `describe`)."""
        return sum(g.captures for g in self.steps().values())

    def facts(self) -> dict:
        """What the machine file adds: each model's `describe()` (graphs, graph_mb, replays, eager_calls, captures) and
        the captures timed items made, by row; {} where no model has captured steps (a CPU: graphs are off)."""
        steps = self.steps()
        if not steps and not self.timed:
            return {}
        return {"step_graphs": {name: g.describe() for name, g in steps.items()}, "timed_captures": dict(self.timed)}

    def write(self, info: dict | None = None) -> None:
        """The shard's machine file: `info` (the suite's facts; None: the last given) with `facts()`; written before
        the run and after it."""
        self.info = self.info if info is None else info
        self.sink.write_machine(self.shard, {**self.info, **self.facts()})
        self.saved = dict(self.timed)

    def after_item(self, then: Callable[[], None]) -> Callable[[], None]:
        """`then` after each recorded item, the machine file rewritten first where the item made a timed capture (a
        killed run keeps the counts of the items it recorded)."""
        def done() -> None:
            if self.timed != self.saved:
                self.write()
            then()
        return done

    @contextmanager
    def timing(self, row: str) -> Iterator[None]:
        """Count the captures made inside a timed part as `row`'s (a capture costs tens of ms on CUDA)."""
        before = self.captures()
        yield
        made = self.captures() - before
        if made > 0:
            self.timed[row] += made

    def warm(self, rows: Sequence[str], items: Sequence, run: Callable[[str, object], object],
             batched: Iterable[tuple[Grid, Callable[[int, str, list[int]], object]]] = ()) -> None:
        """A suite's discarded runs before timing, one call: its rows on `items` (`warm_up`); then, where steps are
        captured (CUDA), each batched (B, row) of each (grid, batch) in `batched` this shard has left runs
        `batch(B, row, positions)` on its first B items as a row does (its shapes captured before the timed batch),
        and the rows warm again (the static buffer grown to B rows dropped their batch-1 captures). A CPU runs no
        batch: one costs what its timed run does, and captures none."""
        self.warm_up(rows, items, run)
        if not self.steps():
            return
        left = [partial(batch, b, row, grid.mine(self.shard)[:b]) for grid, batch in batched
                for b, row in grid.left(self.sink.records([grid]), self.shard)[1]]
        for first in left:
            self.settle(repeat(first))
        if left:
            self.warm_up(rows, items, run)

    def warm_up(self, rows: Sequence[str], items: Sequence, run: Callable[[str, object], object]) -> None:
        """Each row runs `items` in turn until a run makes no new capture, at most WARM_RUNS: where no step is captured
        (a CPU) one run (allocations, first-use work); on CUDA the runs capture the shapes the items reach, and
        `timing` counts any a timed item still makes."""
        for row in rows:
            self.settle(partial(run, row, item) for item in items)

    def settle(self, runs: Iterable[Callable[[], object]]) -> None:
        """The first of `runs` (at most WARM_RUNS) up to one that makes no new capture."""
        for run in islice(runs, WARM_RUNS):
            before = self.captures()
            run()
            if self.captures() == before:
                break


def timed_note(machines: dict[str, dict]) -> str:
    """One warning line for a run whose timed items made captures (every shard's machine file summed), else ""."""
    rows: Counter = Counter()
    for info in machines.values():
        rows.update(info.get("timed_captures") or {})
    total = sum(rows.values())
    if not total:
        return ""
    listed = ", ".join(f"{row} {n}" for row, n in rows.most_common())
    return (f"warning: timed items made {total} capture{'s' * (total > 1)} of decode steps ({listed}); their times "
            "include them (tens of ms each on CUDA): the run's machine files hold them (timed_captures, step_graphs)")
