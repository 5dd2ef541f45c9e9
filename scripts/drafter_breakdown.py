"""Where does a tree drafter's time go at batch 1? Tiny image GPT, 8 images, T = 0, 1 thread.

Wall time accumulated around the calls of one decode: the target's verify forwards (`CFGTarget.forward`), the
drafter pool's whole step (`EagleBatch.propose`), the drafter's block (`EagleNet.forward`) and its logits
(`EagleBatch.logprobs`: the target's LM head, CFG, log-softmax); what `propose` spends outside the last two is the
tree building. Two repetitions (the first warms up). Run:
`python scripts/drafter_breakdown.py [METHOD] > docs/logs/tiny/drafter-breakdown.log`
"""

from __future__ import annotations

import collections
import sys
import time

import torch

import specgen.image.generate as gen
from specgen.image.target import CFGTarget
from specgen.methods.eagle_batch import EagleBatch
from specgen.models.eagle import EagleNet
from specgen.request import parse_request

SECONDS: dict[str, float] = collections.defaultdict(float)
CALLS: dict[str, int] = collections.defaultdict(int)


def timed(cls, name: str) -> None:
    """Accumulate the wall time and calls of cls.name under 'Class.name'."""
    f, key = getattr(cls, name), f"{cls.__name__}.{name}"

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        out = f(*args, **kwargs)
        SECONDS[key] += time.perf_counter() - t
        CALLS[key] += 1
        return out

    setattr(cls, name, wrapper)


def main() -> None:
    method = sys.argv[1] if len(sys.argv) > 1 else "adt-tree"
    torch.set_num_threads(1)
    for cls, name in [(CFGTarget, "forward"), (EagleBatch, "propose"), (EagleBatch, "logprobs"),
                      (EagleNet, "forward")]:
        timed(cls, name)
    im = gen.load_image_model("tiny-image-gpt")
    for _ in range(2):
        SECONDS.clear()
        CALLS.clear()
        t = time.perf_counter()
        gen.generate_images(im, parse_request(gen.ImageGenConfig(method=method, num=8, temperature=0.0, batch_size=1), "image"))
        total = time.perf_counter() - t
        steps = CALLS["EagleBatch.propose"] or 1
        ms = {k: 1e3 * v / steps for k, v in SECONDS.items()}
        tree = ms["EagleBatch.propose"] - ms["EagleNet.forward"] - ms["EagleBatch.logprobs"]
        share = SECONDS["EagleBatch.propose"] / (SECONDS["EagleBatch.propose"] + SECONDS["CFGTarget.forward"])
        print(f"{method}: {total:.2f} s, {steps} steps, {CALLS['EagleNet.forward'] / steps:.2f} drafter forwards a "
              f"step; ms a step: verify {ms['CFGTarget.forward']:.2f}, drafter {ms['EagleBatch.propose']:.2f} "
              f"(block {ms['EagleNet.forward']:.2f}, logits {ms['EagleBatch.logprobs']:.2f}, tree building "
              f"{tree:.2f}); drafter share of the two {share:.2f}")


if __name__ == "__main__":
    main()
