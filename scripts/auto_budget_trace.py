"""Where does `budget=auto` lose time against batched AR at batch 8 (tiny image GPT, ADT-Tree, 16 images, T = 0)?

Three measurements, 1 thread:
1. The same decode with the budget forced to AR (cap 0: the tree drafter's pool runs, never drafts) and with the
   real `MeasuredBudget`: total time, target forward time, drafter time, and every tree step (index, live rows, ms).
2. One batched AR forward (16 rows = 8 images x the CFG pair) over rows of equal cache length against rows whose
   lengths differ by up to 3 (what tree steps leave behind): ragged rows write by a row index and attend under a
   mask.

Run: `python scripts/auto_budget_trace.py > docs/logs/tiny/auto-budget-trace.log`
"""

from __future__ import annotations

import collections
import time

import torch

import specgen.image.generate as gen
from specgen.decoding.budget import MeasuredBudget
from specgen.image.target import CFGTarget
from specgen.methods.eagle_batch import EagleBatch

SECONDS: dict[str, float] = collections.defaultdict(float)
STEPS: list[list] = []  # [live rows, cap, seconds] per loop step


def timed(cls, name: str) -> None:
    """Accumulate the wall time of cls.name into SECONDS[name]."""
    f = getattr(cls, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        out = f(*args, **kwargs)
        SECONDS[name] += time.perf_counter() - t
        return out

    setattr(cls, name, wrapper)


class Traced(MeasuredBudget):
    """MeasuredBudget that logs each step, or (forced) always chooses AR."""

    forced = False

    def cap(self, live_rows: int) -> int:
        cap = 0 if self.forced else super().cap(live_rows)
        STEPS.append([live_rows, cap, 0.0])
        return cap

    def observe_step(self, seconds: float) -> None:
        STEPS[-1][2] = seconds
        super().observe_step(seconds)


def decode(im, forced: bool) -> float:
    Traced.forced = forced
    im.budgets.clear()
    SECONDS.clear()
    STEPS.clear()
    cfg = gen.ImageGenConfig(method="adt-tree", num=16, temperature=0.0, batch_size=8,
                             method_options={"budget": "auto"})
    t = time.perf_counter()
    gen.generate_images(im, cfg)
    return time.perf_counter() - t


@torch.inference_mode()
def step_ms(model, lengths: list[int], reps: int = 200) -> float:
    """ms of one AR forward of len(lengths) rows at these cache lengths, in a cache as long as the decode's (the
    class token, 256 image tokens, `MAX_DRAFT` and one: a longer cache costs more under a mask)."""
    cache = model.new_cache(len(lengths), 1 + 256 + gen.MAX_DRAFT + 1)
    cache.lengths = list(lengths)
    x, pos = torch.zeros(len(lengths), 1, dtype=torch.long), torch.tensor(lengths)[:, None]
    for _ in range(10):
        model(x, pos, cache)
    t = time.perf_counter()
    for _ in range(reps):
        model(x, pos, cache)
    return (time.perf_counter() - t) / reps * 1e3


def main() -> None:
    torch.set_num_threads(1)
    for cls, name in [(CFGTarget, "prefill"), (CFGTarget, "forward"), (EagleBatch, "propose"),
                      (EagleBatch, "on_accept")]:
        timed(cls, name)
    gen.MeasuredBudget = Traced
    im = gen.load_image_model("tiny-image-gpt")
    print("# 1. adt-tree@auto at batch 8, 16 images: forced AR vs the measured budget (s)")
    for forced in (True, False, True, False):
        total = decode(im, forced)
        tree = [(i, b, round(s * 1e3)) for i, (b, c, s) in enumerate(STEPS) if c]
        print(f"{'forced AR' if forced else 'auto':9s} total {total:.2f}  steps {len(STEPS)}  "
              + "  ".join(f"{k} {v:.2f}" for k, v in SECONDS.items())
              + f"  tree steps (index, rows, ms) {tree}")
    print("# 2. one AR forward, 8 images x 2 CFG rows: equal cache lengths vs lengths differing by up to 3 (ms)")
    for n in (50, 150, 250):
        same, ragged = step_ms(im.model, [n] * 16), step_ms(im.model, [n + (i // 2) % 4 for i in range(16)])
        print(f"length {n}: equal {same:.2f}  ragged {ragged:.2f}")


if __name__ == "__main__":
    main()
