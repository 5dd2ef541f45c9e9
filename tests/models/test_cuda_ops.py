"""The native ops on CUDA (native/cuda_ops.py): the list attention's plan in device ops equals attention.c's, and its
Triton kernel gives a query the same bits at every width, batch and query count, and a tree node its AR step's bits;
the norms and RoPE give torch's values and bits; all five inside a model's steps keep verifies equal to AR steps; a
tree growth's tail (`kept_tree`) gives the torch path's bits. On the CPU the kernels run in Triton's interpreter (the
order of every sum, not the GPU's instructions) and compile for sm_80/sm_90; the same tests run compiled on a GPU
under the `gpu` marker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specgen import native
from specgen.machine import kernel_paths
from specgen.models import kernel_choice, rope
from specgen.models.kernel_choice import attention_path
from specgen.models.sliced_linear import SlicedLinear
from specgen.native import cuda_ops

pytest.importorskip("triton")  # a test extra on Linux x86-64 (pyproject.toml); torch's CUDA builds bring their own
import triton  # noqa: E402 - after the importorskip above
import triton.language as tl  # noqa: E402

KERNELS = cuda_ops.kernels()  # Triton's jit resolves a global name, not a closure's


@triton.jit
def tanh_rows(X, Y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + i, KERNELS.tanh(tl.load(X + i, mask=i < n)), mask=i < n)


def tanh_of(x: torch.Tensor) -> torch.Tensor:
    """The list kernel's `tanh` (its score cap's) over float32 x, element by element."""
    y = torch.empty_like(x)
    tanh_rows[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


def lists(seen: torch.Tensor):
    return cuda_ops.attention_plan(seen)


def attend(q, k, v, seen) -> torch.Tensor:
    """The kernel's [B, S, H, D] over seen [B, S, T] (True = visible)."""
    b, h, s, d = q.shape
    out = torch.empty(b, s, h, d, dtype=q.dtype, device=q.device)
    idx, count, shared = lists(seen)
    cuda_ops.attend(q, k, v, idx, count, shared, out)
    return out


def case(device, b=2, h=6, hkv=2, s=5, t=150, d=32, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, m, d, generator=g).to(device, dtype) for n, m in ((h, s), (hkv, t), (hkv, t)))
    lengths = torch.tensor([100, 120][:b])
    seen = torch.arange(t)[None, None, :] < (lengths[:, None, None] + torch.arange(1, s + 1)[None, :, None])
    return q, k, v, seen.to(device)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("h,hkv,d", [(6, 2, 32), (9, 3, 64), (4, 4, 48)])  # GQA groups 3 (SmolLM2) and 1; D padded
def test_the_kernel_computes_softmax_attention(device, dtype, tol, h, hkv, d):
    q, k, v, seen = case(device, h=h, hkv=hkv, d=d, dtype=dtype)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=seen[:, None], enable_gqa=True)
    assert torch.allclose(attend(q, k, v, seen).float(), want.transpose(1, 2), atol=tol, rtol=tol)


def test_a_query_gets_the_same_bits_at_every_width_batch_and_query_count(device):
    q, k, v, seen = case(device, dtype=torch.bfloat16)
    out = attend(q, k, v, seen)
    # wider: 70 more slots nobody sees, holding NaN (never read: a read would poison the row)
    pad = torch.full((*k.shape[:2], 70, k.shape[3]), float("nan"), dtype=k.dtype, device=device)
    wide = attend(q, torch.cat([k, pad], 2), torch.cat([v, pad], 2), F.pad(seen, (0, 70)))
    assert torch.equal(wide, out)
    # one query alone (an AR step), in the second batch row
    alone = attend(q[1:, :, 3:4], k[1:], v[1:], seen[1:, 3:4])
    assert torch.equal(alone[0, 0], out[1, 3])


def test_a_query_that_sees_nothing_gets_zeros(device):
    q, k, v, seen = case(device)
    seen[1, 2] = False
    out = attend(q, k, v, seen)
    assert torch.equal(out[1, 2], torch.zeros_like(out[1, 2])) and out.isfinite().all()


def test_a_tree_node_gets_its_ar_steps_bits(device):
    """Node 4 of a tree whose ancestors sit at scattered slots (siblings between them) against the same keys at
    consecutive slots, as AR's cache holds them after the path is accepted."""
    q, k, v, _ = case(device, b=1, s=1, t=140, dtype=torch.bfloat16)
    prefix, ancestors = 100, [101, 104, 107, 110]  # the node itself at 110
    tree = torch.zeros(1, 1, 140, dtype=torch.bool, device=device)
    tree[..., :prefix] = True
    tree[..., ancestors] = True
    k_ar, v_ar = k.clone(), v.clone()
    for j, slot in enumerate(ancestors):  # what a commit moves: the path's keys to prefix + j
        k_ar[:, :, prefix + j], v_ar[:, :, prefix + j] = k[:, :, slot], v[:, :, slot]
    chain = torch.arange(140, device=device)[None, None] < prefix + len(ancestors)
    assert torch.equal(attend(q, k, v, tree), attend(q, k_ar, v_ar, chain))


def test_the_bit_checks_can_fail(device, monkeypatch):
    """Control: the same query with another key grouping (tiles of 32 keys, not 64) gets other bits, so equal bits
    above are a property of the fixed order, not of a comparison that cannot tell."""
    q, k, v, seen = case(device, b=1, s=1, t=300, seed=1)
    seen = torch.ones_like(seen)
    out = attend(q, k, v, seen)
    monkeypatch.setattr(cuda_ops, "BLOCK_N", 32)
    assert not torch.equal(attend(q, k, v, seen), out)


def test_the_device_plan_equals_the_c_plan():
    """What `attend` reads: each query's visible slots ascending, how many, and the leading run all queries see."""
    if native.library("attention") is None:
        pytest.skip("no C compiler: attention.c is not built here")
    g = torch.Generator().manual_seed(0)
    drafter_level = (torch.arange(300) < torch.tensor([50, 170])[:, None])[:, None].expand(2, 6, 300)  # stride 0
    masks = [torch.rand(3, 7, 90, generator=g) < 0.6, case("cpu")[3], torch.rand(1, 64, 257, generator=g) < 0.1]
    for seen in masks:
        seen[..., 0] = True  # every query sees at least slot 0 (itself, in a decode)
    for seen in masks + [drafter_level]:
        got = lists(seen)  # idx (visible slots ascending, then hidden ones), count, shared
        assert all(torch.equal(a, b) for a, b in zip(got, torch.ops.specgen.attention_plan(seen.contiguous())))


def test_a_steps_plan_is_the_plan_of_its_visibility_without_the_mask(device):
    """`step_plan` from a step's tree rows and committed lengths: the lists `attention_plan` makes of the step's mask
    (static_step.visibility), idx, count and shared bit for bit, at lengths 0, mid-tile and near T; the control (another
    row's length) differs."""
    from specgen.models import static_step

    g = torch.Generator().manual_seed(3)
    r, s, t = 3, 5, 300
    tree = (torch.rand(r, s, s, generator=g) < 0.5) | torch.eye(s, dtype=torch.bool)
    x = static_step.StaticInputs(torch.zeros(r, s, dtype=torch.long), torch.zeros(r, s, dtype=torch.long),
                                 torch.tensor([[0, 130, 295], [0, 1, 2]]), tree=tree)
    want = lists(static_step.visibility(x, t)[:, 0].to(device))
    got = cuda_ops.step_plan(x.meta[0].to(device), tree.to(device), t)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    other = cuda_ops.step_plan(torch.tensor([0, 131, 295], device=device), tree.to(device), t)
    assert not all(torch.equal(a, b) for a, b in zip(other, want))


def test_cuda_forwards_take_the_lists_when_triton_is_there_and_env_says_which(monkeypatch):
    with torch.inference_mode():
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            assert attention_path(dtype, "cuda") == "native"
        assert "one Triton kernel a layer" in kernel_paths("cuda")["step_kernels"]["path"]
        assert "64-row GEMM slices" in kernel_paths("cuda")["text float32"]["path"]
        monkeypatch.setattr(cuda_ops, "available", lambda: False)  # a CUDA build without Triton: the torch paths
        assert attention_path(torch.bfloat16, "cuda") == "chunked"
        assert attention_path(torch.float32, "cuda") == "sdpa"
        assert kernel_paths("cuda")["step_kernels"]["why"] == "Triton is not installed"
    assert torch._C._dispatch_has_kernel_for_dispatch_key("specgen::attend", "CUDA")
    assert torch._C._dispatch_has_kernel_for_dispatch_key("specgen::attention_plan", "CUDA")


def test_the_kernels_in_a_models_steps_score_chains_and_trees_as_ar_steps(device, monkeypatch):
    """The kernels (attention, its device plan, the norms, RoPE) as a bf16 model's static steps call them (the ops'
    CUDA implementations): a 16-node chain's and a tree path's nodes get the bits of the AR steps."""
    from specgen.models import graphs
    from tests.conftest import tiny_model
    from tests.models.test_graphs import PROMPT, chain_against_steps, tree_against_steps

    if device == "cpu":  # route the ops' CPU calls to the CUDA implementations
        for name in ("attend", "attention_plan", "step_plan", "rms_norm", "add_rms_norm", "rope", "rope_store",
                     "silu_mul"):
            monkeypatch.setattr(torch.ops.specgen, name, getattr(cuda_ops, name))
        monkeypatch.setattr(native, "library", lambda name: "triton" if name in ("attention", "glue") else None)
        monkeypatch.setattr(kernel_choice, "one_pass", lambda x: not torch.is_grad_enabled())
    model = tiny_model(0).to(device, torch.bfloat16)
    for lin in model.modules():  # products of one row count, as a loaded model's on a GPU (models/sliced_linear.py)
        if type(lin) is torch.nn.Linear:
            lin.__class__ = SlicedLinear
    steps = graphs.attach(model, "on", capture=False if device == "cpu" else None)
    if device == "cpu":  # the interpreter runs a program at a time: no 64-row slice filling (test_graphs tests it)
        steps.fill = 1
    for ar, verified in (chain_against_steps(model, PROMPT), tree_against_steps(model, PROMPT)):
        assert torch.equal(ar, verified)


COMPILE = """
import itertools
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specgen.native import cuda_ops

PART, PARTS, BUILDS = int(sys.argv[1]), int(sys.argv[2]), itertools.count()

def build(fn, sig, consts, arch):
    if next(BUILDS) % PARTS != PART:  # another process's build
        return
    kernel = triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", arch, 32),
                            options={"num_warps": cuda_ops.WARPS})
    assert kernel.asm["cubin"], (fn, sig, arch)


fn = cuda_ops.kernels().attend_lists
for dtype, group, d, cap, archs in (("bf16", 3, 64, False, (80, 90)), ("fp32", 1, 48, False, (90,)),
                                    ("fp16", 7, 128, False, (90,)), ("bf16", 2, 256, True, (80, 90))):  # Gemma 2's
    consts = cuda_ops.tiles(group, d) | {"CAP": cap}
    sig = {n: "constexpr" if n in consts else "*" + dtype if n in ("Q", "K", "V", "OUT") else "*i32"
           if n in ("IDX", "COUNT") else "fp32" if n in ("scale", "cap") else "i32" for n in fn.arg_names}
    for arch in archs:
        build(fn, sig, consts, arch)
fn = cuda_ops.kernels().norm_rows
for dtype, add, dim in (("bf16", True, 576), ("fp32", False, 96)):
    consts = {"ADD": add, "BLOCK": cuda_ops.pow2(dim)}
    sig = {n: "constexpr" if n in consts else "i32" if n == "dim" else "fp32" if n == "eps" else "*" + dtype
           for n in fn.arg_names}
    build(fn, sig, consts, 90)
fn = cuda_ops.kernels().rope_rows
for dtype, half, store in (("bf16", True, True), ("bf16", True, False), ("fp32", False, True)):
    consts = {"D": 64, "BLOCK_D": 64, "HALF": half, "STORE": store}
    sig = {n: "constexpr" if n in consts else "*i64" if n == "META" else "*" + dtype if n.isupper() else "i32"
           for n in fn.arg_names}
    build(fn, sig, consts, 90)
fn = cuda_ops.kernels().plan_rows
for tree in (False, True):  # a mask's plan; a step's from its tree rows and lengths
    consts = {"BLOCK": cuda_ops.PLAN_BLOCK, "TREE": tree}
    sig = {n: "constexpr" if n in consts else "*u8" if n == "SEEN" else "*i64" if n == "LENGTHS" else "*i32"
           if n.isupper() else "i32" for n in fn.arg_names}
    for arch in (80, 90):
        build(fn, sig, consts, arch)
fn = cuda_ops.kernels().kept_tree_rows
consts = {"SB": 128, "CHUNK": cuda_ops.TREE_CHUNK, "ROWS": cuda_ops.TREE_ROWS}  # node budgets 63 to 126
sig = {n: "constexpr" if n in consts else "*fp32" if n == "SCORES" else "*u8" if n in ("PAD", "MASK") else "*i64"
       if n.isupper() else "i32" for n in fn.arg_names}
for arch in (80, 90):
    build(fn, sig, consts, arch)
fn = cuda_ops.kernels().silu_mul_rows
for dtype in ("bf16", "fp32"):
    consts = {"BLOCK": cuda_ops.GATE_BLOCK}
    build(fn, {n: "constexpr" if n in consts else "i32" if n == "n" else "*" + dtype for n in fn.arg_names}, consts, 90)
fn = cuda_ops.kernels().top_children
for dtype, cfg, scored, archs in (("bf16", True, True, (80, 90)), ("fp32", False, False, (90,))):
    consts = {"K": 10, "BLOCK_K": 16, "CFG": cfg, "SCORED": scored, "BLOCK": cuda_ops.CHILD_BLOCK}
    sig = {n: "constexpr" if n in consts else "*" + dtype if n == "LOGITS" else "*i64" if n == "INDEX" else "*fp32"
           if n.isupper() else "fp32" if n == "scale" else "i32" for n in fn.arg_names}
    for arch in archs:
        build(fn, sig, consts, arch)
fn = cuda_ops.kernels().beam_rows
for join, archs in ((False, (90,)), (True, (80, 90))):  # an eager growth's beam; a captured one's
    consts = {"W": 16, "NXT": 16, "BRANCHES": 2, "BLOCK": 256, "BLOCK_NXT": 16, "D": 768, "BLOCK_D": 128, "JOIN": join,
              "LISTED": join, "BLOCK_T": cuda_ops.PLAN_BLOCK}
    sig = {n: "constexpr" if n in consts else "*fp32" if n in ("SCORES", "SCORE") else "*u8" if n in ("PAD", "TAIL")
           else "*bf16" if n in ("HID", "FHID", "EMB") else "*i32" if n in ("PREV", "OWN", "LISTS") else "*i64"
           if n.isupper() else "i32" for n in fn.arg_names}
    for arch in archs:
        build(fn, sig, consts, arch)
fn = cuda_ops.kernels().setup_rows
consts = {"W": 16, "BRANCHES": 2, "BLOCK_W": 16, "BLOCK": cuda_ops.PLAN_BLOCK, "ROW": 128, "BLOCK_ROW": 128}
sig = {n: "constexpr" if n in consts else "*i32" if n in ("OWN", "COUNT", "SHARED", "FIRST") else "*u8"
       if n in ("PADDING", "TAIL") else "*bf16" if n in ("TABLE", "ROT") else "*i64" if n.isupper() else "i32"
       for n in fn.arg_names}
for arch in (80, 90):
    build(fn, sig, consts, arch)
fn = cuda_ops.kernels().guided_rows
for dtype, archs in (("bf16", (80, 90)), ("fp32", (90,))):
    sig = {n: "constexpr" if n == "BLOCK" else "fp32" if n == "scale" else "*" + dtype if n.isupper() else "i32"
           for n in fn.arg_names}
    for arch in archs:
        build(fn, sig, {"BLOCK": cuda_ops.GUIDE_BLOCK}, arch)
fn = cuda_ops.kernels().embed_rows
for dtype in ("bf16", "fp32"):
    consts = {"BLOCK": 512}
    sig = {n: "constexpr" if n in consts else "*i64" if n == "TOKENS" else "*" + dtype if n.isupper() else "i32"
           for n in fn.arg_names}
    build(fn, sig, consts, 90)
fn = cuda_ops.kernels().commit_rows  # a commit's moves, k and v of every layer
for dtype, d, archs in (("bf16", 64, (80, 90)), ("fp32", 48, (90,))):
    consts = {"D": d, "BLOCK": cuda_ops.COMMIT_BLOCK, "BLOCK_D": cuda_ops.pow2(d)}
    sig = {n: "constexpr" if n in consts else "*i64" if n == "MOVES" else "*" + dtype if n.isupper() else "i32"
           for n in fn.arg_names}
    for arch in archs:
        build(fn, sig, consts, arch)
"""


def test_the_kernels_compile_for_ampere_and_hopper(tmp_path):
    """What the interpreter does not check (tile shapes tl.dot takes, loop-carried types): Triton's own compiler builds
    the kernel down to sm_80 and sm_90 machine code here, with no GPU (the ptxas Triton ships)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": str(tmp_path)}
    parts = 2  # every other build in each of two processes at once: the default suite's machine has two cores
    procs = [subprocess.Popen([sys.executable, "-c", COMPILE, str(part), str(parts)], env=env, text=True,
                              stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=Path(__file__).parents[2])
             for part in range(parts)]
    errors = [p.communicate()[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * parts, "".join(errors)[-2000:]


VARIANTS = """
import torch
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import make_backend
from triton.runtime.jit import create_function_from_signature
from specgen.native import cuda_ops

backend, keys = make_backend(GPUTarget("cuda", 90, 32)), {}

class Launch:  # records the key under which Triton would look up (or compile) the launch's kernel
    def __init__(self, fn):
        self.fn = fn
    def __getitem__(self, grid):
        bind = create_function_from_signature(self.fn.signature, self.fn.params, backend)
        return lambda *a, **kw: keys.setdefault(self.fn.__name__, set()).add(str(bind(*a, **kw)[1:]))

real = cuda_ops.kernels()
cuda_ops.kernels = lambda: type("K", (), {n: Launch(getattr(real, n)) for n in
                                          ("attend_lists", "norm_rows", "rope_rows", "silu_mul_rows",
                                           "plan_rows", "top_children", "beam_rows",
                                           "kept_tree_rows", "setup_rows", "embed_rows", "guided_rows")})
bf, h, hkv, d = torch.bfloat16, 9, 3, 64
for b, s, t in ((1, 1, 256), (2, 1, 256), (3, 5, 512), (16, 64, 1024)):  # rows, nodes, width: a decode's steps
    qkv = torch.zeros(b, s, h + 2 * hkv, d, dtype=bf).transpose(1, 2)
    cos, cache = torch.zeros(b, 1, s, d, dtype=bf), torch.zeros(b + 1, hkv, 2048, d, dtype=bf)
    q = cuda_ops.rope_store(qkv, cos, cos, cache, cache, torch.zeros(2, b, dtype=torch.long), h, True)
    cuda_ops.rope(qkv[:, : h + hkv], cos, cos, True)
    idx, count, shared = cuda_ops.attention_plan(torch.ones(b, s, t, dtype=torch.bool))
    cuda_ops.step_plan(torch.zeros(b, dtype=torch.long), torch.ones(b, s, s, dtype=torch.bool), t)
    cuda_ops.attend(q, cache[:b, :, :t], cache[:b, :, :t], idx, count, shared, torch.empty(b, s, h, d, dtype=bf))
    x, w = torch.zeros(b, s, 576, dtype=bf), torch.ones(576, dtype=bf)
    cuda_ops.rms_norm(x, w, 1e-5), cuda_ops.add_rms_norm(x, x, w, 1e-5), cuda_ops.silu_mul(x, x)
    logits = torch.zeros(2 * b, s, 16384, dtype=bf)  # a growth's levels: the root's children, then scored ones
    nodes = 8 + 64 * (2 + s % 4)  # a growth's record [b, N], written from each level's column
    values, tokens = torch.zeros(b, nodes), torch.zeros(b, nodes, dtype=torch.long)
    cuda_ops.top_children(logits, None, 2, 4.0, 8, values, tokens, 0)
    cuda_ops.guided(logits, 4.0)
    cuda_ops.top_children(logits, torch.zeros(b, s), 2, 4.0, 8, values, tokens, 8 + 64 * (s % 4))
    cuda_ops.beam(values, tokens, torch.zeros(b, nodes, dtype=torch.bool), tokens, torch.zeros(2 * b, 8, 64, dtype=bf),
                  torch.zeros(32, 64, dtype=bf), torch.zeros(2 * b, 8, t, dtype=torch.int32),
                  torch.zeros(2 * b, 8, 1, dtype=torch.int32), torch.zeros(2 * b, 1, t, dtype=torch.bool),
                  8 + 64 * (s % 4), 8, 8, 2)
    cuda_ops.growth_setup(torch.zeros(6, b, dtype=torch.long), torch.arange(2 * b), torch.zeros(300, 2, 64, dtype=bf),
                          1 + s % 4, nodes, 8, 2, t)
    cuda_ops.embed_cat(torch.zeros(32, 576, dtype=bf), torch.zeros(2 * b, s, dtype=torch.long), x.repeat(2, 1, 1))
    nodes, ints = 80 + 16 * s, torch.zeros(6, b, dtype=torch.long)  # a growth's nodes; its rows' ints (views)
    cuda_ops.kept_tree(torch.zeros(b, nodes), torch.zeros(b, nodes, dtype=torch.bool), torch.zeros(b, nodes,
                       dtype=torch.long), torch.zeros(b, nodes, dtype=torch.long), ints[3], ints[5], ints[0], 64, s % 7)
counts = {n: len(k) for n, k in keys.items()}
assert counts == {"attend_lists": 1, "norm_rows": 2, "rope_rows": 2, "silu_mul_rows": 1, "plan_rows": 2,
                  "top_children": 2, "beam_rows": 1, "kept_tree_rows": 1, "setup_rows": 1, "embed_rows": 1,
                  "guided_rows": 1}, (counts, keys)
keys.clear()  # a commit's moves: caches of any rows (a pool's view of them), any number of moves
cuda_ops.kernels = lambda: type("K", (), {"commit_rows": Launch(real.commit_rows)})
for rows, start, n in ((1, 0, 1), (2, 0, 7), (6, 2, 40), (32, 3, 300)):
    k = torch.zeros(24, 33, hkv, 2048, d, dtype=bf)[:, start : start + rows]
    moves = torch.stack([torch.arange(n) % rows, torch.arange(n) + 9, torch.arange(n) + 8])
    cuda_ops.commit_slots(k, k.clone(), moves)
assert {n: len(k) for n, k in keys.items()} == {"commit_rows": 1}, keys
"""


def test_a_decodes_changing_sizes_reuse_each_kernels_compiled_variant():
    """Triton compiles a kernel per specialization key (an int argument's value 1 or divisibility by 16, a pointer's
    alignment, the constexprs): steps of other rows, nodes and widths must share one key per kernel (the norm's
    residual add, RoPE's cache store, a mask's or a step's plan and a growth's unscored root children: two; a product
    with a norm inside, with and without its add: three, the gate two), or a decode recompiles as it goes and a
    capture meets a first compile."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", VARIANTS], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]


PAST_2_31 = """
import sys
import torch
from triton.runtime import interpreter
from specgen.native import cuda_ops

def big(n):  # pages never touched stay unmapped: n bfloat16 elements of address space, a few pages of memory
    try:
        return torch.empty(n, dtype=torch.bfloat16)
    except RuntimeError:  # no 4 GiB of address space to reserve here (strict overcommit)
        sys.exit(3)

g = torch.Generator().manual_seed(0)
# RoPE: a batch stride of 2^30 elements, so that batch row 2 starts at element 2^31 (three programs)
buf = big(2**31 + 64)
x = buf.as_strided((3, 1, 1, 64), (2**30, 64, 64, 1))
x.copy_(torch.randn(3, 1, 1, 64, generator=g))
cos, sin = (torch.randn(3, 1, 1, 64, generator=g).to(torch.bfloat16) for _ in range(2))
assert torch.equal(cuda_ops.rope(x, cos, sin, True), cuda_ops.rope(x.clone(), cos, sin, True)), "rope"
del x, buf
# the norm and the gate: the program past 2^31 elements alone (the interpreter would run the millions before it)
builder = interpreter.interpreter_builder
def program(first):
    builder.set_grid_idx = lambda x, y, z: setattr(builder, "grid_idx", (x + first, y, z))
w = torch.randn(576, generator=g).to(torch.bfloat16)
row = 2**31 // 576 + 1  # its first element past 2^31
buf = big((row + 1) * 576)
buf[row * 576:] = torch.randn(576, generator=g)
(want,) = cuda_ops.add_rms_norm(buf[row * 576:].clone()[None], None, w, 1e-5)
program(row)
cuda_ops.kernels().norm_rows[(1,)](buf, buf, w, buf, buf, 576, 1e-5, ADD=False, BLOCK=1024)  # in place
assert torch.equal(buf[row * 576:], want[0]), "norm"
del buf
buf = big(2**31 + cuda_ops.GATE_BLOCK)
buf[2**31:] = torch.randn(cuda_ops.GATE_BLOCK, generator=g) * 4
builder.set_grid_idx = type(builder).set_grid_idx.__get__(builder)
want = cuda_ops.silu_mul(buf[2**31:], buf[2**31:])
program(2**31 // cuda_ops.GATE_BLOCK)
cuda_ops.kernels().silu_mul_rows[(1,)](buf, buf, buf, buf.numel(), BLOCK=cuda_ops.GATE_BLOCK)  # in place
assert torch.equal(buf[2**31:], want), "gate"
"""


def test_the_elementwise_kernels_address_tensors_past_2_31_elements():
    """A prefill's gate input [B, P, F] passes 2^31 elements from ~113K tokens of a 7B model (F 18944), its RoPE and
    norm inputs from ~470K and ~600K: offsets computed in int32 (program_id's type) wrap there, and the GPU faults. The
    interpreter wraps int32 as the GPU does; each kernel's program past element 2^31 runs here over 4 GiB tensors
    whose other pages are never touched (a subprocess: a wrapped offset is a wild address)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreter's check (a GPU would need the 4 GiB tensors in its memory)")
    done = subprocess.run([sys.executable, "-c", PAST_2_31], capture_output=True, text=True,
                          cwd=Path(__file__).parents[2])
    if done.returncode == 3:
        pytest.skip("this machine does not reserve 4 GiB of untouched address space")
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_cuda_build_without_triton_warns_once_and_takes_the_torch_paths(monkeypatch):
    monkeypatch.setattr(cuda_ops.importlib.util, "find_spec", lambda name: None)
    cuda_ops.available.cache_clear()
    try:
        with pytest.warns(UserWarning, match="Triton is not installed") as seen, torch.inference_mode():
            assert attention_path(torch.bfloat16, "cuda") == "chunked"
            assert attention_path(torch.float32, "cuda") == "sdpa"
        assert len(seen) == 1
    finally:
        cuda_ops.available.cache_clear()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1.6e-2)])  # bf16: 2 ulp
def test_the_norms_compute_transformers_formula_a_row_at_a_time(device, dtype, tol):
    from specgen.models.transformer import rms_norm

    g = torch.Generator().manual_seed(0)
    x, a = (torch.randn(2, 7, 576, generator=g).to(device, dtype) for _ in range(2))
    w = (1 + torch.randn(576, generator=g) / 4).to(device, dtype)
    (alone,) = cuda_ops.add_rms_norm(x[1, 3:4], None, w, 1e-5)
    out = cuda_ops.rms_norm(x, w, 1e-5)
    assert torch.equal(alone[0], out[1, 3])  # a row's bits whatever rows share the call
    torch.testing.assert_close(out, rms_norm(x, w, 1e-5), atol=tol, rtol=tol)
    total, normed = cuda_ops.add_rms_norm(x, a, w, 1e-5)
    assert torch.equal(total, x + a) and torch.equal(normed, cuda_ops.rms_norm(x + a, w, 1e-5))


def test_specgen_native_0_turns_the_cuda_kernels_off_too(monkeypatch):
    monkeypatch.setenv("SPECGEN_NATIVE", "0")
    cuda_ops.available.cache_clear()
    try:
        with torch.inference_mode():
            assert attention_path(torch.bfloat16, "cuda") == "chunked"
    finally:
        cuda_ops.available.cache_clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_the_rope_kernel_gives_rotates_bits(device, dtype, layout):
    """One pass for rope.rotate's roll, two products and sum: the same rounded values, bit for bit."""
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 5, 12, 64, generator=g).to(device, dtype)  # [B, S, H, D], read as [B, H, S, D] (a view)
    table = rope.table_1d(64, 64, 10000.0)[torch.randint(0, 64, (2, 5), generator=g)]  # [B, S, D/2, 2]
    r = rope.rotation(table.to(device, dtype), layout)
    x = qkv.transpose(1, 2)
    with torch.no_grad():
        want = x * r.cos + (x.roll(32, -1) if layout == "half" else x.unflatten(-1, (32, 2)).flip(-1).flatten(-2)) * r.sin
    assert torch.equal(cuda_ops.rope(x, r.cos, r.sin, layout == "half"), want)
    shared = rope.rotation(table[:1].to(device, dtype), layout)  # one table row for the whole batch (broadcast)
    with torch.no_grad():
        want = x * shared.cos + (x.roll(32, -1) if layout == "half" else
                                 x.unflatten(-1, (32, 2)).flip(-1).flatten(-2)) * shared.sin
    assert torch.equal(cuda_ops.rope(x, shared.cos, shared.sin, layout == "half"), want)
    level = rope.rotation(table[:, :1].to(device, dtype), layout)  # one row a sequence, its nodes' (a drafter level)
    with torch.no_grad():
        want = x * level.cos + (x.roll(32, -1) if layout == "half" else
                                x.unflatten(-1, (32, 2)).flip(-1).flatten(-2)) * level.sin
    assert torch.equal(cuda_ops.rope(x, level.cos, level.sin, layout == "half"), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_store_rotates_as_rope_and_writes_each_rows_keys_and_values_at_its_slots(device, dtype):
    """A captured step's RoPE and cache writes in one pass (static_step.StaticCache): q gets `rope`'s bits, the cache
    its rotated keys and plain values at row meta[1, b], slots meta[0, b] + s, and no other slot changes (a padding row
    writes into the scratch row)."""
    g = torch.Generator().manual_seed(1)
    b, h, hkv, s, t, d = 3, 6, 2, 4, 32, 64
    qkv = torch.randn(b, s, h + 2 * hkv, d, generator=g).to(device, dtype).transpose(1, 2)  # a view, as the step's
    table = rope.table_1d(64, d, 10000.0)[torch.randint(0, 64, (b, s), generator=g)]
    r = rope.rotation(table.to(device, dtype), "half")
    k, v = (torch.randn(b + 1, hkv, t, d, generator=g).to(device, dtype) for _ in range(2))  # [C + 1, Hkv, T, D]
    meta = torch.tensor([[5, 9, 0], [1, 0, b]], device=device)  # lengths; cache rows (the last: the scratch row)
    want_k, want_v = k.clone(), v.clone()
    q = cuda_ops.rope_store(qkv, r.cos, r.sin, k, v, meta, h, True)
    rotated = cuda_ops.rope(qkv[:, : h + hkv], r.cos, r.sin, True)  # [B, H + Hkv, S, D]
    for i, (length, row) in enumerate(meta.T.tolist()):
        want_k[row, :, length : length + s] = rotated[i, h:]
        want_v[row, :, length : length + s] = qkv[i, h + hkv :]
    assert torch.equal(q, rotated[:, :h]) and torch.equal(k, want_k) and torch.equal(v, want_v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_gate_kernel_computes_torchs_silu_times_b_an_element_at_a_time(device, dtype):
    """SwiGLU's gate in one pass: torch's silu(a) * b (float32 within an ulp or two: the GPU's fast exp), and an
    element's bits whatever else the call holds (a row alone gets the row's bits of the whole)."""
    g = torch.Generator().manual_seed(2)
    a, b = ((torch.randn(4, 3, 1500, generator=g) * 4).to(device, dtype) for _ in range(2))
    got = cuda_ops.silu_mul(a, b)
    torch.testing.assert_close(got, F.silu(a) * b)
    assert torch.equal(cuda_ops.silu_mul(a[2:3, 1:2], b[2:3, 1:2]), got[2:3, 1:2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_guidance_kernel_has_torchs_bits(device, dtype, monkeypatch):
    """CFG's combine in one pass (`guided`): image/target.guided's three torch ops bit for bit (each step rounded as
    torch rounds it, no fused multiply-add), for 3 pairs of rows of 2,500 logits (past one block); the control: the
    pairs' rows the other way round."""
    from specgen.image import target

    g = torch.Generator().manual_seed(4)
    logits = (torch.randn(6, 3, 2500, generator=g) * 4).to(device, dtype)
    monkeypatch.setattr(kernel_choice, "one_pass", lambda x: False)  # torch's ops on any device
    for scale in (4.0, 1.7):
        got = cuda_ops.guided(logits, scale)
        assert got.shape == (3, 3, 2500) and got.dtype == dtype and torch.equal(got, target.guided(logits, scale))
        swapped = logits.view(3, 2, 3, 2500).flip(1).reshape(6, 3, 2500)
        assert not torch.equal(got, target.guided(swapped, scale))


def grown(device, k, depth, totals, width, vocab, seed, kernel, feed=True):
    """`grow`'s outputs for rows of top-k k[i], depth[i] (0: no tree) and node budget totals[i], each level `width`
    wide (a captured plan's), over a random drafter whose log-probs tie (multiples of 1/4, zeros among them) and are
    -inf at half the vocabulary; through the kernel (`kept_tree`) or eagle_grow's torch functions, and the
    kernel's inputs (None on the torch path)."""
    from specgen.methods import eagle_grow

    n, dim = len(k), 8
    g = torch.Generator().manual_seed(seed)
    root_pos, roots = torch.randint(0, 50, (n,), generator=g), torch.randint(0, vocab, (n,), generator=g)
    counts = eagle_grow.kept_counts(k, depth, totals)
    ints = torch.stack([root_pos, torch.tensor(k), torch.tensor(depth), torch.tensor(counts), root_pos, roots])
    ints = ints.to(device)
    plan = eagle_grow.GrowPlan((width,) * max(depth), max(totals), feed)
    frame = eagle_grow.Frame.make(ints[1], eagle_grow.level_positions(ints[0], ints[2], plan.levels)[0], plan.widths)

    def forward(feats, toks, parent, i, lists):
        return torch.randn(feats.shape[0], toks.shape[1], dim, generator=g).to(device)

    def children(hidden, scores, k, record, at):
        lp = -torch.randint(0, 6, (*hidden.shape[:2], vocab), generator=g) / 4
        top = lp.masked_fill(torch.rand(lp.shape, generator=g) < 0.5, float("-inf")).to(device).topk(k, dim=-1)
        values = (top.values if scores is None else scores[..., None] + top.values).flatten(1)
        record.scores[:, at : at + values.shape[1]], record.tokens[:, at : at + values.shape[1]] = \
            values, top.indices.flatten(1)
        return values.view(top.indices.shape), top.indices

    def torch_beam(scores, tokens, padding, parents, hidden, _embedding, _prev, _own, _tail, *level):  # the beam as
        # torch ranks ties (the growth has no `Join`)
        score, parent, toks = eagle_grow.best_children(eagle_grow.Frame(padding, parents, scores, tokens), *level)
        return score, parent, toks, eagle_grow.frontier_rows(hidden, parent, level[-1]), None

    seen = []

    def op(*args):
        seen.append(args)
        return cuda_ops.kept_tree(*args)

    root_hidden = torch.randn(n, 1, dim, generator=g).to(device)
    with torch.inference_mode(), pytest.MonkeyPatch.context() as m:
        m.setattr(kernel_choice, "one_pass", lambda x: kernel)
        m.setattr(torch.ops.specgen, "kept_tree", op)
        m.setattr(torch.ops.specgen, "beam", torch_beam)
        return eagle_grow.grow(forward, children, root_hidden, ints, plan, 1, frame), (seen or [None])[0]


TREES = [  # k, depth, totals, width, vocab: rows without a tree, shallower than the plan, budgets above their nodes
    ([3, 5, 0, 2], [3, 2, 0, 4], [10, 16, 4, 6], 5, 9),
    ([4, 4, 1], [2, 3, 2], [30, 8, 3], 5, 8),
    ([16, 11], [6, 5], [64, 40], 16, 24),  # N = 16 + 5 x 16^2 = 1,296 nodes, t = 64
]


@pytest.mark.parametrize("case", range(len(TREES)))
def test_the_tree_kernel_gives_the_torch_paths_bits(device, case):
    """One launch for a growth's tail (the kept nodes in slot order and the verify's inputs): every output bitwise
    the torch path's, over trees grown as `grow` grows them (ties, -inf scores, padding, counts below the budget,
    rows with no tree)."""
    want, _ = grown(device, *TREES[case], seed=case, kernel=False)
    got, args = grown(device, *TREES[case], seed=case, kernel=True)
    assert args is not None and len(got) == len(want) == 5
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want))
    if case == 0:  # VVS reads the trees only
        vvs = grown(device, *TREES[0], seed=0, kernel=True, feed=False)[0]
        assert all(torch.equal(a, b) for a, b in zip(vvs, want[:2]))


def test_the_tree_comparison_can_fail():
    """Control: the cases hold what the bitwise equality above rests on, and a plausible slip shows: ties at the
    budget's cut (breaking them against slot order keeps other nodes), kept -inf scores (ranked as padding, other
    nodes are kept) and trees deeper than one pointer jump (fewer rounds miss ancestors)."""
    from specgen.decoding.verify import tree_inputs
    from specgen.methods.eagle_grow import best_nodes, in_slot_order

    want, _ = grown("cpu", *TREES[1], seed=1, kernel=False)
    with pytest.MonkeyPatch.context() as m:  # the kernel's inputs, recorded without running it
        m.setattr(cuda_ops, "kept_tree", lambda *args: args)
        _, args = grown("cpu", *TREES[1], seed=1, kernel=True)
    scores, padding, tokens, parents, counts, roots, root_pos, total, levels = args

    def reference(scores, padding, levels):
        kept = in_slot_order(best_nodes(scores, padding, total), tokens, parents, counts)
        return kept + tree_inputs(*kept, counts, roots, root_pos, levels)

    assert all(torch.equal(a, b) for a, b in zip(reference(scores, padding, levels), want))
    slot = torch.arange(scores.shape[1])
    tie_flipped = reference(scores + 1e-6 * slot, padding, levels)  # equal scores: the later slot first
    inf_as_padding = reference(scores, padding | scores.isinf(), levels)
    one_round = reference(scores, padding, 1)
    assert not torch.equal(tie_flipped[0], want[0]) and not torch.equal(inf_as_padding[0], want[0])
    assert torch.equal(one_round[0], want[0]) and not torch.equal(one_round[4], want[4])


def test_the_tree_kernel_orders_nan_and_signed_zero_as_torchs_sort(device):
    """Scores off a drafter's range: -0.0 ties with 0.0 (slot order), NaN ranks after padding (torch's sort), and a
    count above the budget keeps t nodes."""
    from specgen.decoding.verify import tree_inputs
    from specgen.methods.eagle_grow import best_nodes, in_slot_order

    nan, inf = float("nan"), float("inf")
    scores = torch.tensor([[0.0, -0.0, nan, -1.0, 0.0, -0.0, -2.0], [-0.0, 0.0, -1.0, nan, -0.5, -inf, -0.0]])
    padding = torch.tensor([[False, False, False, False, True, False, False], [False] * 6 + [True]])
    tokens, parents = torch.arange(14).view(2, 7) + 10, torch.tensor([[-1, -1, 0, 1, 1, 0, 3], [-1, 0, 0, 1, 2, 2, 3]])
    counts, roots, root_pos = torch.tensor([9, 6]), torch.tensor([1, 2]), torch.tensor([5, 9])
    kept = in_slot_order(best_nodes(scores, padding, 6), tokens, parents, counts)
    want = kept + tree_inputs(*kept, counts, roots, root_pos, 3)
    got = cuda_ops.kept_tree(*(x.to(device) for x in (scores, padding, tokens, parents, counts, roots, root_pos)), 6, 3)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(got, want))


def commit_case(device, dtype, seed):
    """A cache k, v [L, R, Hkv, T, D] of random values on `device`, rows 1..6 of a buffer of 8 (a pool's view), and a
    commit of 3 sequences x 2 branch rows: random ascending keeps (a slot both a source and a destination), one a
    chain (nothing moves), one of 40 of 50 nodes (its moves span blocks of the kernel), the rows' lengths; and its
    result through torch's indexing (CPU)."""
    from specgen.models.cache import KVCache

    g = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(3, 8, 2, 128, 48, generator=g).to(dtype) for _ in range(2))
    lengths = [20, 20, 7, 7, 31, 31]
    keep = sorted(torch.randperm(12, generator=g)[:5].tolist())
    keeps = {0: [1, 2, 3] if seed == 0 else keep, 1: [0, 1], 2: sorted(torch.randperm(50, generator=g)[:40].tolist())}
    want = KVCache(k.clone(), v.clone(), [0] * 8).rows(1, 7)
    want.lengths = list(lengths)
    with pytest.MonkeyPatch.context() as m:  # torch's gather, then write (the fixture sends every commit to the kernel)
        m.setattr(kernel_choice, "one_pass", lambda x: False)
        want.commit_seqs(keeps, 2)
    got = KVCache(k.to(device), v.to(device), [0] * 8).rows(1, 7)
    got.lengths = list(lengths)
    return got, keeps, want


@pytest.fixture
def commit_kernel(device, monkeypatch):
    """KVCache.commit_seqs through `commit_slots` on `device` (on the CPU: its Triton code in the interpreter,
    registered for CPU tensors for the test)."""
    monkeypatch.setattr(kernel_choice, "one_pass", lambda x: True)  # only the commit asks in these tests
    if device == "cpu":
        lib = torch.library.Library("specgen", "IMPL")  # noqa: TOR901
        lib.impl("commit_slots", cuda_ops.commit_slots, "CPU")
        yield
        lib._destroy()
    else:
        yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_commit_moves_every_layers_keys_and_values_as_torchs_indexing_in_one_launch(device, commit_kernel, dtype,
                                                                                      seed):
    """The kept nodes' keys and values of every layer, kv head and branch row, bitwise where torch's gather-then-write
    puts them, the other slots untouched; one launch (`commit_slots`) and the lengths as the torch path's."""
    cache, keeps, want = commit_case(device, dtype, seed)
    calls = []
    real = torch.ops.specgen.commit_slots
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch.ops.specgen, "commit_slots", lambda *args: calls.append(args) or real(*args))
        cache.commit_seqs(keeps, 2)
    assert len(calls) == 1 and calls[0][2].shape == (3, 2 * (5 if seed else 3) + 2 * 40)  # the chain moves nothing
    assert torch.equal(cache.k.cpu(), want.k) and torch.equal(cache.v.cpu(), want.v) and cache.lengths == want.lengths
    whole = cache.k._base  # the buffer's other rows: untouched
    assert torch.equal(whole[:, [0, 7]].cpu(), want.k._base[:, [0, 7]])


def test_the_commit_comparison_can_fail(device, commit_kernel, monkeypatch):
    """Control: the same moves in reverse order, a move at a time, store a slot before a later move reads it (keep
    [1, 2, 3]: slots n + 1, n + 2 are sources and destinations), which the bitwise check above sees."""
    cache, keeps, want = commit_case(device, torch.float32, 0)
    real = torch.ops.specgen.commit_slots
    monkeypatch.setattr(cuda_ops, "COMMIT_BLOCK", 1)
    monkeypatch.setattr(torch.ops.specgen, "commit_slots", lambda k, v, moves: real(k, v, moves.flip(1)))
    cache.commit_seqs(keeps, 2)
    assert cache.lengths == want.lengths and not torch.equal(cache.k.cpu(), want.k)


def test_the_caps_tanh_is_within_a_few_ulps_everywhere(device):
    """Softcapped scores (Gemma 2) take tanh from one exp, and near 0 its series, where 1 - exp(-2|x|) cancels: within
    8 float32 ulps of tanh over [-20, 20] and down to 1e-8 (the cancelling form alone: hundreds of ulps near 0)."""
    x = torch.cat([torch.linspace(-20, 20, 40001), torch.logspace(-8, 1, 4001), -torch.logspace(-8, 1, 4001)])
    want = torch.tanh(x.double())
    ulp = (torch.nextafter(want.float().abs(), torch.tensor(float("inf"))) - want.float().abs()).double()
    assert ((tanh_of(x.to(device)).cpu().double() - want).abs() / ulp).max() < 8
    e = torch.exp(-2 * x.abs())
    assert ((((1 - e) / (1 + e)).copysign(x).double() - want).abs() / ulp).max() > 100  # the control
