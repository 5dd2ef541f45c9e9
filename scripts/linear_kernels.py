"""Which CPU kernel runs SmolLM2-135M's linear layers fastest at 1-16 rows: float32, bfloat16, int8, int4 weights.

One question: the cost of one pass over every linear weight of a SmolLM2-135M-shaped decoder (30 blocks of
wqkv 576->960, wo 576->576, w1/w3 576->1536, w2 1536->576, plus the 576->49152 LM head), i.e. the weight traffic of
one forward, per kernel and row count, at one thread. Weights are random with the real shapes (the kernels' speed
does not depend on the values). Kernels, each interleaved per round, best of `--rounds`:

    f32 F.linear          MKL over the column-major float32 weight (specgen's decode layout)
    f32 oneDNN packed     torch.ops.mkldnn._linear_pointwise over the packed float32 copy (packed_linear.py)
    f32 native tiled      specgen/native/tiled.c over the tiled float32 copy (when a C compiler built it)
    bf16 F.linear         bfloat16 weights and activations
    bf16 oneDNN packed    the packed bfloat16 copy
    int8 x bf16           torch.ops.aten._weight_int8pack_mm, int8 per-channel weights, bfloat16 activations
    int8 x f32            the same op with float32 activations and scales
    int4 g32/g64          torch.ops.aten._weight_int4pack_mm_for_cpu, group-wise int4 weights, bfloat16 activations

Run: `python scripts/linear_kernels.py > docs/logs/linear-kernels.log` (add `--rounds 5` on a quiet machine; prefill
sizes: `--rows 1,4,16,64,256,512 --only f32`).
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
import torch.nn.functional as F

from specgen.devices import onednn_packs
from specgen import native
from specgen.native import ops

DIM, FFN, QKV, VOCAB, LAYERS = 576, 1536, 960, 49152, 30
ROWS = (1, 2, 4, 8, 16, 32)


def shapes(layers: int) -> list[tuple[int, int]]:
    """(out, in) of every linear weight of the decoder, the LM head last."""
    block = [(QKV, DIM), (DIM, DIM), (FFN, DIM), (FFN, DIM), (DIM, FFN)]
    return block * layers + [(VOCAB, DIM)]


def int4_weight(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed weight, scales-and-zeros [in/group, out, 2] bf16) for _weight_int4pack_mm_for_cpu."""
    out, k = w.shape
    wg = w.view(out, k // group, group)
    lo, hi = wg.amin(-1, keepdim=True), wg.amax(-1, keepdim=True)
    scale = (hi - lo).clamp(min=1e-6) / 15
    q = torch.round((wg - lo) / scale).clamp(0, 15).to(torch.int32).view(out, k)
    zero = lo + 8 * scale
    sz = torch.stack([scale.view(out, -1), zero.view(out, -1)], -1).transpose(0, 1).contiguous().bfloat16()
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1), sz


def kernels(layers: int) -> dict[str, list]:
    """kernel name -> list of callables f(x_by_dtype) (one per weight)."""
    gen = torch.Generator().manual_seed(0)
    ws = [torch.randn(o, i, generator=gen) / i**0.5 for o, i in shapes(layers)]
    names = ("f32 F.linear", "f32 oneDNN packed", "f32 native tiled", "bf16 F.linear", "bf16 oneDNN packed",
             "int8 x bf16", "int8 x f32", "int4 g32", "int4 g64")
    out: dict[str, list] = {k: [] for k in names if (k != "f32 native tiled" or native.library("tiled") is not None)
                            and (k != "bf16 oneDNN packed" or onednn_packs(torch.bfloat16))}  # not on AVX2 alone
    for w in ws:
        col = w.t().contiguous().t()
        b = col.bfloat16()
        pf = torch.ops.mkldnn._reorder_linear_weight(col, 16)
        s = w.abs().amax(1) / 127
        q = torch.round(w / s[:, None]).clamp(-127, 127).to(torch.int8)
        sb = s.bfloat16()
        out["f32 F.linear"].append(lambda x, w=col: F.linear(x["f32"][w.shape[1]], w))
        out["f32 oneDNN packed"].append(
            lambda x, p=pf, k=w.shape[1]: torch.ops.mkldnn._linear_pointwise(x["f32"][k], p, None, "none", [], ""))
        if "f32 native tiled" in out:
            out["f32 native tiled"].append(lambda x, t=ops.tile(w, None)[0], o=w.shape[0], k=w.shape[1]:
                                           ops.tiled_linear(x["f32"][k], t, None, o, torch.get_num_threads()))
        out["bf16 F.linear"].append(lambda x, w=b: F.linear(x["bf16"][w.shape[1]], w))
        if "bf16 oneDNN packed" in out:
            out["bf16 oneDNN packed"].append(lambda x, p=torch.ops.mkldnn._reorder_linear_weight(b, 16), k=w.shape[1]:
                                             torch.ops.mkldnn._linear_pointwise(x["bf16"][k], p, None, "none", [], ""))
        out["int8 x bf16"].append(lambda x, q=q, s=sb: torch.ops.aten._weight_int8pack_mm(x["bf16"][q.shape[1]], q, s))
        out["int8 x f32"].append(lambda x, q=q, s=s: torch.ops.aten._weight_int8pack_mm(x["f32"][q.shape[1]], q, s))
        for g in (32, 64):  # 576 is not a multiple of 128
            p4, sz = int4_weight(w, g)
            out[f"int4 g{g}"].append(
                lambda x, p=p4, sz=sz, g=g, k=w.shape[1]: torch.ops.aten._weight_int4pack_mm_for_cpu(
                    x["bf16"][k], p, g, sz))
    return out


def one_pass(fs: list, x: dict) -> float:
    t = time.perf_counter()
    for f in fs:
        f(x)
    return (time.perf_counter() - t) * 1e3


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts, comma-separated")
    ap.add_argument("--only", default="", help="the kernels whose names start with this (e.g. f32)")
    args = ap.parse_args()
    rows = tuple(int(r) for r in args.rows.split(","))
    torch.set_num_threads(args.threads)
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, {args.threads} thread(s), "
          f"{args.layers} blocks + LM head, best of {args.rounds} rounds; ms per pass over all linear weights")
    ks = {k: fs for k, fs in kernels(args.layers).items() if k.startswith(args.only)}
    dtypes = (("f32", torch.float32), ("bf16", torch.bfloat16))
    xs = {r: {d: {k: torch.randn(r, k).to(t) for k in (DIM, FFN)} for d, t in dtypes}
          for r in rows}  # contiguous [r, in] inputs per input width
    best = {(k, r): float("inf") for k in ks for r in rows}
    for k, fs in ks.items():  # warm-up (first touch, oneDNN primitive creation)
        for r in rows:
            one_pass(fs, xs[r])
    for _ in range(args.rounds):
        for r in rows:
            for k, fs in ks.items():
                best[(k, r)] = min(best[(k, r)], one_pass(fs, xs[r]))
    print("| kernel | " + " | ".join(f"{r} row{'s' if r > 1 else ''}" for r in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for k in ks:
        print(f"| {k} | " + " | ".join(f"{best[(k, r)]:.1f}" for r in rows) + " |")
    head = {k: fs[-1] for k, fs in ks.items()}  # the LM head alone (a fifth of the weights)
    print("\n# LM head 576 -> 49152 alone, ms")
    for k, f in head.items():
        print(f"| {k} | " + " | ".join(f"{min(one_pass([f], xs[r]) for _ in range(args.rounds)):.2f}" for r in rows)
              + " |")


if __name__ == "__main__":
    main()
