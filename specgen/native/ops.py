"""torch wrappers of glue.c's row kernels (bfloat16 on a CPU, inference only) and the rule for when they run."""

from __future__ import annotations

import torch

from specgen.native import glue


def usable(x: torch.Tensor, weight: torch.Tensor | None = None) -> bool:
    """Whether an op on `x` (and `weight`) runs natively: bfloat16 on a CPU where glue.c was built, with no gradient
    to track (the kernels have no backward). Every decode forward of a model gives the same answer."""
    if x.dtype != torch.bfloat16 or x.device.type != "cpu" or glue() is None:
        return False
    if weight is not None and weight.dtype != torch.bfloat16:
        return False
    return not (torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)))


def check(status: int) -> None:
    if status != 0:
        raise MemoryError("a native row kernel could not get its scratch memory")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * bfloat16(RMSNorm_float32(x)) over the last dim, as transformer.RMSNorm: [..., dim] bfloat16."""
    x = x.contiguous()
    out = torch.empty_like(x)
    dim = x.shape[-1]
    check(glue().specgen_rms_norm_bf16(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // dim, dim, eps))
    return out


def add_rms_norm(x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + a, RMSNorm(x + a)): a residual add and the pre-norm after it, in one pass ([..., dim] bfloat16 each)."""
    if a.dtype != torch.bfloat16:  # the kernel reads raw bfloat16 (x and weight were checked by `usable`)
        raise TypeError(f"add_rms_norm takes bfloat16, got {a.dtype}")
    x, a = x.contiguous(), a.contiguous()
    total, out = torch.empty_like(x), torch.empty_like(x)
    dim = x.shape[-1]
    check(glue().specgen_add_rms_norm_bf16(x.data_ptr(), a.data_ptr(), weight.data_ptr(), total.data_ptr(),
                                           out.data_ptr(), x.numel() // dim, dim, eps))
    return total, out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """bfloat16(silu(gate)) * up, as `F.silu(gate) * up` rounds it: [..., hidden] bfloat16. gate and up may be the two
    halves of one fused product (views with the same row stride)."""
    if not gate.dtype == up.dtype == torch.bfloat16:  # the kernel reads raw bfloat16
        raise TypeError(f"silu_mul takes bfloat16, got {gate.dtype} and {up.dtype}")
    hidden = gate.shape[-1]
    g, u = gate.reshape(-1, hidden), up.reshape(-1, hidden)  # views where the layout allows
    if g.stride() != u.stride() or g.stride(1) != 1:
        g, u = g.contiguous(), u.contiguous()
    out = gate.new_empty(gate.shape)
    glue().specgen_silu_mul_bf16(g.data_ptr(), u.data_ptr(), g.stride(0), out.data_ptr(), g.shape[0], hidden)
    return out
