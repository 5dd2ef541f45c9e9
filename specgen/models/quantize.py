"""Weight-only int8 / int4 quantization of a Transformer for CPU decoding (qmm.c, else torch's packed kernels)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools

import torch
import torch.nn.functional as F
from torch import nn

from specgen import devices
from specgen.errors import UsageError
from specgen.models import native_block, prompt
from specgen.models.kernel_choice import quantized_product
from specgen.models.moe import MoEFeedForward
from specgen.models.transformer import ACTIVATIONS, FeedForward, Transformer, TransformerConfig
from specgen.native import ops

GROUPS = (32, 64, 128, 256)  # int4 group sizes the CPU kernel accepts
DEFAULT_GROUP = 32
REFINE_STEPS = 3  # least-squares refits of int4 scales and zeros (quantize_int4)
VERSION = 4  # of the quantized layout; stored entries record it and are remade when it differs (3: int4 refits; 4: w13)
ACT_DTYPE = torch.bfloat16  # activations of a quantized target: the kernels' dtype
# products of at least this many rows (per mode) in a prompt prefill dequantize to bfloat16 for one GEMM
# (models/prompt.py): `python scripts/quantized_prefill.py` times both kernels per row count
PROMPT_MIN_ROWS = {"int8": 24, "int4": 64}
# output rows converted to the int4 kernel's layout at a time: a multiple of its 64-row blocks, so the pieces are
# bitwise the whole conversion, and its int32 input stays small (a whole layer's is 4 bytes a weight)
PACK_ROWS = 256
INT8_MM = torch.ops.aten._weight_int8pack_mm  # x [M, in] bf16, q int8 [out, in], scales bf16 [out] -> [M, out] bf16
INT4_MM = torch.ops.aten._weight_int4pack_mm_for_cpu  # x [M, in] bf16, packed, group, scales-and-zeros -> [M, out]


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [out, in], scales bf16 [out]) of w [out, in]: symmetric per output channel."""
    w = w.detach().float().contiguous()  # row-major q, whatever layout the float weight had (models/layout.py)
    s = (w.abs().amax(1) / 127).clamp(min=1e-12).to(torch.bfloat16)  # [out]
    q = torch.round(w / s.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return q, s


def dequantize_int8(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """float32 [out, in] = q * s."""
    return q.float() * s.float()[:, None]


def quantize_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q uint8 [out, in/2] two nibbles per byte (low = even column), scales bf16 [out, in/g], zeros bf16
    [out, in/g]) of w [out, in], w ~ (q - 8) * scale + zero per group of `group` input columns: min-max, then
    `REFINE_STEPS` least-squares refits of (scale, zero) rounded to bfloat16, each kept per group only where neither
    its squared error nor its largest error grows (why: docs/precision.md)."""
    out, k = w.shape  # the width and group are checked by quantize_model
    wg = w.detach().float().contiguous().view(out, k // group, group)  # [out, G, g]
    lo, hi = wg.amin(-1), wg.amax(-1)  # [out, G]
    scale = ((hi - lo) / 15).clamp(min=1e-6).to(torch.bfloat16).float()
    zero = (lo + 8 * scale).to(torch.bfloat16).float()
    q = levels(wg, scale, zero)
    best = (*group_error(wg, q, scale, zero), scale, zero, q)  # (err, worst, scale, zero, q) per group
    for _ in range(REFINE_STEPS):
        q = best[4]
        u = q - 8  # [out, G, g]
        um, wm = u.mean(-1, keepdim=True), wg.mean(-1, keepdim=True)
        var = (u - um).square().sum(-1)
        fit = torch.where(var > 0, ((u - um) * (wg - wm)).sum(-1) / var.clamp(min=1e-12), best[2])
        for s in bf16_either_side(fit.clamp(min=1e-6)):
            for z in bf16_either_side((wg - u * s[..., None]).mean(-1)):
                best = keep_better(best, (*group_error(wg, q, s, z), s, z, q))
        q2 = levels(wg, best[2], best[3])
        best = keep_better(best, (*group_error(wg, q2, best[2], best[3]), best[2], best[3], q2))
    _, _, scale, zero, q = best
    q = q.to(torch.uint8).view(out, k)
    return q[:, 0::2] | (q[:, 1::2] << 4), scale.to(torch.bfloat16), zero.to(torch.bfloat16)


def keep_better(best: tuple, candidate: tuple) -> tuple:
    """Per group, `candidate` where its squared error is lower and its largest error no higher, else `best`."""
    better = (candidate[0] < best[0]) & (candidate[1] <= best[1])  # [out, G]
    return tuple(torch.where(better if b.dim() == 2 else better[..., None], c, b) for b, c in zip(best, candidate))


def levels(wg: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """float q in [0, 15] [out, G, g]: the nearest level of each weight under (scale, zero) [out, G]."""
    return torch.round((wg - zero[..., None]) / scale[..., None] + 8).clamp(0, 15)


def group_error(wg: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([out, G] squared error, largest absolute error) of each group's reconstruction (q - 8) * scale + zero."""
    diff = (q - 8) * scale[..., None] + zero[..., None] - wg
    return diff.square().sum(-1), diff.abs().amax(-1)


def bf16_either_side(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(largest bfloat16 <= x, smallest bfloat16 >= x) as float32 tensors shaped like x (float32)."""
    b = x.to(torch.bfloat16)
    up = torch.nextafter(b, torch.full_like(b, float("inf"))).float()
    down = torch.nextafter(b, torch.full_like(b, float("-inf"))).float()
    below = b.float() <= x
    return torch.where(below, b.float(), down), torch.where(below, up, b.float())


def unpack_int4(q4: torch.Tensor) -> torch.Tensor:
    """uint8 [out, in] nibble values of q4 [out, in/2]."""
    return torch.stack([q4 & 15, q4 >> 4], dim=-1).flatten(-2)


def dequantize_int4(q4: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """float32 [out, in] = (q - 8) * scale + zero per group."""
    q = unpack_int4(q4).float()  # [out, in]
    out, k = q.shape
    g = k // scale.shape[1]
    w = (q.view(out, -1, g) - 8) * scale.float()[..., None] + zero.float()[..., None]
    return w.view(out, k)


class QuantizedLinear(nn.Module):
    """Linear with int8 or int4 weights (buffers, saved in the state dict): x [..., in] (any float dtype) -> [..., out]
    in x's dtype, on the quantized kernel (`kernel_choice.quantized_product`) except in a prompt prefill
    (`models/prompt.py`, which dequantizes to one bfloat16 GEMM). Invariant: every kernel computes each row of a product
    alone, so a row's numbers never depend on its batch partners or the verify width and greedy speculation equals
    AR (docs/precision.md)."""

    _kernel: tuple | None = None  # (op, operands, bias, made tensors) of `kernel`; dropped when the buffers are
    # replaced (assignment, load_state_dict, .to()), remade at the next product

    def __init__(self, in_features: int, out_features: int, mode: str, group: int = 0, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features, self.mode = in_features, out_features, mode
        self.group = group if mode == "int4" else 0
        if mode == "int8":
            self.register_buffer("qweight", torch.zeros(out_features, in_features, dtype=torch.int8))
            self.register_buffer("scales", torch.ones(out_features, dtype=ACT_DTYPE))
        else:  # the width and group are checked where a model is quantized (quantize_model)
            self.register_buffer("qweight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8))
            self.register_buffer("scales", torch.ones(out_features, in_features // group, dtype=ACT_DTYPE))
            self.register_buffer("zeros", torch.zeros(out_features, in_features // group, dtype=ACT_DTYPE))
        self.register_buffer("bias", torch.zeros(out_features, dtype=ACT_DTYPE) if bias else None)

    @classmethod
    def from_linear(cls, lin: nn.Linear, mode: str, group: int = 0) -> QuantizedLinear:
        """Quantize an nn.Linear (its weight is read once, not kept)."""
        q = cls(lin.in_features, lin.out_features, mode, group, lin.bias is not None)
        if mode == "int8":
            q.qweight, q.scales = quantize_int8(lin.weight)
        else:
            q.qweight, q.scales, q.zeros = quantize_int4(lin.weight, group)
        if lin.bias is not None:
            q.bias = lin.bias.detach().to(ACT_DTYPE)
        return q

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out]
        # a hot path (every layer of every decode step): no conversion op unless x needs one, and no buffer lookup
        # (nn.Module's __getattr__): the kernel's operands and the bias are read from `_kernel`
        op, operands, bias, _ = self._kernel or self.kernel()
        x2 = x.reshape(-1, self.in_features)  # [M, in]
        if x2.dtype != ACT_DTYPE:
            x2 = x2.to(ACT_DTYPE)
        if x2.shape[0] >= PROMPT_MIN_ROWS[self.mode] and prompt.active() and bf16_gemm():  # a prompt (prompt.py)
            y = F.linear(x2, self.prompt_weight())  # [M, out]; the same weights, one bf16 GEMM
        else:
            y = op(x2.contiguous(), *operands)
        if bias is not None:
            y = y + bias
        if x.dtype != ACT_DTYPE:
            y = y.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def prompt_weight(self) -> torch.Tensor:
        """The weight [out, in] in bfloat16 for a prompt's GEMM (the float32 `dequantize_int8/4`, rounded once), in a
        workspace shared by every layer of this shape: a fresh weight per product would fault in new pages each time."""
        w32, w16 = workspace(self.out_features, self.in_features)
        if self.mode == "int8":
            w32.copy_(self.qweight).mul_(self.scales.float()[:, None])
        else:
            w32.copy_(unpack_int4(self.qweight))  # [out, in] nibble values
            s, z = self.scales.float()[..., None], self.zeros.float()[..., None]  # [out, in/g, 1]
            w32.view(self.out_features, -1, self.group).mul_(s).add_(z - 8 * s)  # (q - 8) * s + z
        return w16.copy_(w32)

    def kernel(self) -> tuple:
        """(kernel op, its operands after x, bias, the tensors made for it), made once per set of buffers."""
        if self._kernel is None:
            self.use_kernel(self.make_kernel())
        return self._kernel

    def make_kernel(self, device: str | None = None) -> dict[str, torch.Tensor]:
        """The tensors the kernel (`kernel_choice.quantized_product`) reads besides the buffers: qmm.c's codes and sz,
        or torch int4's packed weight and sz [in/g, out, 2]; torch int8: none. On "meta": what a stored copy matches,
        from the shapes alone (a meta torch.stack or cat imports torch._dynamo, and Triton where installed)."""
        if device == "meta":
            return self.kernel_shapes()
        qweight, scales = self.qweight.to(device), self.scales.to(device)
        zeros = self.zeros.to(device) if self.mode == "int4" else None
        if quantized_product(self.in_features, self.group or self.in_features) == "native":
            codes = unpack_int4(qweight) if self.mode == "int4" else qweight  # [out, in]
            return dict(zip(("codes", "sz"), ops.pack_codes(codes, scales, zeros)))
        if self.mode == "int8":
            return {}
        packed = torch.empty_like(qweight)  # [out, in/2] in the kernel's order (blocks of <= 64 rows)
        for i in range(0, self.out_features, PACK_ROWS):  # the int32 input: a few rows at a time
            q = unpack_int4(qweight[i : i + PACK_ROWS]).to(torch.int32)  # [rows, in], values 0..15
            packed[i : i + PACK_ROWS] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        return {"packed": packed, "sz": torch.stack([scales, zeros], -1).transpose(0, 1).contiguous()}

    def kernel_shapes(self) -> dict[str, torch.Tensor]:
        """`make_kernel`'s tensors as empty meta tensors of their shapes and dtypes, nothing computed."""
        groups = self.in_features // (self.group or self.in_features)
        if quantized_product(self.in_features, self.group or self.in_features) == "native":
            return dict(zip(("codes", "sz"), ops.packed_shapes(self.out_features, self.in_features,
                                                               groups if self.mode == "int4" else 0)))
        if self.mode == "int8":
            return {}
        meta = dict(device="meta")
        return {"packed": torch.empty(self.qweight.shape, dtype=self.qweight.dtype, **meta),
                "sz": torch.empty(groups, self.out_features, 2, dtype=self.scales.dtype, **meta)}

    def use_kernel(self, made: dict[str, torch.Tensor]) -> None:
        """Run products on `made` (`make_kernel`'s tensors, or the layout cache's mapped copies of them); torch
        int4's scales and zeros become views of its sz: held once."""
        if "codes" in made:
            bits, group = (4, self.group) if self.mode == "int4" else (8, self.in_features)
            operands = (made["codes"], made["sz"], bits, group, self.out_features)  # then threads: torch's, per call
            self._kernel = (lambda x, *a: ops.qmm(x, *a, torch.get_num_threads()), operands, self.bias, made)
        elif "packed" in made:
            self.scales, self.zeros = made["sz"][..., 0].t(), made["sz"][..., 1].t()
            self._kernel = (INT4_MM, (made["packed"], self.group, made["sz"]), self.bias, made)
        else:
            self._kernel = (INT8_MM, (self.qweight, self.scales), self.bias, made)

    def streamed_bytes(self) -> int:
        """Bytes one product reads: the kernel's codes and scales, else the quantized buffers."""
        made = self.kernel()[3]
        return sum(t.numel() * t.element_size() for t in (made.values() if "codes" in made else self.buffers()))

    def __setattr__(self, name: str, value) -> None:
        if name in ("qweight", "scales", "zeros", "bias"):
            self.__dict__.pop("_kernel", None)
        super().__setattr__(name, value)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self.__dict__.pop("_kernel", None)  # the buffers are overwritten in place
        super()._load_from_state_dict(*args, **kwargs)

    def _apply(self, fn, recurse: bool = True):
        self.__dict__.pop("_kernel", None)  # .to() / .cpu() may replace the buffers
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_kernel"}

    def extra_repr(self) -> str:
        g = f", group={self.group}" if self.group else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}{g}"


def bf16_gemm() -> bool:
    """Whether this CPU has a fast bfloat16 GEMM for prompt mode (oneDNN packs bfloat16; AVX2-only: a slow fallback)."""
    return devices.onednn_packs(ACT_DTYPE)


@functools.cache
def workspace(out: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 and bfloat16 [out, k] buffers for `QuantizedLinear.prompt_weight`, one pair per shape per process."""
    return torch.empty(out, k), torch.empty(out, k, dtype=ACT_DTYPE)


class QuantizedFeedForward(nn.Module):
    """SwiGLU w2(silu(w1 x) * w3 x) (or the float model's other gate, `act`: transformer.ACTIVATIONS) with the gate
    and up projections stored as one quantized layer `w13` = [w1; w3]: one kernel call fewer, bitwise the unfused form
    (every output row is quantized and computed alone)."""

    def __init__(self, w13: QuantizedLinear, w2: QuantizedLinear, act: str = "silu") -> None:
        super().__init__()
        self.w13, self.w2, self.act = w13, w2, act
        self.hidden = w2.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., dim] -> [..., dim]
        gate, up = self.w13(x).split(self.hidden, -1)  # [..., hidden] each
        return self.w2(ACTIVATIONS[self.act](gate) * up)


def qmm_ready(lins: tuple, rows: int) -> bool:
    """QuantizedLinears whose products run qmm.c, outside a prompt prefill (whose wide products may take one bfloat16
    GEMM: QuantizedLinear.forward); any other class (a LoRA wrapper) keeps the module path."""
    return not prompt.active() and all(type(lin) is QuantizedLinear and "codes" in (lin._kernel or lin.kernel())[3]
                                       for lin in lins)


def qmm_product(lin: QuantizedLinear, x: torch.Tensor, threads: int) -> torch.Tensor:
    """QuantizedLinear.forward of a bfloat16 x [..., in] on qmm.c (`qmm_ready`): [..., out]."""
    _, operands, bias, _ = lin._kernel or lin.kernel()
    y = ops.qmm(x, *operands, threads)
    return y if bias is None else y + bias


def qmm_gate(ffn: QuantizedFeedForward, x: torch.Tensor, threads: int) -> torch.Tensor:
    """QuantizedFeedForward's SwiGLU gate (its torch ops; `native_block.usable` admits no other): [..., hidden]."""
    gate, up = qmm_product(ffn._modules["w13"], x, threads).split(ffn.hidden, -1)  # [..., hidden] each (`_modules`:
    # past nn.Module.__getattr__, as native_block.linears)
    return ACTIVATIONS["silu"](gate) * up


native_block.KINDS[QuantizedLinear, ACT_DTYPE] = native_block.Products(qmm_ready, qmm_product, qmm_gate)


class QuantizedEmbedding(nn.Module):
    """Embedding rows from an int8 table with one scale per row; shares the given head's buffers (the same
    tensors under two names: tied, as the float model ties `tok_embeddings.weight` and `output.weight`)."""

    def __init__(self, head: QuantizedLinear) -> None:
        super().__init__()
        self.register_buffer("qweight", head.qweight)
        self.register_buffer("scales", head.scales)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # ids [...] -> [..., dim] bf16
        return self.qweight[ids].to(ACT_DTYPE) * self.scales[ids].unsqueeze(-1)


def quantized_ffn(ffn: FeedForward, quantized, mode: str, group: int) -> QuantizedFeedForward:
    """A dense feed-forward (w1, w3, w2 without biases) as a QuantizedFeedForward; w13: [2 * hidden, dim]."""
    w13 = quantized(_as_linear(ffn.w1.weight, ffn.w3.weight), mode, group)
    return QuantizedFeedForward(w13, quantized(ffn.w2, mode, group), ffn.act)


def quantized_experts(ffn: MoEFeedForward, quantized, mode: str, group: int) -> MoEFeedForward:
    """A routed feed-forward with each expert (and a shared one) quantized as a dense one (`quantized_ffn`: qmm.c
    computes every row alone, so an expert's rows stay row-invariant); its router and a shared expert's gate stay
    float Linears (bfloat16 with the norms: a quantized router's rounding would send rows to other experts)."""
    ffn.experts = nn.ModuleList(quantized_ffn(expert, quantized, mode, group) for expert in ffn.experts)
    if ffn.shared:
        ffn.shared_expert = quantized_ffn(ffn.shared_expert, quantized, mode, group)
    return ffn


#: a block's feed-forward class -> how `swap_layers` quantizes it
QUANTIZED_FFNS = {FeedForward: quantized_ffn, MoEFeedForward: quantized_experts}


def swap_layers(model: Transformer, quantized, mode: str, group: int) -> None:
    """In place: each block's (cross-)attention Linears -> `quantized(lin, mode, group)`, its feed-forward -> a
    QuantizedFeedForward of two (routed: each expert's, `QUANTIZED_FFNS`), and the head and embedding -> int8 ones
    (tied when the model ties them)."""
    for blk in model.layers:
        for parent in (blk.attention,) + ((blk.cross_attention,) if hasattr(blk, "cross_attention") else ()):
            for name, lin in list(parent.named_children()):
                if isinstance(lin, nn.Linear):
                    setattr(parent, name, quantized(lin, mode, group))
        blk.feed_forward = QUANTIZED_FFNS[type(blk.feed_forward)](blk.feed_forward, quantized, mode, group)
    head = quantized(model.output, "int8", 0)
    table = head if model.cfg.tie_embeddings else quantized(_as_linear(model.tok_embeddings.weight), "int8", 0)
    model.output, model.tok_embeddings = head, QuantizedEmbedding(table)


def quantize_model(model: nn.Module, mode: str, group: int = DEFAULT_GROUP) -> nn.Module:
    """Replace every Linear of a decoder Transformer's blocks (the model's, or its `decoder`'s: the mesh GPT) by a
    QuantizedLinear in place (head and embedding int8, tied when the model ties them); norms, a LlamaGen condition
    embedding (class table, caption projection: run once per sequence) and a mesh GPT's point-cloud encoder go to
    bfloat16. Returns the model (its float weights are freed)."""

    dec = model if isinstance(model, Transformer) else getattr(model, "decoder", None)
    if not isinstance(dec, Transformer):
        raise ValueError(f"quantization covers specgen's decoder Transformer (text, image and mesh GPTs), not "
                         f"{type(model).__name__}")
    if mode == "int4":  # checked before any layer is replaced: a refused model is left whole
        if group not in GROUPS:
            raise UsageError(f"int4 group size must be one of {', '.join(map(str, GROUPS))}, got {group}")
        if odd := [m.in_features for m in dec.layers.modules() if isinstance(m, nn.Linear) and m.in_features % group]:
            raise UsageError(f"int4 needs input widths divisible by the group size {group}; this model has a "
                             f"{odd[0]}-wide layer (try a group size that divides it, e.g. 32)")
    with torch.no_grad():
        swap_layers(dec, QuantizedLinear.from_linear, mode, group)
    if dec is not model:  # the mesh GPT's encoder (buffers too), as `.to(bfloat16)` would; not the decoder
        for child in model.children():
            if child is not dec:
                child.to(ACT_DTYPE)
    for p in model.parameters():  # norms, the condition embedding, a mesh GPT's start vector: the activation dtype
        p.data = p.data.to(ACT_DTYPE)
    if dec.cfg.cond_kind == "caption":  # the learned null caption: in the dtype of the features it stands for
        dec.cls_embedding.uncond_embedding = dec.cls_embedding.uncond_embedding.to(ACT_DTYPE)
    return model


def _as_linear(*tables: torch.Tensor) -> nn.Linear:
    """A bias-free Linear over `tables` stacked by rows; on the meta device shapes only (a meta `torch.cat` imports
    torch._dynamo, and Triton with it where installed: ~0.1 GB and ~1 s of every quantized load's start)."""
    rows, cols = sum(t.shape[0] for t in tables), tables[0].shape[1]
    lin = nn.Linear(cols, rows, bias=False, device="meta")
    if not tables[0].is_meta:
        lin.weight = nn.Parameter((torch.cat(tables) if len(tables) > 1 else tables[0]).detach(), requires_grad=False)
    return lin


def build_quantized_transformer(quantize: str, group: int = 0, **kwargs) -> nn.Module:
    """Registry builder: the module of a quantized entry with empty buffers, ready for load_state_dict (the float
    Transformer is built on the meta device and never allocated; its norms are then made for real)."""
    with torch.device("meta"):
        model = Transformer(TransformerConfig(**kwargs))
    swap_layers(model, lambda lin, mode, g: QuantizedLinear(lin.in_features, lin.out_features, mode, g,
                                                            lin.bias is not None), quantize, group)
    for mod in model.modules():  # the norms (still on meta): real bf16 ones
        for name, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, name, nn.Parameter(torch.ones(p.shape, dtype=ACT_DTYPE), requires_grad=False))
    return model.eval()


def quantized_layers(module: nn.Module) -> dict[str, QuantizedLinear]:
    """The quantized layers by name (the layout cache stores their kernel tensors under these names)."""
    return {name: m for name, m in module.named_modules() if isinstance(m, QuantizedLinear)}


def prepare_kernels(module: nn.Module) -> nn.Module:
    """Make every quantized layer's kernel copies now (at load, not in the first timed forward), then hand freed
    conversion buffers back to the OS (glibc keeps them in the heap otherwise)."""
    made = [lin.kernel()[3] for lin in quantized_layers(module).values()]  # each layer's, now
    if any(made):  # the kernels' own copies were made (torch's int8 kernel makes none)
        with contextlib.suppress(OSError, AttributeError, TypeError):  # not glibc: nothing to trim this way
            ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    return module
