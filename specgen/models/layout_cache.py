"""Decoded weights on disk (`$SPECGEN_HOME/layouts/`): a model's tensors in their decode layout (tiles, column-major
matrices) saved once as safetensors and memory-mapped by later loads, so a start re-packs nothing and its weights are
the file's pages (copy-on-write, shared with other processes through the page cache) rather than fresh copies.

Keyed by the checkpoint file (path, size, mtime, inode), the layout, the kernel plan, this CPU and this torch: any
change and the file is rewritten. A file that does not open, or whose tensors do not fit the module, is ignored and
rewritten; a folder that cannot be written warns once and the model loads as if there were no cache."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from specgen import registry
from specgen.devices import is_cpu, module_device
from specgen.models import plan_cache
from specgen.models.layout import layout_name
from specgen.models.packed_linear import PackedLinear
from specgen.models.tiled_weight import TiledWeight
from specgen.paths import atomic_write

VERSION = 1  # of the stored forms below: a change makes every earlier file a miss


def folder() -> Path:
    return registry.home() / "layouts"


def held(module: nn.Module) -> dict[str, torch.Tensor] | None:
    """The module's state, each tensor once (a tie under its first name), or None when it holds something else."""
    state, seen = {}, set()
    for name, t in module.state_dict(keep_vars=True).items():
        if not isinstance(t, torch.Tensor):
            return None
        if id(t) not in seen:
            seen.add(id(t))
            state[name] = t
    return state


def column_major(t: torch.Tensor) -> bool:
    return t.dim() == 2 and not t.is_contiguous() and t.stride() == (1, t.shape[0])


def on_disk(t: torch.Tensor) -> torch.Tensor:
    """The contiguous tensor the file holds for `t`: a TiledWeight's tiles, a column-major matrix's transpose (its
    storage as it lies), else `t` itself (made contiguous)."""
    if isinstance(t, TiledWeight):
        return t.tiles
    t = t.detach()
    return t.t() if column_major(t) else t.contiguous()


def put(t: torch.Tensor, stored: torch.Tensor) -> None:
    """Make `t`, as built for a load, hold `stored` (its `on_disk` form) with no copy."""
    if isinstance(t, TiledWeight):
        t.tiles = stored
    else:
        t.data = stored.t() if column_major(t) else stored


def plan_of(module: nn.Module) -> str | None:
    """The kernel plan its PackedLinears share ('' without any), None while it still needs timing."""
    choice = next((lin._choice for lin in module.modules() if isinstance(lin, PackedLinear)), None)
    if choice is None:
        return ""
    return repr(choice.plan()) if choice.known() else None


def place(module: nn.Module, weights: Path, state: dict[str, torch.Tensor]) -> tuple[Path, str] | None:
    """(cache file, key) of `module` loaded from `weights` in the current layout; None when it is not cached: not on
    the CPU, or its plan still to be measured (a first load measures it, then stores)."""
    plan = plan_of(module)
    if plan is None or not is_cpu(module_device(module)):
        return None
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in state.values()})
    name = json.dumps([str(weights.resolve()), layout_name(), dtypes])  # one file per checkpoint, layout and dtypes
    st = weights.stat()
    k = json.dumps([VERSION, st.st_size, st.st_mtime_ns, st.st_ino, plan, plan_cache.machine()])
    return folder() / f"{hashlib.sha256(name.encode()).hexdigest()[:24]}.safetensors", k


def restore(module: nn.Module, weights: Path) -> bool:
    """Give `module` (built in its decode layout, nothing loaded: `decode_layout(loaded=False)`) the tensors of its
    cache file, memory-mapped; False, changing nothing, when there is no file that fits (the caller loads `weights`
    and calls `store`)."""
    state = held(module)
    where = None if state is None else place(module, weights, state)
    if where is None:
        return False
    try:
        with safe_open(str(where[0]), "pt") as f:  # tensors backed by a private mapping of the file
            if (f.metadata() or {}).get("key") != where[1] or set(f.keys()) != set(state):
                return False
            stored = {name: f.get_tensor(name) for name in state}
    except (OSError, SafetensorError):  # absent, truncated or not safetensors: rewritten by `store`
        return False
    want = {name: on_disk(t) for name, t in state.items()}  # views of the empty tensors built: nothing copied
    if any((want[n].shape, want[n].dtype) != (s.shape, s.dtype) for n, s in stored.items()):
        return False
    for name, t in state.items():
        put(t, stored[name])
    return True


def store(module: nn.Module, weights: Path) -> None:
    """Write `module`'s decoded tensors (loaded from `weights`) as its cache file; a folder that cannot take it warns
    once and nothing is cached."""
    state = held(module)
    where = None if state is None else place(module, weights, state)
    if where is None:
        return
    tensors = {name: on_disk(t) for name, t in state.items()}
    try:
        atomic_write(where[0], lambda tmp: save_file(tensors, str(tmp), {"key": where[1]}))
    except (OSError, SafetensorError) as e:
        plan_cache.warn_unwritable(folder(), getattr(e, "strerror", None) or str(e))
