"""Do smaller draft trees win back the tiny image GPT's speculation? Time per tree shape against AR at batch 1.

8 images (T = 0, CFG 4, 1 thread) per row through `generate_images`, each row run twice interleaved with the
others after a one-image warm-up, best of the two; ratio = AR seconds / row seconds. Rows: the CPU defaults of
ADT-Tree and EAGLE-2 (16 nodes) and smaller trees. Run:
`python scripts/image_tree_sizes.py > docs/logs/tiny/image-tree-sizes.log`
"""

from __future__ import annotations

import time

import torch

import specgen.image.generate as gen
from specgen.models import kernel_choice
from specgen.request import parse_request

ROWS = [("ar", {}), ("adt-tree", {}), ("adt-tree", {"total_tokens": 12}), ("adt-tree", {"total_tokens": 8}),
        ("eagle2", {}), ("eagle2", {"total_tokens": 8}), ("eagle2", {"total_tokens": 8, "depth": 4, "top_k": 2})]


def main() -> None:
    torch.set_num_threads(1)
    im = gen.load_image_model("tiny-image-gpt")

    def seconds(method: str, options: dict, num: int) -> float:
        t = time.perf_counter()
        gen.generate_images(im, parse_request(gen.ImageGenConfig(method=method, num=num, temperature=0.0, batch_size=1,
                                                   method_options=options, out_dir="/tmp/specgen-tree-sizes"), "image"))
        return time.perf_counter() - t

    for method, options in ROWS:
        seconds(method, options, 1)
    rounds = [[seconds(m, o, 8) for m, o in ROWS] for _ in range(2)]  # interleaved: drift spreads over every row
    best = [min(col) for col in zip(*rounds)]
    print(f"# tiny-image-gpt, 8 images, T = 0, 1 thread, plan: {kernel_choice.describe()}")
    print("| method | options | seconds | vs AR |")
    print("|---|---|---:|---:|")
    for (method, options), s in zip(ROWS, best):
        print(f"| {method} | {options or 'CPU defaults'} | {s:.2f} | {best[0] / s:.3f} |")


if __name__ == "__main__":
    main()
