"""torch wrappers of glue.c's row kernels (bfloat16 or float32 on a CPU, inference only) and when they run."""

from __future__ import annotations

import torch

from specgen.native import glue

DTYPES = (torch.bfloat16, torch.float32)


def usable(*tensors: torch.Tensor) -> bool:
    """Whether an op on these tensors (one dtype) runs natively: bfloat16 or float32 on a CPU where glue.c was built,
    with grad mode off (the kernels have no backward; every decode forward runs under inference mode, so a model's
    decode steps all give the same answer)."""
    if torch.is_grad_enabled() or glue() is None:
        return False
    first = tensors[0]
    return first.dtype in DTYPES and all(t.dtype == first.dtype and t.device.type == "cpu" for t in tensors)


def check(status: int) -> None:
    if status != 0:
        raise MemoryError("a native row kernel could not get its scratch memory")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * RMSNorm_float32(x) rounded to x's dtype, over the last dim, as transformer.RMSNorm: [..., dim]."""
    x = x.contiguous()
    out = torch.empty_like(x)
    dim = x.shape[-1]
    check(glue().specgen_rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // dim, dim, eps,
                                  x.element_size()))
    return out


def add_rms_norm(x: torch.Tensor, a: torch.Tensor, weight: torch.Tensor, eps: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + a, RMSNorm(x + a)): a residual add and the pre-norm after it, in one pass ([..., dim] each)."""
    x, a = x.contiguous(), a.contiguous()
    total, out = torch.empty_like(x), torch.empty_like(x)
    dim = x.shape[-1]
    check(glue().specgen_add_rms_norm(x.data_ptr(), a.data_ptr(), weight.data_ptr(), total.data_ptr(), out.data_ptr(),
                                      x.numel() // dim, dim, eps, x.element_size()))
    return total, out


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, rounded as `F.silu(gate) * up` rounds it: [..., hidden]. gate and up may be the two halves of
    one fused product (views with the same row stride)."""
    hidden = gate.shape[-1]
    g, u = gate.reshape(-1, hidden), up.reshape(-1, hidden)  # views where the layout allows
    if g.stride() != u.stride() or g.stride(1) != 1:
        g, u = g.contiguous(), u.contiguous()
    out = gate.new_empty(gate.shape)
    glue().specgen_silu_mul(g.data_ptr(), u.data_ptr(), g.stride(0), out.data_ptr(), g.shape[0], hidden,
                            gate.element_size())
    return out
