"""Precision of a target: dtype/quantize options, `NAME+int8` suffixes, quantized entries, in-memory quantization."""

from __future__ import annotations

import torch

from specgen import checkpoints, registry
from specgen.devices import DTYPES, device_name, is_cpu, resolve_dtype  # DTYPES: one table for every modality
from specgen.errors import IncompatibleError, UsageError
from specgen.models.quantize import DEFAULT_GROUP, VERSION, quantize_model
from specgen.models.tokenizer import copy_tokenizer

QUANTIZE = ("int8", "int4")
SUFFIXES = {"f32": ("dtype", "float32"), "float32": ("dtype", "float32"), "bf16": ("dtype", "bfloat16"),
            "bfloat16": ("dtype", "bfloat16"), "f16": ("dtype", "float16"), "float16": ("dtype", "float16"),
            "int8": ("quantize", "int8"), "int4": ("quantize", "int4")}


def split_name(name: str) -> tuple[str, str | None, str | None]:
    """`smollm2-135m+int8` -> ("smollm2-135m", None, "int8"); `NAME+bf16` -> (NAME, "bfloat16", None)."""
    base, *tags = name.split("+")
    found: dict[str, str] = {}
    for tag in tags:
        if tag.lower() not in SUFFIXES:
            raise UsageError(f"unknown precision suffix '+{tag}' in '{name}'; use one of "
                             f"{', '.join('+' + s for s in SUFFIXES)}")
        key, value = SUFFIXES[tag.lower()]
        if found.get(key, value) != value:
            raise UsageError(f"'{name}' names two {key}s")
        found[key] = value
    return base, found.get("dtype"), found.get("quantize")


def resolve(name: str, dtype: str | None, quantize: str | None) -> tuple[str, str, str | None]:
    """(registry name, dtype, quantize) from a name with optional suffix and explicit options (which must agree);
    dtype defaults to float32, bfloat16 when quantized (other activations there: refused, docs/precision.md)."""
    base, sdtype, squant = split_name(name)
    if quantize in ("", "none", "None"):
        quantize = None
    for key, given, named in (("dtype", dtype, sdtype), ("quantize", quantize, squant)):
        if given and named and given != named:
            raise UsageError(f"--{key} {given} contradicts the model name '{name}'")
    dtype, quantize = dtype or sdtype, quantize or squant
    if quantize is not None and quantize not in QUANTIZE:
        raise UsageError(f"--quantize must be one of {', '.join(QUANTIZE)} (or none), got {quantize!r}")
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if quantize and dtype not in (None, "bfloat16"):  # float16 too: the quantized kernels take bfloat16 only
        raise UsageError(f"--quantize {quantize} runs bfloat16 activations (the kernels' dtype); drop --dtype {dtype}")
    return base, dtype or ("bfloat16" if quantize else "float32"), quantize


def load_precision(dtype: str | None, quantize: str | None, device: str
                   ) -> tuple[str, str | None, str | None, torch.dtype]:
    """(device with `auto` resolved, dtype name, quantize, torch dtype) of an image or mesh GPT loaded on `device`;
    `dtype` may name a quantization (a benchmark row's precision, `dtypes: {ar@int8: int8}`), which runs bfloat16
    activations on the CPU."""
    device = device_name(device)
    if dtype in QUANTIZE:
        dtype, quantize = None, dtype
    if quantize:
        check_cpu(quantize, device)
        dtype = resolve("", dtype, quantize)[1]
    return device, dtype or "float32", quantize or None, resolve_dtype(dtype, device, quantize)


def check_cpu(quantize: str | None, device: str) -> None:
    """A quantized model runs on the CPU (torch's int8/int4 pack matmuls): another device is one line."""
    if quantize and not is_cpu(device):
        raise UsageError(f"--quantize {quantize} uses CPU kernels (torch's int8/int4 pack matmuls); use --device cpu, "
                         f"or --dtype bfloat16 on {device}")


def check_row_precision(row: str, precision: str, device: str) -> None:
    """A benchmark row's precision (row "" = the run's own `dtype`): a float dtype this device runs, or int8/int4 for
    a row on the cpu (the run's own model is the float one quality is measured under)."""
    if row and precision not in (*DTYPES, *QUANTIZE):  # resolve_dtype's message names --dtype and no int8/int4
        raise UsageError(f"dtypes.{row} must be one of {', '.join((*DTYPES, *QUANTIZE))}, got {precision!r}")
    if precision not in QUANTIZE:
        resolve_dtype(precision, device)
    elif not row or not is_cpu(device):
        raise UsageError(f"{'dtypes.' + row if row else 'dtype'}: {precision} is a per-row precision on the cpu "
                         "(the model `dtype` runs is the float one the quality columns are measured under)")


def quantized_entry(base: registry.Entry, quantize: str, progress=None) -> registry.Entry:
    """The stored quantized entry of `base` (target/<base>-int8, ...), made on first use (from the float32 weights,
    read once) and remade when the base weights or the quantizers (VERSION) changed since."""
    group = DEFAULT_GROUP if quantize == "int4" else 0
    name = f"{base.name}-{quantize}" + (f"-g{group}" if group else "")
    folder = registry.checkpoints_dir() / "target" / name
    if (folder / registry.CONFIG).is_file():
        entry = registry.entry_at(folder)
        info = entry.meta.get("quantized") or {}
        if info.get("base") != base.ref:
            raise IncompatibleError(f"{entry.ref} is not a quantized copy of {base.ref} (it was made from "
                                    f"{info.get('base', 'no recorded base')}); remove it or rename {base.ref}")
        if base_unchanged(info, base) and info.get("version", 1) == VERSION:
            return entry
    if progress:
        progress(f"quantizing {base.ref} to {quantize}", 0, 1)
    module = checkpoints.load_module(base, "cpu")
    try:
        quantize_model(module, quantize, group)
    except ValueError as e:
        raise IncompatibleError(f"{base.ref} cannot be quantized: {e}") from None
    meta = {k: v for k, v in base.meta.items() if k not in ("kind", "name", "tied", "builtin", "asset_sha")}
    meta.update(builder="quantized-transformer", kwargs={**base.meta.get("kwargs", {}), "quantize": quantize,
                                                         "group": group},
                description=f"{base.ref} with {quantize} weights (derived; specgen/models/quantize.py)",
                quantized={"mode": quantize, "group": group, "base": base.ref, "version": VERSION,
                           "base_digest": registry.weights_digest(base),
                           "base_file": registry.file_stat(base.path / registry.WEIGHTS)})
    entry = registry.save("target", name, module.state_dict(), meta,
                          lambda folder: copy_tokenizer(base.path, folder), force=True)  # a derived cache
    if progress:
        progress(f"quantizing {base.ref} to {quantize}", 1, 1)
    return entry


def base_unchanged(info: dict, base: registry.Entry) -> bool:
    """The base still holds the weights the quantized copy was made from: the same file (size and mtime, no read),
    else the same tensor digest (a copy recording neither, made by an older specgen, is remade or refused)."""
    now = registry.file_stat(base.path / registry.WEIGHTS)
    return info.get("base_file") == now or info.get("base_digest") == registry.weights_digest(base)


def check_quantized_entry(entry: registry.Entry, quantize: str | None, progress=None) -> registry.Entry:
    """The base of a stored quantized entry named directly, which must hold the mode asked for and its base's weights."""
    info = entry.meta["quantized"]
    if quantize and quantize != info.get("mode"):
        raise IncompatibleError(f"{entry.ref} holds {info.get('mode')} weights, not {quantize}")
    base = checkpoints.find(info.get("base", ""), progress)
    if not base_unchanged(info, base):
        raise IncompatibleError(f"{entry.ref} was quantized from other weights of {base.ref} (changed since); "
                                f"remove it and load {base.name} with --quantize {info.get('mode')}")
    return base


def in_memory(module: torch.nn.Module, dtype: str, quantize: str | None) -> torch.nn.Module:
    """`module` (float32) at the given precision, stored nowhere (merged adapters, image and mesh GPTs)."""
    if quantize:
        try:
            return quantize_model(module, quantize, DEFAULT_GROUP)
        except ValueError as e:
            raise IncompatibleError(f"cannot quantize this model: {e}") from None
    return module.to(DTYPES[dtype])
