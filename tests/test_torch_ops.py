"""The native kernels as torch ops: `torch.library.opcheck` on each (schema, fake tensors, aot dispatch), and the
profiler names them."""

from __future__ import annotations

import pytest
import torch

from specgen.native import ops
from tests.conftest import needs_native


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def attention_inputs(dtype):
    """q [B, H, S, D] and cache keys and values [B, Hkv, T, D] over a tree-like mask, with its plan."""
    b, h, hkv, s, t, d = 2, 4, 2, 3, 20, 16
    seen = torch.rand(b, s, t, generator=torch.Generator().manual_seed(1)) < 0.5
    seen[..., :5] = True
    idx, count, shared = torch.ops.specgen.attention_plan(seen)
    q, k, v = randn(b, h, s, d, dtype=dtype), randn(b, hkv, t, d, dtype=dtype, seed=2), randn(b, hkv, t, d, dtype=dtype)
    return seen, (q, k, v, idx, count, shared, torch.empty(b, s, h, d, dtype=dtype))


def cases(dtype):
    x, w = randn(3, 5, 64, dtype=dtype), randn(64, dtype=dtype, seed=1)
    seen, attend = attention_inputs(dtype)
    q, k, v, idx, count, shared, out = attend
    b, h, s, d = q.shape
    qkv = randn(b, s, (h + 2 * k.shape[1]) * d, dtype=dtype, seed=3)
    cos, sin = randn(b, 1, s, d, dtype=dtype, seed=4), randn(b, 1, s, d, dtype=dtype, seed=5)
    slots = (torch.tensor([[14], [15]], dtype=torch.int32) + torch.arange(s, dtype=torch.int32)).contiguous()
    rope = (qkv, cos, sin, True, k.clone(), v.clone(), slots, torch.empty(b, h, s, d, dtype=dtype), idx, count,
            shared, out.clone())
    got = {"rms_norm": (x, w, 1e-5), "add_rms_norm": (x, randn(3, 5, 64, dtype=dtype, seed=6), w, 1e-5),
           "attention_plan": (seen,), "attend": attend, "rope_write_attend": rope,
           "rope": (qkv.view(b, s, -1, d).transpose(1, 2), cos, sin, True),
           "rope_store": (qkv.view(b, s, -1, d).transpose(1, 2), cos, sin, k.clone(), v.clone(),
                          torch.tensor([[14, 15], [0, 1]]), h, True),  # lengths; cache rows
           "silu_mul": (x, randn(3, 5, 64, dtype=dtype, seed=12)),
           # an embedding [V, D], tokens [R, S], features [R, S, D] (a broadcast row: stride 0)
           "embed_cat": (randn(10, 64, dtype=dtype, seed=18), torch.tensor([[3, 9, 0], [1, 1, 2]]),
                         randn(2, 1, 64, dtype=dtype, seed=19).expand(2, 3, 64)),
           # logits [2 n, S, V] in (cond, uncond) pairs, the guidance scale
           "guided": (randn(4, 3, 40, dtype=dtype, seed=25), 4.0),
           # a step's committed lengths [R], tree rows [R, S, S], T
           "step_plan": (torch.tensor([3, 0]), torch.eye(4, dtype=torch.bool).expand(2, 4, 4).contiguous(), 12),
           # logits [n * br, S, V] (CFG pairs), path scores [n, S], branches, scale, k; a record's values and
           # tokens [n, N] written from column 2
           "top_children": (randn(4, 3, 40, dtype=dtype, seed=14), randn(2, 3, seed=15), 2, 4.0, 5,
                            torch.zeros(2, 20), torch.zeros(2, 20, dtype=torch.long), 2),
           # a record's path scores, tokens, padding, parents [n, N]; the level's features [n br, W, D]; the
           # drafter's embedding [V, D] (the next level's input joined); the level's lists [n br, W, T], the next
           # level's own slots [n br, nxt, 1] and tail [n br, 1, T]; its first column, width, the beam's, branches
           "beam": (randn(2, 36, seed=16), torch.arange(72).view(2, 36), randn(2, 36, seed=17) > 0.5,
                    torch.zeros(2, 36, dtype=torch.long), randn(4, 4, 8, dtype=dtype, seed=20),
                    randn(72, 8, dtype=dtype, seed=21), torch.arange(192, dtype=torch.int32).view(4, 4, 12),
                    torch.arange(12, dtype=torch.int32).view(4, 3, 1), torch.arange(12).expand(4, 1, 12) >= 5,
                    10, 4, 3, 2),
           # ints [6, n] (root positions, top-k, depths, counts, prefixes, roots), write rows, a RoPE table [P, 2,
           # hd], levels, the record's nodes, width, br, T
           "growth_setup": (torch.tensor([[3, 4], [2, 3], [3, 0], [6, 0], [4, 5], [7, 8]]), torch.arange(4),
                            randn(20, 2, 8, dtype=dtype, seed=24), 2, 36, 4, 2, 16),
           # scores (ties), padding, tokens, parents, counts, roots, root positions, the node budget, the levels
           "kept_tree": (randn(2, 6, seed=13).round(), torch.tensor([[0, 0, 0, 0, 0, 1], [0] * 6]).bool(),
                         torch.arange(12).view(2, 6), torch.tensor([[-1, -1, 0, 0, 1, 2], [-1, 0, 0, 1, 1, 2]]),
                         torch.tensor([4, 6]), torch.tensor([1, 2]), torch.tensor([3, 4]), 5, 3)}
    codes = torch.randint(0, 16, (40, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(9))
    packed, sz = ops.pack_codes(codes, randn(40, 2, seed=10), randn(40, 2, seed=11))
    got["qmm"] = (x, packed, sz, 4, 32, 40, 1)
    # a cache's keys and values [L, B, Hkv, T, D] and a commit's moves [3, N] (row, source slot, destination slot)
    got["commit_slots"] = (randn(2, 3, 2, 10, 16, dtype=dtype, seed=20), randn(2, 3, 2, 10, 16, dtype=dtype, seed=21),
                           torch.tensor([[0, 0, 2], [5, 7, 4], [3, 4, 3]]))
    if dtype == torch.float32:
        tiles, bias = ops.tile(randn(40, 64, seed=7), randn(40, seed=8))
        got["tiled_linear"] = (x, tiles, bias, 40, 1)
    return got


CUDA_ONLY = ("rope", "rope_store", "silu_mul", "embed_cat", "guided", "step_plan", "top_children", "beam", "kept_tree",
             "growth_setup", "commit_slots")  # torch's ops elsewhere (one_pass)
OPS = ("rms_norm", "add_rms_norm", "tiled_linear", "attention_plan", "attend", "rope_write_attend", "qmm", *CUDA_ONLY)
CUDA_OPS = ("rms_norm", "add_rms_norm", "attention_plan", "attend", *CUDA_ONLY)  # Triton on CUDA (native/cuda_ops.py)


def test_every_registered_op_is_checked():
    registered = {name.split("::")[1] for name in torch._C._dispatch_get_all_op_names() if name.startswith("specgen::")}
    assert registered == set(OPS)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", OPS)
def test_opcheck(name, dtype):
    args = cases(dtype).get(name)
    if args is None:
        pytest.skip(f"{name} takes float32 only")
    if name in CUDA_ONLY:
        pytest.skip(f"{name} is CUDA only (torch's ops elsewhere): test_opcheck_on_cuda")
    torch.library.opcheck(getattr(torch.ops.specgen, name).default, args)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", CUDA_OPS)
def test_opcheck_on_cuda(name, dtype):
    args = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in cases(dtype)[name])
    torch.library.opcheck(getattr(torch.ops.specgen, name).default, args)


@needs_native
def test_the_profiler_names_the_ops():
    x, w = randn(2, 64), randn(64, seed=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, torch.inference_mode():
        torch.ops.specgen.rms_norm(x, w, 1e-5)
    assert "specgen::rms_norm" in {e.key for e in prof.key_averages()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_cuda_only_ops_through_tritons_interpreter(dtype):
    """The CUDA-only ops' schemas (rope_store's declared writes to the cache) and fake kernels, checked here: their
    Triton implementations registered for CPU tensors for the test's length (tests/conftest.py interprets Triton)."""
    pytest.importorskip("triton")
    from specgen.native import cuda_ops

    if torch.cuda.is_available():
        pytest.skip("compiled Triton here: test_opcheck_on_cuda")
    lib = torch.library.Library("specgen", "IMPL")  # noqa: TOR901
    try:
        for name in CUDA_ONLY:
            lib.impl(name, getattr(cuda_ops, name), "CPU")
            torch.library.opcheck(getattr(torch.ops.specgen, name).default, cases(dtype)[name])
    finally:
        lib._destroy()
