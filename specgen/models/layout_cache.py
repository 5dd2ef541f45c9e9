"""Decoded weights on disk (`$SPECGEN_HOME/layouts/`): decode-layout tensors saved once, mapped by later loads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from specgen import registry
from specgen.devices import is_cpu, module_device
from specgen.models import plan_cache
from specgen.models.layout import layout_name
from specgen.models.quantize import quantized_layers
from specgen.models.tiled_weight import TiledWeight
from specgen.native import ops
from specgen.paths import atomic_write, remove_stale_temps

VERSION = 3  # of the stored forms below: a change makes every earlier file a miss (3: files are written only for
# weights `load_state` found finite; an earlier one may hold NaN it never checked)
#: Every tensor's data starts at a multiple of this in the file, so in the page-aligned mapping too: torch's kernels
#: (e.g. `_weight_int8pack_mm`) use aligned vector loads, as on tensors from torch's own 64-byte aligned allocator.
ALIGN = 64
PAD = ".pad"  # the name suffix of the filler entries that keep the next tensor aligned
SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
                      torch.int8: "I8", torch.uint8: "U8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
                      torch.bool: "BOOL"}


def folder() -> Path:
    return registry.home() / "layouts"


def save_aligned(tensors: dict[str, torch.Tensor], path: Path, key: str, source: str = "") -> None:
    """Write `tensors` (contiguous, CPU) as a safetensors file whose every tensor starts at a multiple of `ALIGN`:
    filler `U8` entries (named NAME + `PAD`) close the gaps, spaces pad the header. The bytes go out from the tensors'
    own storage: no second copy of the model is made."""
    header: dict = {"__metadata__": {"key": key, "source": source}}
    offset = 0  # a multiple of ALIGN before each tensor: its gap is -nbytes % ALIGN
    for name, t in tensors.items():
        end = offset + t.numel() * t.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, end]}
        offset = end + -end % ALIGN
        if offset > end:
            header[name + PAD] = {"dtype": "U8", "shape": [offset - end], "data_offsets": [end, offset]}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN)  # the data starts aligned (8: the header's length field)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for t in tensors.values():
            f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            f.write(bytes(-t.numel() * t.element_size() % ALIGN))


def held(module: nn.Module) -> dict[str, torch.Tensor] | None:
    """The module's state, each tensor once (a tie under its first name), or None when it holds something else (or a
    dtype the file format has no name for)."""
    state = module.state_dict(keep_vars=True)
    if not all(isinstance(t, torch.Tensor) and t.dtype in SAFETENSORS_DTYPES for t in state.values()):
        return None
    first = {id(t): name for name, t in reversed(state.items())}  # each tensor's first name
    return {name: t for name, t in state.items() if first[id(t)] == name}


def column_major(t: torch.Tensor) -> bool:
    return t.dim() == 2 and not t.is_contiguous() and t.stride() == (1, t.shape[0])


def on_disk(t: torch.Tensor) -> torch.Tensor:
    """The contiguous tensor the file holds for `t`: a TiledWeight's tiles, a column-major matrix's transpose (its
    storage as it lies), else `t` itself (made contiguous)."""
    if isinstance(t, TiledWeight):
        return t.tiles
    t = t.detach()
    return t.t() if column_major(t) else t.contiguous()


def place(module: nn.Module, weights: Path) -> tuple[dict[str, torch.Tensor], Path, str] | None:
    """(state as `held`, cache file, key) of `module` loaded from `weights` in the current layout; None when it is not
    cached: not on the CPU, or holding more than tensors."""
    state = held(module)
    if state is None or not is_cpu(module_device(module)):
        return None
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in state.values()})
    name = json.dumps([str(weights.resolve()), layout_name(), dtypes])
    st = weights.stat()  # alternate without rewriting: a file each; a changed checkpoint or machine rewrites it
    k = json.dumps([VERSION, ops.QMM_LAYOUT, st.st_size, st.st_mtime_ns, st.st_ino, plan_cache.machine()])
    return state, folder() / f"{hashlib.sha256(name.encode()).hexdigest()[:24]}.safetensors", k


def restore(module: nn.Module, weights: Path) -> bool:
    """Give `module` (built in its decode layout, nothing loaded: `decode_layout(loaded=False)`) the tensors of its
    cache file, memory-mapped; False, changing nothing, when there is no file that fits (the caller loads `weights`
    and calls `store`)."""
    if (found := place(module, weights)) is None:
        return False
    state, path, k = found
    shapes = {name: lin.make_kernel("meta") for name, lin in quantized_layers(module).items()}
    want = {name: on_disk(t) for name, t in state.items()}  # views: nothing copied
    want.update({f"{name}.kernel.{part}": t for name, made in shapes.items() for part, t in made.items()})
    try:
        with safe_open(str(path), "pt") as f:  # tensors backed by a private mapping of the file
            if (f.metadata() or {}).get("key") != k or {n for n in f.keys() if not n.endswith(PAD)} != set(want):
                return False
            stored = {name: f.get_tensor(name) for name in want}
    except (OSError, SafetensorError):  # absent, truncated or not safetensors: rewritten by `store`
        return False
    if any((want[n].shape, want[n].dtype) != (s.shape, s.dtype) or s.data_ptr() % ALIGN
           for n, s in stored.items()):
        return False
    for name, t in state.items():  # `t`, as built for a load, holds its `on_disk` form with no copy
        if isinstance(t, TiledWeight):
            t.tiles = stored[name]
        else:
            t.data = stored[name].t() if column_major(t) else stored[name]
    for name, lin in quantized_layers(module).items():
        lin.use_kernel({part: stored[f"{name}.kernel.{part}"] for part in shapes[name]})
    return True


def store(module: nn.Module, weights: Path) -> None:
    """Write `module`'s decoded tensors (loaded from `weights`) as its cache file; an unwritable folder warns once."""
    if (found := place(module, weights)) is None:
        return
    state, path, k = found
    tensors = {name: on_disk(t) for name, t in state.items()}
    for name, lin in quantized_layers(module).items():
        tensors.update({f"{name}.kernel.{part}": t for part, t in lin.kernel()[3].items()})
    try:
        atomic_write(path, lambda tmp: save_aligned(tensors, tmp, k, str(weights.resolve())))
    except (OSError, SafetensorError) as e:
        plan_cache.warn_unwritable(folder(), getattr(e, "strerror", None) or str(e))
        return
    remove_orphans()


def remove_orphans() -> None:
    """Delete the cache files whose checkpoint is gone (a removed or moved entry): they could never be read again; and
    the temporaries of writers killed mid-write (`atomic_write` removes its own on any exception, not on SIGKILL)."""
    remove_stale_temps(folder(), ".*.safetensors.*.tmp")  # any entry's
    for path in folder().glob("*.safetensors"):
        try:
            with safe_open(str(path), "pt") as f:
                source = (f.metadata() or {}).get("source", "")
        except (OSError, SafetensorError):
            continue  # another writer's file in progress, or damaged: `restore` rewrites it when it is next needed
        if source and not Path(source).exists():
            path.unlink(missing_ok=True)
