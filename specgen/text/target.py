"""Load a text target (registry name or path) with its tokenizer; LoRA adapter entries are merged at load."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen import checkpoints, registry
from specgen import precision as prec
from specgen.decoding.target import ModelTarget
from specgen.devices import device_name, resolve_dtype
from specgen.errors import UsageError
from specgen.models.graphs import attach
from specgen.models.layout import decode_layout
from specgen.models.tokenizer import TextTokenizer
from specgen.text.merge import merged_module  # also registers the built-in distilled targets' maker (builtins)


@dataclass
class TextModel:
    """A loaded text target: module, loop adapter, tokenizer, registry entry (a quantized target's stored entry), and
    what runs (`precision`: float32, bfloat16, int8 or int4)."""

    module: torch.nn.Module
    target: ModelTarget
    tokenizer: TextTokenizer
    entry: registry.Entry
    precision: str = "float32"


@dataclass(frozen=True)
class TextSource:
    """A text target found, its tokenizer loaded and its weights not: prompts are checked against it before `load`."""

    entry: registry.Entry  # as named: a target, a stored quantized entry, or a LoRA adapter
    base: registry.Entry  # the float32 target it is made from (entry itself for a plain target): tokenizer, config
    tokenizer: TextTokenizer
    device: str
    dtype: str  # float32 | bfloat16 | float16: activations and KV cache
    quantize: str | None

    @property
    def config(self) -> dict:
        """The architecture (`TransformerConfig` fields) as stored: quantized copies and adapters share their base's."""
        return self.base.meta.get("kwargs") or {}

    def load(self, progress=None, decode: bool = True, graphs: str = "auto") -> TextModel:
        """The weights, at this precision; `decode` stores them in the decode layout (`models/layout.py`)."""
        entry, torch_dtype = self.entry, prec.DTYPES[self.dtype]
        if entry.kind == "adapter":
            module, _ = merged_module(entry, self.base, self.device, tokenizer=self.tokenizer)
            module = prec.in_memory(module, self.dtype, self.quantize)  # a merge is not stored: quantized each load
            if decode:
                decode_layout(module)
        else:
            if self.quantize and not entry.meta.get("quantized"):  # made from the float32 weights on first use
                entry = prec.quantized_entry(entry, self.quantize, progress)
            module = checkpoints.load_module(entry, self.device, torch_dtype, decode)  # decode: laid out there
        target = ModelTarget(module)
        target.device = self.device
        if decode:
            attach(module, graphs)  # captured steps on CUDA (models/graphs.py); nothing changes on a CPU with auto
        return TextModel(module, target, self.tokenizer, entry, self.quantize or self.dtype)


def open_text_model(name: str, device: str = "cpu", progress=None, dtype: str | None = None,
                    quantize: str | None = None) -> TextSource:
    """Resolve `name` (an adapter: its parent with it merged) and load its tokenizer; `dtype` / `quantize` or a
    `+bf16` / `+int8` / `+int4` suffix pick the precision (docs/precision.md)."""
    device = device_name(device)
    asked = prec.split_name(name)[1] or dtype
    name, dtype, quantize = prec.resolve(name, dtype, quantize)
    if not quantize:  # a quantized target's bfloat16 activations run the int8/int4 and native step kernels, not
        resolve_dtype(dtype, device)  # torch's bfloat16 fallback; float16 where this CPU cannot run it: one line
    prec.check_cpu(quantize, device)
    entry = checkpoints.find(name, progress)
    if entry.meta.get("quantized"):  # a stored quantized entry named directly; the tokenizer is its base's
        base = prec.check_quantized_entry(entry, quantize, progress)
        quantize = entry.meta["quantized"]["mode"]
        dtype = prec.resolve(name, asked, quantize)[1]  # its activations: bfloat16 (float32 asked for: refused)
    elif entry.kind == "adapter":
        base = checkpoints.find_linked(entry, entry.meta.get("parent", ""), "was trained for", progress)
        if base.meta.get("modality", "text") != "text" or not base.meta.get("tokenizer"):  # a mesh heads' LoRA
            raise UsageError(f"{entry.ref} adapts {base.ref}, which is not a text model with a tokenizer")
    elif entry.meta.get("modality", "text") != "text" or not entry.meta.get("tokenizer"):
        raise UsageError(f"{entry.ref} is not a text model with a tokenizer")
    else:
        base = entry
    return TextSource(entry, base, TextTokenizer.load(base.path), device, dtype, quantize)


def load_text_model(name: str, device: str = "cpu", progress=None, decode: bool = True,
                    dtype: str | None = None, quantize: str | None = None, graphs: str = "auto") -> TextModel:
    """`open_text_model` and its `load`, for callers with nothing to check in between (training, benchmarks)."""
    return open_text_model(name, device, progress, dtype, quantize).load(progress, decode, graphs)


def load_original(model: TextModel, device: str = "cpu") -> TextModel:
    """The float32 model `model` was made from (itself when it is float32): the quality reference of benchmarks."""
    if model.precision == "float32":
        return model
    info = model.entry.meta.get("quantized")
    return load_text_model(info["base"] if info else model.entry.ref, device)
