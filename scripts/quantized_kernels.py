"""Which CPU kernel (torch's, or specgen's qmm.c) runs a quantized SmolLM2-135M's products fastest, per shape and rows?

One pass = the products of one forward in order (30 blocks of wqkv 576->960, wo 576->576, w13 576->3072,
w2 1536->576, each block its own weights, then the 576->49152 LM head), so a weight comes from memory as in a decode
step, not from a cache warmed by the same product. Per kernel, the time of each product shape summed over the pass
(ms) and the bytes it streams over that time (GB/s). Weights are random with the real shapes (the kernels' speed does
not depend on the values). Kernels, interleaved per round, best of `--rounds`:

    int4 g32|g64      torch.ops.aten._weight_int4pack_mm_for_cpu, bf16 activations (groups of 32 | 64 inputs)
    int8 x bf16       torch.ops.aten._weight_int8pack_mm, int8 per-channel weights, bf16 activations
    int8 dyn rows    quantized::linear_dynamic (fbgemm), int8 per-channel weights and int8 activations quantized
                      per call: one call per row (rows independent)
    int8 dyn fixed   the same op, all rows in one call: each row scaled to max |x| = 1 and a row [1, -1, 0...]
                      appended, so the activation range, and with it the quantization, is the same in every call
    fp16 fbgemm       quantized::linear_dynamic_fp16: float16 weights, float32 activations and sums
    f32 F.linear      float32 weights (MKL), for the memory-bound reference
    qmm int4 g32      specgen's qmm.c (the shipped kernel where it is built): int4 codes, 15-bit activations
    qmm int8          the same for int8 per-channel codes (the LM head)

Also checks, per kernel, that each row of an 8-row product is bitwise the row computed alone.
Run: `python scripts/quantized_kernels.py > docs/logs/quantized-kernels-avx2.log` (the torch kernels), or
`python scripts/quantized_kernels.py --kernels "int4 g32,qmm int4 g32,int8 x bf16,qmm int8" > docs/logs/qmm-kernels.log`
(the quantized ones). A change to qmm.c against the build before it, interleaved in one process: `--kernels "qmm int4 g32,qmm int8"
--against ~/.cache/specgen/native/qmm-<hash>.so`.
"""

from __future__ import annotations

import argparse
import platform
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from specgen import native
from specgen.native import ops

DIM, FFN, QKV, VOCAB, LAYERS = 576, 1536, 960, 49152, 30
SHAPES = {"wqkv": (QKV, DIM), "wo": (DIM, DIM), "w13": (2 * FFN, DIM), "w2": (DIM, FFN)}  # name -> (out, in)
ROWS = (1, 2, 4, 5, 8)
BF16 = torch.bfloat16


def int4_kernel(out: int, k: int, group: int, gen: torch.Generator):
    q = torch.randint(0, 16, (out, k), dtype=torch.int32, generator=gen)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    sz = (torch.rand(k // group, out, 2, generator=gen) * 0.01).to(BF16)
    nbytes = out * k // 2 + sz.numel() * 2
    return (lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, sz)), nbytes


def int8_kernel(out: int, k: int, gen: torch.Generator):
    q = torch.randint(-127, 128, (out, k), dtype=torch.int8, generator=gen)
    s = (torch.rand(out, generator=gen) * 0.01).to(BF16)
    return (lambda x: torch.ops.aten._weight_int8pack_mm(x, q, s)), out * k + out * 2


def fbgemm_pack(q: torch.Tensor, scales: torch.Tensor):
    """fbgemm's packed int8 weight of q int8 [out, in] with one scale per output row."""
    zeros = torch.zeros(q.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensors are deprecated as a user type; the packed op is what runs
        warnings.simplefilter("ignore")
        qw = torch._make_per_channel_quantized_tensor(q, scales.float(), zeros, 0)
        return torch.ops.quantized.linear_prepack(qw, None)


def random_pack(out: int, k: int, gen: torch.Generator):
    q = torch.randint(-127, 128, (out, k), dtype=torch.int8, generator=gen)
    return fbgemm_pack(q, torch.rand(out, generator=gen) * 0.01)


def dyn_rows_kernel(out: int, k: int, gen: torch.Generator):
    packed = random_pack(out, k, gen)

    def run(x: torch.Tensor) -> torch.Tensor:  # one call per row: each row's activation scale is its own
        x32 = x.float()
        ys = [torch.ops.quantized.linear_dynamic(x32[i : i + 1], packed, True) for i in range(x32.shape[0])]
        return (ys[0] if len(ys) == 1 else torch.cat(ys)).to(BF16)

    return run, out * k + out * 8


def dyn_fixed_product(packed, k: int):
    """x [M, k] bf16 -> [M, out] bf16 through fbgemm's int8-activation product, all rows in one call."""
    pin = torch.zeros(1, k)
    pin[0, 0], pin[0, 1] = 1.0, -1.0

    def run(x: torch.Tensor) -> torch.Tensor:  # the range is [-1, 1] whatever the rows are
        x32 = x.float()
        a = x32.abs().amax(1, keepdim=True).clamp(min=1e-30)  # [M, 1]
        y = torch.ops.quantized.linear_dynamic(torch.cat([x32 / a, pin]), packed, True)[:-1]  # 7-bit: no overflow
        return (y * a).to(BF16)

    return run


def dyn_fixed_kernel(out: int, k: int, gen: torch.Generator):
    return dyn_fixed_product(random_pack(out, k, gen), k), out * k + out * 8


def fp16_kernel(out: int, k: int, gen: torch.Generator):
    packed = torch.ops.quantized.linear_prepack_fp16(torch.randn(out, k, generator=gen) * 0.02, None)
    return (lambda x: torch.ops.quantized.linear_dynamic_fp16(x.float(), packed).to(BF16)), out * k * 2


def f32_kernel(out: int, k: int, gen: torch.Generator):
    w = torch.randn(out, k, generator=gen).t().contiguous().t()  # column-major, as the decode layout stores it
    return (lambda x: F.linear(x.float(), w).to(BF16)), out * k * 4


def qmm_kernel(out: int, k: int, group: int, gen: torch.Generator, product=ops.qmm):
    """qmm.c over random codes: int4 in groups of `group` (0: int8, one scale per output); `product` as ops.qmm (another
    build's: `build_of`)."""
    if group:
        codes = torch.randint(0, 16, (out, k), dtype=torch.uint8, generator=gen)
        scales, zeros = (torch.rand(out, k // group, generator=gen) * 0.01 for _ in range(2))
    else:
        codes = torch.randint(-127, 128, (out, k), dtype=torch.int8, generator=gen)
        scales, zeros = torch.rand(out, generator=gen) * 0.01, None
    packed, sz = ops.pack_codes(codes, scales, zeros)
    bits, g = (4, group) if group else (8, k)
    return (lambda x: product(x, packed, sz, bits, g, out, 1)), packed.numel() + sz.numel() * 2


def build_of(path: str):
    """ops.qmm over another build of qmm.c, e.g. the previous commit's (a worktree's run leaves it in the same cache
    folder as this one's: ~/.cache/specgen/native/qmm-<hash>.so)."""
    lib = native.bind(Path(path), "qmm")

    def product(x, packed, sz, bits, group, out, threads):
        y = x.new_empty(x.shape[0], out)
        lib.specgen_qmm(x.data_ptr(), x.element_size(), packed.data_ptr(), sz.data_ptr(), bits, group, y.data_ptr(),
                        x.shape[0], x.shape[1], out, threads)
        return y
    return product


KERNELS = {
    "int4 g32": lambda o, k, g: int4_kernel(o, k, 32, g),
    "int4 g64": lambda o, k, g: int4_kernel(o, k, 64, g),
    "int8 x bf16": int8_kernel,
    "int8 dyn rows": dyn_rows_kernel,
    "int8 dyn fixed": dyn_fixed_kernel,
    "fp16 fbgemm": fp16_kernel,
    "f32 F.linear": f32_kernel,
    "qmm int4 g32": lambda o, k, g: qmm_kernel(o, k, 32, g),
    "qmm int8": lambda o, k, g: qmm_kernel(o, k, 0, g),
}


def build(name: str, gen: torch.Generator) -> list[tuple[str, object, int]]:
    """(shape name, product, bytes) for every product of one forward, in order."""
    make = KERNELS[name]
    pass_ = [(s, *make(*SHAPES[s], gen)) for _ in range(LAYERS) for s in SHAPES]
    return pass_ + [("head", *make(VOCAB, DIM, gen))]


@torch.inference_mode()
def time_pass(products: list, x: dict[int, torch.Tensor]) -> dict[str, float]:
    """Seconds per shape name of one pass."""
    spent: dict[str, float] = {}
    for shape, fn, _ in products:
        xi = x[shape]
        t = time.perf_counter()
        fn(xi)
        spent[shape] = spent.get(shape, 0.0) + time.perf_counter() - t
    return spent


@torch.inference_mode()
def row_invariant(products: list, gen: torch.Generator) -> bool:
    """Each row of an 8-row product bitwise equal to that row alone, for one product of every shape."""
    firsts = {shape: fn for shape, fn, _ in reversed(products)}
    for shape, fn in firsts.items():
        k = SHAPES.get(shape, (VOCAB, DIM))[1]
        x = (torch.randn(8, k, generator=gen) * torch.logspace(-2, 1, 8)[:, None]).to(BF16)
        whole = fn(x)
        if not all(torch.equal(whole[i : i + 1], fn(x[i : i + 1].clone())) for i in range(8)):
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated names")
    ap.add_argument("--against", help="another build of qmm.c (.so): its int4 and int8 rows too, for a paired A/B")
    args = ap.parse_args()
    if args.against:
        other = build_of(args.against)
        KERNELS["qmm int4 g32 (other)"] = lambda o, k, g: qmm_kernel(o, k, 32, g, other)
        KERNELS["qmm int8 (other)"] = lambda o, k, g: qmm_kernel(o, k, 0, g, other)
        args.kernels += ",qmm int4 g32 (other),qmm int8 (other)"
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    names = args.kernels.split(",")
    built = {n: build(n, gen) for n in names}
    order = list(SHAPES) + ["head"]
    nbytes = {n: {s: sum(b for sh, _, b in built[n] if sh == s) for s in order} for n in names}
    best = {(n, m): {s: float("inf") for s in order} for n in names for m in ROWS}
    xs = {m: {s: torch.randn(m, SHAPES.get(s, (VOCAB, DIM))[1], generator=gen).to(BF16) for s in order} for m in ROWS}
    for n in names:  # warm-up: first calls allocate
        time_pass(built[n], xs[1])
    for _ in range(args.rounds):
        for m in ROWS:
            for n in names:
                for s, sec in time_pass(built[n], xs[m]).items():
                    best[(n, m)][s] = min(best[(n, m)][s], sec)
    print(f"# torch {torch.__version__}, {platform.machine()}, CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, 1 thread, best of {args.rounds} interleaved rounds")
    print("# ms per pass (summed over the 30 blocks' products of that shape; head once) and GB/s streamed")
    for m in ROWS:
        print(f"\n## {m} row(s)\n| kernel | " + " | ".join(order) + " | layers | all |")
        print("|---|" + "---:|" * (len(order) + 2))
        for n in names:
            b = best[(n, m)]
            cells = [f"{b[s] * 1e3:.2f} ({nbytes[n][s] / b[s] / 1e9:.1f})" for s in order]
            layers = sum(b[s] for s in SHAPES)
            print(f"| {n} | " + " | ".join(cells) + f" | {layers * 1e3:.2f} | {(layers + b['head']) * 1e3:.2f} |")
    print("\nrow-invariant (each row of 8 bitwise equal to the row alone): "
          + ", ".join(f"{n}: {row_invariant(built[n], gen)}" for n in names))


if __name__ == "__main__":
    main()
