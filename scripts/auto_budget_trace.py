"""Where does `budget=auto` lose time against batched AR at batch 8 (tiny image GPT, ADT-Tree, 16 images, T = 0)?

Two measurements, 1 thread:
1. The same decode with the budget forced to AR (cap 0: the tree drafter's pool runs, never drafts) and with the
   real `MeasuredBudget`: total time, target forward time, drafter time, and every tree step (index, live rows, ms).
2. One batched AR forward (16 rows = 8 images x the CFG pair) over rows of equal cache length against rows whose
   lengths differ by up to 3 (what tree steps leave behind): ragged rows write by a row index and attend under a
   mask.

Run: `python scripts/auto_budget_trace.py > docs/logs/tiny/auto-budget-trace.log`; on a GPU
`python scripts/auto_budget_trace.py --device cuda --method eagle2 --threads 0` (the step times the budget saw are
then host times that include the waits for the device's reads); `--parts 2` times the one forward only.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

import specgen.generate.image as gen
from specgen.decoding.budget import MeasuredBudget
from specgen.devices import now
from specgen.image.target import CFGTarget
from specgen.methods.eagle import EagleBatch
from specgen.request import parse_request

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


def decode(im, forced: bool, method: str, device: str) -> float:
    Traced.forced = forced
    im.budgets.clear()
    SECONDS.clear()
    STEPS.clear()
    cfg = gen.ImageGenConfig(method=method, num=16, temperature=0.0, batch_size=8, device=device,
                             method_options={"budget": "auto"})
    t = now(device)
    gen.generate_images(im, parse_request(cfg, "image"))
    return now(device) - t


def step_summary() -> str:
    """Median ms of the AR and the tree steps the budget saw at 8 live rows."""
    ar = [1e3 * s for b, c, s in STEPS if b == 8 and not c]
    tree = [1e3 * s for b, c, s in STEPS if b == 8 and c]
    med = lambda xs: f"{statistics.median(xs):.2f}" if xs else "-"  # noqa: E731
    return f"at 8 rows: AR steps {len(ar)} median {med(ar)} ms, tree steps {len(tree)} median {med(tree)} ms"


@torch.inference_mode()
def step_ms(model, lengths: list[int], reps: int = 200) -> float:
    """ms of one AR forward of len(lengths) rows at these cache lengths, in a cache as long as the decode's (the
    class token, 256 image tokens, `MAX_DRAFT` and one: a longer cache costs more under a mask)."""
    cache = model.new_cache(len(lengths), 1 + 256 + gen.MAX_DRAFT + 1)
    cache.lengths = list(lengths)
    device = cache.k.device
    x = torch.zeros(len(lengths), 1, dtype=torch.long, device=device)
    pos = torch.tensor(lengths, device=device)[:, None]
    for _ in range(10):
        model(x, pos, cache)
    t = now(device)  # waits for the queued work on a GPU
    for _ in range(reps):
        model(x, pos, cache)
    return (now(device) - t) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--method", default="adt-tree")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: leave torch's default)")
    ap.add_argument("--parts", default="1,2", help="which measurements (1: the decodes, 2: one AR forward)")
    args = ap.parse_args()
    parts = args.parts.split(",")
    if args.threads:
        torch.set_num_threads(args.threads)
    for cls, name in [(CFGTarget, "prefill"), (CFGTarget, "forward"), (EagleBatch, "grow_trees"),
                      (EagleBatch, "on_accept")]:
        timed(cls, name)
    gen.MeasuredBudget = Traced
    im = gen.load_image_model("tiny-image-gpt", device=args.device)
    if "1" in parts:
        print(f"# 1. {args.method}@auto at batch 8, 16 images on {args.device}: forced AR vs the measured budget (s)")
    for forced in (True, False, True, False) if "1" in parts else ():
        total = decode(im, forced, args.method, args.device)
        tree = [(i, b, round(s * 1e3)) for i, (b, c, s) in enumerate(STEPS) if c]
        print(f"{'forced AR' if forced else 'auto':9s} total {total:.2f}  steps {len(STEPS)}  "
              + "  ".join(f"{k} {v:.2f}" for k, v in SECONDS.items())
              + f"  {step_summary()}  tree steps (index, rows, ms) {tree[:12]}{' ...' if len(tree) > 12 else ''}")
    if "2" not in parts:
        return
    print(f"# 2. one AR forward on {args.device}, 8 images x 2 CFG rows: equal cache lengths vs lengths differing by up"
          " to 3 (ms)")
    for n in (50, 150, 250):
        same, ragged = step_ms(im.model, [n] * 16), step_ms(im.model, [n + (i // 2) % 4 for i in range(16)])
        print(f"length {n}: equal {same:.2f}  ragged {ragged:.2f}")


if __name__ == "__main__":
    main()
