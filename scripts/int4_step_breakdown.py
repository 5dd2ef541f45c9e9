"""How much of an int4 SmolLM2-135M decode step is kernels and how much is everything else (`--threads N`, default 1)?

One AR forward (1 new token over a 138-token cached prompt, its blocks on models/native_block.py's straight run) is
timed whole, then again with parts replaced by stubs that return a tensor of the right shape at once: first the
quantized products (int4 layers and the int8 LM head), then also the attention core (`native_self_attention`, which
also does RoPE and the KV write), then SwiGLU's gate glue (split, silu, mul). The differences split the step; the
profiler would inflate the many small ops it wraps. Also counts the aten ops of one forward. Run:
`python scripts/int4_step_breakdown.py [--threads 2] > docs/logs/int4-step-breakdown.log`. Cited by
docs/results/precision.md (the static n-gram cache section).
"""

from __future__ import annotations

import argparse
import collections
import time
from dataclasses import replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specgen import native
from specgen.models import native_block
from specgen.models import quantize as Q
from specgen.text.target import load_text_model


class CountOps(TorchDispatchMode):
    """Counts aten ops by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=100, help="forwards a timing (best of 3)")
    args = ap.parse_args()
    threads, reps = args.threads, args.reps
    torch.set_num_threads(threads)
    tm = load_text_model("smollm2-135m", "cpu", quantize="int4")
    model = tm.target.model
    prompt = torch.tensor([tm.tokenizer.encode("def fib(n):\n    '''Return the n-th Fibonacci number.'''\n" * 6)])
    cache = model.new_cache(1, 512)
    with torch.inference_mode():
        tm.target.prefill(prompt, cache)
    tok, pos = torch.tensor([[5]]), torch.tensor([[prompt.shape[1]]])

    @torch.inference_mode()
    def forward_ms() -> float:
        for _ in range(5):
            model(tok, pos, cache)
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            for _ in range(reps):
                model(tok, pos, cache)
            best = min(best, (time.perf_counter() - t) / reps * 1e3)
        return best

    with torch.inference_mode(), CountOps() as counted:
        model(tok, pos, cache)
    print(f"prompt {prompt.shape[1]} tokens; one AR forward runs {sum(counted.ops.values())} aten ops "
          f"({counted.ops['qmm'] + counted.ops['_weight_int4pack_mm_for_cpu']} quantized products on "
          f"{'qmm.c' if counted.ops['qmm'] else 'torch'}, {model.cfg.n_layers} layers); "
          f"ms per forward, best of 3 x {reps}, {threads} thread(s); attention and row ops: {native.describe()}")
    whole = forward_ms()
    print(f"whole forward                          {whole:6.2f}")
    zeros: dict = {}

    def stub(width):  # a product's shape (width(module) outputs), no work: one tensor per shape, made once
        def run(module, x, threads):
            key = (*x.shape[:-1], width(module))
            if key not in zeros:
                zeros[key] = torch.zeros(key, dtype=Q.ACT_DTYPE)
            return zeros[key]
        return run

    product = stub(lambda lin: lin.out_features)
    kinds_key = (Q.QuantizedLinear, Q.ACT_DTYPE)  # KINDS is keyed by layer class and activation dtype
    kind = native_block.KINDS[kinds_key]  # the straight run's quantized products (models/native_block.py)
    Q.QuantizedLinear.forward = lambda self, x: product(self, x, 1)  # the head
    Q.qmm_product = product  # as the gate calls it
    native_block.KINDS[kinds_key] = replace(kind, product=product)
    rest = forward_ms()
    print(f"  quantized products stubbed           {rest:6.2f}   (products {whole - rest:5.2f})")
    native_block.native_self_attention = lambda qkv, rot, kc, vc, p: p.out.view(*qkv.shape[:2], -1)  # its buffer
    no_core = forward_ms()
    print(f"  + attention core stubbed             {no_core:6.2f}   (attention core {rest - no_core:5.2f}: with RoPE "
          "and the KV write)")
    native_block.KINDS[kinds_key] = replace(native_block.KINDS[kinds_key], gate=stub(lambda ffn: ffn.hidden))
    floor = forward_ms()
    print(f"  + SwiGLU gate stubbed                {floor:6.2f}   (split, silu, mul {no_core - floor:5.2f}; what is "
          "left: norms, residuals, embedding, RoPE table, plan, Python)")


if __name__ == "__main__":
    main()
