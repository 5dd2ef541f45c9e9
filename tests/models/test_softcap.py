"""Softcapped attention (Gemma 2: a scaled score s becomes cap tanh(s / cap) before the mask) on every path that
decodes: transformers' values, and the invariants of the uncapped paths kept (a query's bits independent of the
forward's width; a tree node gets its AR step's bits); the CPU routes a capped model around attention.c."""

from __future__ import annotations

import pytest
import torch

from specgen.models.attention import (AttentionPlan, NativePlan, capped_attention, invariant_attention, native_plan,
                                      plan)
from specgen.models.kernel_choice import attention_path
from specgen.native import cuda_ops
from tests.models.test_attention import case, two_branch_tree

CAP = 2.0  # small enough that the case's scores (|s| up to ~4) are capped visibly


def reference(q, k, v, vis, cap):
    """transformers' Gemma 2 eager attention in float64: scores * scale, / cap, tanh, * cap, + mask, softmax, @ v."""
    g = q.shape[1] // k.shape[1]
    k, v = (x.double().repeat_interleave(g, 1) for x in (k, v))
    s = q.double() @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if cap:
        s = torch.tanh(s / cap) * cap
    return (s.masked_fill(~vis, float("-inf")).softmax(-1) @ v).float()  # [B, H, S, D]


def chunked(q, k, v, vis, cap):
    b, h, s, d = q.shape
    p = plan(vis, b, s, k.shape[2], h, k.shape[1], d, "cpu", q.dtype, softcap=cap)
    return invariant_attention(q, k, v, p)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_capped_model_attends_chunked_on_a_cpu(dtype):
    """attention.c has no cap (the C kernels stay frozen): a capped plan on a CPU is the chunked one (its plan carries
    the cap), in grad mode the path it would take without one; the C op refuses a cap it cannot apply."""
    with torch.inference_mode():
        assert attention_path(dtype, "cpu", CAP) == "chunked"
        assert isinstance(plan(None, 1, 1, 5, 4, 2, 16, "cpu", dtype, softcap=CAP), AttentionPlan)
        assert plan(None, 1, 1, 5, 4, 2, 16, "cpu", dtype, softcap=CAP).softcap == CAP
    assert attention_path(dtype, "cpu", CAP) == attention_path(dtype, "cpu")  # grad mode: training's path
    with pytest.raises(ValueError, match="no score softcap"):  # never planned there; refused if it were
        torch.ops.specgen.attend(torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 3, 8), torch.zeros(1, 1, 3, 8),
                                 torch.zeros(1, 1, 3, dtype=torch.int32), torch.ones(1, 1, dtype=torch.int32),
                                 torch.ones(1, dtype=torch.int32), torch.zeros(1, 1, 2, 8), CAP)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_every_path_caps_scores_as_transformers(dtype, tol):
    """The chunked plan (AR steps and chains; trees: bitwise theirs, below) and the dense form in SDPA's place
    (prompts, training; a mask or causal) give transformers' capped attention; the control (no cap) is visibly off, so
    the comparison can fail."""
    q, k, v, vis = case(dtype=dtype)
    want = reference(q, k, v, vis, CAP)
    with torch.inference_mode():
        got = {"chunked": chunked(q, k, v, vis, CAP), "uncapped": chunked(q, k, v, vis, 0.0)}
    got["dense"] = capped_attention(q, k, v, vis, False, CAP)
    got["causal"] = capped_attention(q[..., :1, :], k[:, :, :281], v[:, :, :281], None, True, CAP)
    assert (got["uncapped"].float() - want).abs().max() > 0.05
    for name in ("chunked", "dense"):
        assert (got[name].float() - want).abs().max() < tol, name
    assert (got["causal"].float() - want[:, :, :1]).abs().max() < tol


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_capped_query_gets_the_same_bits_at_every_width_and_a_tree_node_its_ar_steps(dtype):
    """The invariants the lossless methods stand on, with the cap: one query alone (an AR step) gets its bits in a
    wide forward; a side-branch node of a tree gets bitwise its AR step over the path's keys."""
    q, k, v, vis = case(1, s=12, t=150, dtype=dtype)
    with torch.inference_mode():
        full = chunked(q, k, v, vis, CAP)
        for i in (0, 5, 11):
            one = chunked(q[:, :, i : i + 1], k[:, :, : 139 + i], v[:, :, : 139 + i], None, CAP)
            assert torch.equal(one, full[:, :, i : i + 1]), i
        prefix, s = 140, 10
        g = torch.Generator().manual_seed(2)
        q, k, v = (torch.randn(1, n, m, 64, generator=g).to(dtype) * 2 for n, m in ((9, s), (3, prefix + s),
                                                                                   (3, prefix + s)))
        mask = two_branch_tree(prefix)
        out = chunked(q, k, v, mask, CAP)
        for i in range(5, s):
            keys = list(range(prefix)) + [prefix + j for j in range(s) if mask[0, 0, i, prefix + j]]
            ar = chunked(q[:, :, i : i + 1], k[:, :, keys], v[:, :, keys], None, CAP)
            assert torch.equal(ar[:, :, 0], out[:, :, i]), i


def lists_attend(q, k, v, seen, cap):
    """CUDA's list kernel (Triton's interpreter on a CPU) with a cap: [B, S, H, D]."""
    b, h, s, d = q.shape
    out = torch.empty(b, s, h, d, dtype=q.dtype, device=q.device)
    idx, count, shared = cuda_ops.attention_plan(seen)
    cuda_ops.attend(q, k, v, idx, count, shared, out, cap)
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_the_list_kernel_caps_scores_as_transformers_and_keeps_a_querys_bits(device, dtype, tol):
    pytest.importorskip("triton")
    q, k, v, vis = case(b=2, s=5, t=150, dtype=dtype)
    q, k, v, seen = (x.to(device) for x in (q, k, v, vis[:, 0]))
    want = reference(q.cpu(), k.cpu(), v.cpu(), vis, CAP).transpose(1, 2)
    got = lists_attend(q, k, v, seen, CAP)
    assert (got.float().cpu() - want).abs().max() < tol
    assert (lists_attend(q, k, v, seen, 0.0).float().cpu() - want).abs().max() > 0.05  # the control
    alone = lists_attend(q[1:, :, 3:4], k[1:], v[1:], seen[1:, 3:4], CAP)  # an AR step: the same bits
    assert torch.equal(alone[0, 0], got[1, 3])
    assert isinstance(native_plan(None, 1, 1, 5, 4, 16, softcap=CAP), NativePlan)


def test_the_final_cap_is_applied_to_every_forwards_logits():
    """`Transformer.logits` (every caller of the LM head asks it): cap tanh(z / cap) of the head's logits, in the
    eager forward and a captured step's function alike."""
    from specgen.models.static_step import Bucket, StaticInputs, target_step
    from tests.conftest import tiny_model

    capped, plain = tiny_model(0, logit_softcap=1.5), tiny_model(0)
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    positions = torch.arange(5)[None]
    with torch.inference_mode():
        z = plain(tokens, positions)[0]
        assert z.abs().max() > 3  # the cap matters here
        torch.testing.assert_close(capped(tokens, positions)[0], torch.tanh(z / 1.5) * 1.5)
        x = StaticInputs.for_bucket(Bucket(1, 5, 8), "cpu")
        x.tokens.copy_(tokens)
        x.positions.copy_(positions)
        x.tree.copy_(x.causal)
        cache = capped.new_cache(2, 8)
        k, v = (torch.stack([layer[i] for layer in cache.layers]) for i in (0, 1))
        torch.testing.assert_close(target_step(capped, x, k, v, None)[0], torch.tanh(z / 1.5) * 1.5)
