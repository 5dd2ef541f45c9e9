"""torch wrappers of glue.c's row kernels (bfloat16 or float32 on a CPU, inference only) and when they run."""

from __future__ import annotations

import torch

from specgen.native import glue

# The activation dtypes whose decode steps run the native kernels, attention (models/attention.py) and norms alike.
DTYPES = (torch.bfloat16, torch.float32)


def usable(*tensors: torch.Tensor) -> bool:
    """Whether an op on these tensors (one dtype) runs natively: DTYPES on a CPU where glue.c was built,
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
