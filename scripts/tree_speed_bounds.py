"""How far can a tree method go on the tiny image GPT at batch 1 on this CPU? Bounds from the block work alone.

One decode of 8 images (T = 0, CFG 4, 1 thread) per method, two rounds interleaved with AR's (the faster kept),
records the rows of every block forward, the target's (the verify forwards) and the drafter's (its catch-up and one
forward per tree level), and times the target's forwards (and their block work, as below) and the whole run; an AR
decode of the same images gives the AR step. Each distinct row count r is then timed as a bare forward of that block
(norms, products, SwiGLU, causal attention over the r rows alone, no cache, no mask planning): its block work w(r),
the best of many calls. A drafter that costs only its block work and tree
building that costs nothing give

    drafter share >= D / (D + V)          D = the drafter's block work a step, V = the measured verify a step
    speedup over AR <= tau * A / (V + D)  A = the measured AR step, tau = tokens a tree step

(the share is `drafter_share` of the benchmarks: the drafter's time over drafter + verify). It also prints the
drafter's share of the row-layers (rows x layers per step), the ratio a drafter of the target's width cannot beat
even at equal cost per row. Run: `python scripts/tree_speed_bounds.py > docs/logs/tiny/tree-speed-bounds.log`
"""

from __future__ import annotations

import collections
import time

import torch

import specgen.generate.image as gen
from specgen.image.target import CFGTarget
from specgen.models.rope import rows_rotation
from specgen.models.transformer import Block
from specgen.request import parse_request

IMAGES = 8
METHODS = ("adt-tree", "eagle2")
ROUNDS = 2


class Recorder:
    """Rows of every Block.forward by owner, and the wall time of CFGTarget.forward, while installed."""

    def __init__(self, drafter_block: Block) -> None:
        self.drafter_block = drafter_block
        self.rows: dict[str, collections.Counter] = {"target": collections.Counter(), "drafter": collections.Counter()}
        self.verify_s = 0.0
        self.verify_calls = 0

    def install(self) -> None:
        block_forward, target_forward = Block.forward, CFGTarget.forward
        rec = self

        def block(self, x, *args, **kwargs):  # x [B, S, D]
            rec.rows["drafter" if self is rec.drafter_block else "target"][x.shape[0] * x.shape[1]] += 1
            return block_forward(self, x, *args, **kwargs)

        def verify(self, *args, **kwargs):
            t = time.perf_counter()
            out = target_forward(self, *args, **kwargs)
            rec.verify_s += time.perf_counter() - t
            rec.verify_calls += 1
            return out

        Block.forward, CFGTarget.forward = block, verify
        self.restore = lambda: (setattr(Block, "forward", block_forward), setattr(CFGTarget, "forward", target_forward))


@torch.inference_mode()
def block_work(block: Block, rope_table: torch.Tensor, layout: str, rows: int, calls: int = 200) -> float:
    """Seconds of one bare forward of `block` over `rows` positions (best of `calls`)."""
    x = torch.randn(1, rows, block.attention_norm.weight.shape[0])  # [1, r, D]
    rot = rows_rotation(rope_table[torch.arange(rows)[None]], layout)
    best = float("inf")
    for _ in range(calls):
        t = time.perf_counter()
        block(x, rot, 0, None, None, True, None)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    torch.set_num_threads(1)
    im = gen.load_image_model("tiny-image-gpt")
    target, drafter = im.model, im.drafter_net
    layers = target.cfg.n_layers

    def decode(method: str) -> float:
        t = time.perf_counter()
        gen.generate_images(im, parse_request(gen.ImageGenConfig(method=method, num=IMAGES, temperature=0.0, batch_size=1,
                                                   out_dir="/tmp/specgen-tree-bounds"), "image"))
        return time.perf_counter() - t

    for method in ("ar", *METHODS):  # warm-up: kernels measured, caches allocated
        gen.generate_images(im, parse_request(gen.ImageGenConfig(method=method, num=1, temperature=0.0, batch_size=1,
                                                   out_dir="/tmp/specgen-tree-bounds"), "image"))
    tokens = IMAGES * target.cfg.rope_grid ** 2
    runs = {m: [] for m in ("ar", *METHODS)}  # (seconds, recorder) per round
    for _ in range(ROUNDS):  # interleaved: drift spreads over every row; the best round of each is kept
        for method in runs:
            rec = Recorder(drafter.layers[0])
            rec.install()
            try:
                runs[method].append((decode(method), rec))
            finally:
                rec.restore()
    ar_step = min(s for s, _ in runs["ar"]) / tokens  # one token per AR step
    print(f"# tiny-image-gpt ({layers} layers, dim {target.cfg.dim}), {IMAGES} images, T = 0, CFG 4, 1 thread, "
          f"AR step {1e3 * ar_step:.3f} ms (best of {ROUNDS} interleaved rounds)")
    print("| method | tau | verify ms a step (V) | its block work | drafter block work ms a step (D) | drafter rows a "
          "call | row-layer share | share floor D / (D + V) | speedup ceiling tau A / (V + D) | measured vs AR |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    cost: dict[tuple[str, int], float] = {}
    for method in METHODS:
        seconds, rec = min(runs[method], key=lambda run: run[0])
        steps = rec.verify_calls
        for owner, block in (("target", target.layers[0]), ("drafter", drafter.layers[0])):
            for r in rec.rows[owner]:
                if (owner, r) not in cost:
                    table = target.rope_table if owner == "target" else drafter.rope_table
                    cost[(owner, r)] = block_work(block, table, target.cfg.rope_layout, r)
        d = sum(cost[("drafter", r)] * n for r, n in rec.rows["drafter"].items()) / steps
        t = sum(cost[("target", r)] * n for r, n in rec.rows["target"].items()) / steps
        v = rec.verify_s / steps
        tau = tokens / steps
        dr = sum(r * n for r, n in rec.rows["drafter"].items())
        tr = sum(r * n for r, n in rec.rows["target"].items())
        calls = sum(rec.rows["drafter"].values())
        print(f"| {method} | {tau:.2f} | {1e3 * v:.2f} | {1e3 * t:.2f} | {1e3 * d:.2f} | {dr / calls:.1f} | "
              f"{dr / (dr + tr):.3f} | {d / (d + v):.3f} | {tau * ar_step / (v + d):.2f} | "
              f"{ar_step * tokens / seconds:.2f} |")


if __name__ == "__main__":
    main()
