"""What does one layer's attention cost on the native kernel against the torch paths, per forward shape?

SmolLM2-135M's heads (9 query / 3 kv heads of 64) in bfloat16: the native kernel (`specgen/native/attention.c`)
against the chunked invariant torch attention it replaces (`models/attention.py`), for AR steps (1 query), n-gram
verifies (4), wide trees (16, 40) and batches (16 rows x 1 query), causal after a committed prefix. Also float32,
the native kernel against SDPA (the path float32 takes without it), in SmolLM2's shape and the tiny image GPT's
(8 heads of 32, 2 CFG rows). Each time is the mean of 300 calls after a warm-up, 1 thread. Run:
`python scripts/native_attention_times.py > docs/logs/native-attention-times.log`
"""

from __future__ import annotations

import time
from unittest import mock

import torch

from specgen import native
from specgen.models import attention as A
from specgen.models.transformer import additive_mask

BF16_SHAPES = [(1, 1, 139), (1, 1, 400), (1, 4, 140), (1, 4, 400), (1, 16, 400), (1, 40, 400), (16, 1, 300)]
FP32_TEXT_SHAPES = [(1, 1, 300), (1, 4, 300), (1, 16, 300), (16, 1, 300), (16, 4, 300)]
FP32_SHAPES = [(2, 1, 150), (2, 17, 150), (2, 17, 250), (22, 1, 150)]  # (batch rows, queries, keys)


def mean_us(fn, n: int = 300) -> float:
    for _ in range(10):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def inputs(b, h, hkv, d, s, t, dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, n, m, d, generator=g).to(dtype) for n, m in ((h, s), (hkv, t), (hkv, t)))
    mask = torch.ones(b, 1, s, t, dtype=torch.bool)
    mask[..., t - s :] = torch.tril(torch.ones(s, s, dtype=torch.bool))
    return q, k, v, mask


@torch.inference_mode()
def main() -> None:
    torch.set_num_threads(1)
    if native.library("attention") is None:
        raise SystemExit("no C compiler here: the native kernel is not built")
    print("# us per layer call, 1 thread; native = specgen/native/attention.c")
    print("| dtype | heads (q/kv x D) | rows | queries | keys | native | torch path | torch path is |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for b, s, t in BF16_SHAPES:
        q, k, v, mask = inputs(b, 9, 3, 64, s, t, torch.bfloat16)
        nat = A.native_plan(mask, b, s, t, 9, 64)
        with mock.patch.object(A, "attention_path", lambda *_: "chunked"):  # the torch chunked path, as without a compiler
            chunked = A.plan(mask, b, s, t, 9, 3, 64, "cpu", torch.bfloat16)
        times = (mean_us(lambda: A.invariant_attention(q, k, v, nat)),
                 mean_us(lambda: A.invariant_attention(q, k, v, chunked)))
        print(f"| bfloat16 | 9/3 x 64 | {b} | {s} | {t} | {times[0]:.1f} | {times[1]:.1f} | chunked invariant |")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for (h, hkv, d), shapes in (((9, 3, 64), FP32_TEXT_SHAPES), ((8, 8, 32), FP32_SHAPES)):
        for b, s, t in shapes:
            q, k, v, mask = inputs(b, h, hkv, d, s, t, torch.float32)
            nat = A.native_plan(mask, b, s, t, h, d, dtype=torch.float32)
            am = additive_mask(mask)
            times = (mean_us(lambda: A.invariant_attention(q, k, v, nat)),
                     mean_us(lambda: sdpa(q, k, v, attn_mask=am, enable_gqa=hkv < h)))
            print(f"| float32 | {h}/{hkv} x {d} | {b} | {s} | {t} | {times[0]:.1f} | {times[1]:.1f} | SDPA |")


if __name__ == "__main__":
    main()
