"""Which kernels a forward runs, per device x dtype x shape: the one rule (its table and why: docs/precision.md)."""

from __future__ import annotations

import functools

import torch

from specgen import native
from specgen.devices import onednn_packs
from specgen.models import prompt
from specgen.native import cuda_ops, ops

#: Activation dtypes whose cached CPU forwards run the native kernels (attention and the norms around it).
NATIVE_DTYPES = (torch.bfloat16, torch.float32)
#: Weight dtypes whose CPU products run tiled.c (`tiled_products`).
TILED_DTYPES = (torch.float32, torch.bfloat16)
#: Activation dtypes whose cached CUDA forwards attend over the same lists (native/cuda_ops.py).
CUDA_LIST_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Weight dtypes whose GPU products run as GEMMs of one row count (SlicedLinear): the library picks a GEMM's kernel,
#: and each row's order of sums, by its shape in every float dtype (docs/precision.md).
SLICED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Rows of each bfloat16 decode product on a CPU with AMX (`amx_slices`): zero-padded slices of this many, one oneDNN
#: GEMM shape at every row count (the GPU's SlicedLinear rule). Measured there on a bfloat16 SmolLM2 (docs/results/
#: text.md): AR 23.7 tok/s at 16, 21.5 at 32, 19.6 at 64 (a slice's rows cost little but not nothing); its chains fit.
#: Past one slice, a call covers two where that call gives each slice's bits (`PackedLinear.paired`, checked bitwise).
AMX_SLICE_ROWS = 16
#: The least weight (elements) whose products take AMX slices: below it oneDNN's ~14 us a call at one thread costs
#: more than tiled.c's one-row product (a 512 x 512 weight: 13 us against 20; the tiny image GPT's all stay on tiled.c).
AMX_MIN_WEIGHT = 2**18
CAPPED_CHUNKED = [False]  # whether this process attended a softcapped model chunked on the CPU (`attention_path`)


def cpu_packable(w: torch.Tensor) -> bool:
    """A CPU weight in float32 or bfloat16 that this CPU's oneDNN packs (`devices.onednn_packs`: an AVX2-only CPU
    refuses bfloat16): where a product tiled.c does not take runs oneDNN over a packed copy (a bfloat16 prompt's)."""
    return w.device.type == "cpu" and w.dtype in (torch.float32, torch.bfloat16) and onednn_packs(w.dtype)


def inference_on_cpu(dtypes: tuple, *tensors: torch.Tensor) -> bool:
    """CPU tensors of one dtype among `dtypes`, grad mode off (the native kernels have no backward; decode forwards
    all run under inference mode, so all of a model's decode steps take the same path)."""
    first = tensors[0]
    return (not torch.is_grad_enabled() and first.dtype in dtypes
            and all(t.dtype == first.dtype and t.device.type == "cpu" for t in tensors))


def attention_path(dtype: torch.dtype, device: torch.device | str, softcap: float = 0.0) -> str:
    """The attention of a cached forward: "native" (each query over its list of visible slots: attention.c on a CPU, a
    Triton kernel on CUDA), "chunked" or "sdpa" (the table above); a prompt prefill's: sdpa, but `prompts_as_steps`.
    A model whose scores are softcapped (`softcap` > 0, Gemma 2) decodes chunked on a CPU: attention.c has no cap (the
    C kernels stay frozen), and SDPA none either (`Attention.attend` computes it dense there)."""
    if prompt.active() and not prompts_as_steps(dtype, device):
        return "sdpa"
    kind = torch.device(device).type
    if softcap and kind == "cpu" and not torch.is_grad_enabled():
        CAPPED_CHUNKED[0] = True  # for machine labels (`machine.label`): the step kernels attention.c is not
        return "chunked"
    if not torch.is_grad_enabled() and (
            (kind == "cpu" and dtype in NATIVE_DTYPES and native.library("attention") is not None)
            or cuda_kernels(dtype, device)):
        return "native"
    return "sdpa" if dtype == torch.float32 else "chunked"


def native_norms(*tensors: torch.Tensor) -> bool:
    """Whether a norm (or residual add and norm) over these tensors runs one native kernel: glue.c on a CPU, Triton on
    CUDA (native/cuda_ops.py), grad mode off."""
    first = tensors[0]
    if first.device.type == "cuda":
        return cuda_kernels(first.dtype, first.device) and all(t.dtype == first.dtype and t.device == first.device
                                                               for t in tensors)
    return inference_on_cpu(NATIVE_DTYPES, *tensors) and native.library("glue") is not None


def one_pass(x: torch.Tensor) -> bool:
    """Whether a step over x runs as one of the CUDA-only Triton ops (native/ops.py: RoPE, the gate, a step's plan, a
    tree growth's; torch's ops elsewhere): CUDA, grad mode off. Asked per layer: a CPU tensor answers at the first
    test."""
    return x.is_cuda and cuda_kernels(x.dtype, x.device)


def cuda_kernels(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether a CUDA forward in `dtype` runs the Triton kernels (native/cuda_ops.py): grad mode off (they have no
    backward), a dtype they take, Triton here and not turned off (`cuda_ops.available`)."""
    return (torch.device(device).type == "cuda" and not torch.is_grad_enabled() and dtype in CUDA_LIST_DTYPES
            and cuda_ops.available())


def prompts_as_steps(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether a prompt prefill attends as a decode step does (the list attention, whose sums do not depend on how many
    queries a forward holds), so that a prompt may run as chunks of captured steps with the bits of one forward
    (`StepGraphs.prefill`): on CUDA with the Triton kernels. A CPU prefills with SDPA, its faster kernel for many
    queries; a prefill's bits are then its own, as every method prefills alike."""
    return cuda_kernels(dtype, device)


def tiled_products(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a CPU product runs tiled.c: grad mode off, tiled.c built, float32 at every row count, bfloat16 outside
    a prompt prefill where `amx_slices` does not take it (over float32 tiles: each product exact in float32, the sum
    rounded once to bfloat16). The invariant: a decode step's row gets the same bits whatever the rows beside it, so
    a verify scores each token as its AR step did. MKL's and oneDNN's products give a row other bits at other row
    counts, and so does any choice of kernel by row count (docs/precision.md)."""
    return (inference_on_cpu(TILED_DTYPES, x, weight) and native.library("tiled") is not None
            and (weight.dtype == torch.float32 or not (prompt.active() or amx_slices(x, weight))))


def amx_slices(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a CPU bfloat16 decode product runs oneDNN in AMX_SLICE_ROWS-row slices: an `amx_weight`, grad mode off,
    outside a prompt prefill. One GEMM shape keeps a row's bits whatever the rows beside it, as tiled.c's one kernel
    does (tested bitwise), and the choice is the weight's, whatever the rows; AMX makes a slice's 16 rows cost about
    one."""
    return amx_weight(weight) and not prompt.active() and inference_on_cpu((torch.bfloat16,), x, weight)


def amx_weight(weight: torch.Tensor) -> bool:
    """The weight's half of `amx_slices`: bfloat16, AMX_MIN_WEIGHT elements or more, on a CPU with AMX bfloat16 tiles
    whose oneDNN packs bfloat16 (the straight run asks only this: its blocks checked the rest)."""
    return (weight.dtype == torch.bfloat16 and weight.numel() >= AMX_MIN_WEIGHT and amx_bf16()
            and onednn_packs(torch.bfloat16))


def cpu_rule() -> str:
    """Which kernel this CPU's float products take, in words: part of a stored cost curve's key (`decoding/cost.py`),
    so a curve timed under another rule is measured again."""
    amx = amx_bf16() and onednn_packs(torch.bfloat16)
    return f"tiled; bfloat16 AMX slices of {AMX_SLICE_ROWS}, paired, from {AMX_MIN_WEIGHT}" if amx else "tiled"


@functools.cache
def amx_bf16() -> bool:
    """Whether this CPU has AMX tiles for bfloat16 (its /proc/cpuinfo flags; the kernel lets oneDNN use them)."""
    return any("amx_bf16" in ln.split() for ln in native.cpu_signature().splitlines() if ln.startswith("flags"))


def sliced_products(weight: torch.Tensor) -> bool:
    """Whether a Linear's products run as GEMMs of one fixed row count (`models/sliced_linear.py`): float weights off
    the CPU, where the GPU library picks a GEMM's reduction order by its shape."""
    return weight.dtype in SLICED_DTYPES and weight.device.type != "cpu"


def quantized_product(in_features: int, group: int) -> str:
    """The kernel of an int8 / int4 layer's decode products: "native" (qmm.c, 15-bit activations) where its library is
    built and the widths fit its 32-input blocks, else "torch" (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`,
    bfloat16 activations). Decided per process and shape, so every forward of a model takes one path."""
    fits = in_features % ops.QMM_BLOCK == 0 and group % ops.QMM_BLOCK == 0
    return "native" if fits and native.library("qmm") is not None else "torch"
