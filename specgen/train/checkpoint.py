"""Files a training run writes, atomic and never pickled: safetensors/JSON, fp16 weights to ship, train state."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from specgen import builtins, registry
from specgen.errors import UsageError
from specgen.paths import atomic_write, atomic_write_text
from specgen.registry import Entry

# A train state file (`state.safetensors`) holds, as tensors:
#   <module>.<key>      the state dict of every module in `modules` ("model", "heads", ...)
#   <optim>.<i>.<key>   the state of parameter i (in its optimiser's param-group order) of every optimiser
#   <extra key>         any further tensors of the trainer (e.g. VQ code hits)
# and its JSON meta (step, history, config, ...) in the safetensors metadata: either packed as one JSON
# string under "meta" or one JSON string per meta key (`packed=False`; the VQ and mesh trainers' layout).


class StaleStateError(UsageError, ValueError):
    """The run folder holds the resume state of another config (or target); the message says which."""


def save_tensors(path: Path, tensors: Mapping[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    atomic_write(path, lambda p: save_file({k: v.contiguous() for k, v in tensors.items()}, str(p),
                                            metadata=metadata))


def write_json(path: Path, doc: Any, sort_keys: bool = True) -> None:
    """Indented JSON with a final newline."""
    atomic_write_text(path, json.dumps(doc, indent=2, sort_keys=sort_keys) + "\n")


def write_entry(folder: Path, state: Mapping[str, torch.Tensor], meta: dict, sort_keys: bool = True) -> None:
    """Registry-layout files in `folder`: model.safetensors + config.json (atomic each)."""
    save_tensors(folder / "model.safetensors", state)
    write_json(folder / "config.json", meta, sort_keys)


def fp16_state(module: torch.nn.Module, untie: bool = False) -> dict[str, torch.Tensor]:
    """Shipping weights: floating tensors in fp16, contiguous; `untie` drops tied aliases (see registry.untie)."""
    state = module.state_dict()
    return half(registry.untie(state)[0] if untie else state)


def half(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Floating tensors of `state` in fp16, every tensor contiguous."""
    return {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in state.items()}


def shipped_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` holding its fp16 shipping weights (back in fp32): what the final metrics measure."""
    shipped = copy.deepcopy(module)
    shipped.load_state_dict({k: v.float() for k, v in fp16_state(module).items()}, strict=True)
    return shipped


def ships_builtin(kind: str, name: str, ship: str) -> bool:
    """A run that rebuilds built-in <kind>/<name>: it writes that built-in's package folder (`ship`)."""
    b = builtins.BUILTINS.get(name)
    return bool(b and ship and b.asset and b.kind == kind
                and Path(ship).resolve() == (builtins.ASSETS / b.asset).resolve())


def check_outputs(outputs: list[tuple[str, str, str]], force: bool = False) -> None:
    """Before training: every (kind, name, ship folder) a run will publish passes the registry's write rule
    (`registry.check_new`), except a built-in rebuilt from the package folder it ships to."""
    for kind, name, ship in outputs:
        if name and not ships_builtin(kind, name, ship):
            try:
                registry.check_new(kind, name, force)
            except UsageError as e:
                raise UsageError(f"{e} (name=NEW)") from None


def publish(kind: str, name: str, ship_dir: str, state: dict[str, torch.Tensor], meta: dict,
            fallback: str, force: bool = False) -> Entry | None:
    """Register fp16 `state` as <kind>/<name> (not when name is "") and, with `ship_dir`, also write it
    there in registry layout (a package asset); returns the registry entry or None. A built-in is never
    written here: a run that ships its package folder re-installs it from there, as any other use would."""
    if ships_builtin(kind, name, ship_dir):
        write_entry(Path(ship_dir), state, {"kind": kind, "name": name, **meta})
        builtins.BUILTINS[name].materialize(None)
        return registry.entry_at(registry.checkpoints_dir() / kind / name)
    entry = registry.save(kind, name, state, meta, dtype=torch.float16, force=force) if name else None
    if ship_dir:
        write_entry(Path(ship_dir), state, {"kind": kind, "name": name or fallback, **meta})
    return entry


def save_train_state(path: Path, modules: Mapping[str, torch.nn.Module], optims: Mapping[str, torch.optim.Optimizer],
                     meta: dict[str, Any], extra: Mapping[str, torch.Tensor] | None = None,
                     packed: bool = True) -> None:
    """Weights of `modules`, optimiser moments of `optims`, `extra` tensors and JSON `meta` in one file."""
    tensors = {f"{name}.{k}": v.detach().clone() for name, m in modules.items() for k, v in m.state_dict().items()}
    for name, opt in optims.items():
        for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
            for k, v in opt.state.get(p, {}).items():
                tensors[f"{name}.{i}.{k}"] = torch.as_tensor(v).detach().clone()
    tensors.update({k: v.detach().clone() for k, v in (extra or {}).items()})
    metadata = {"meta": json.dumps(meta)} if packed else {k: json.dumps(v) for k, v in meta.items()}
    save_tensors(path, tensors, metadata)


def load_train_state(path: Path, modules: Mapping[str, torch.nn.Module], optims: Mapping[str, torch.optim.Optimizer],
                     expect: Mapping[str, Any], loose: tuple[str, ...] = (),
                     extra: Mapping[str, torch.Tensor] | None = None,
                     added: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Restore what `save_train_state` wrote (in place) and return its meta; None when there is no file.

    Every `expect` item must equal the saved meta's (compared as JSON; `loose` names keys of dict values,
    such as budgets, that may change on resume), else StaleStateError, before anything is loaded.
    `added` maps keys of dict values introduced after a state was written to the value they implicitly
    had then (a saved dict without the key is compared as if it held that value).
    """
    if not path.is_file():
        return None
    with safe_open(str(path), "pt") as f:
        raw = f.metadata() or {}
    meta = json.loads(raw["meta"]) if "meta" in raw else {k: json.loads(v) for k, v in raw.items()}
    def strip(v: Any) -> Any:
        return {k: x for k, x in v.items() if k not in loose} if isinstance(v, dict) else v

    def fill(v: Any) -> Any:
        return {**(added or {}), **v} if isinstance(v, dict) else v

    stale = [k for k, v in expect.items() if strip(fill(meta.get(k))) != strip(json.loads(json.dumps(v)))]
    if stale:
        raise StaleStateError(f"{path} was written by a different {' and '.join(stale)}; use a fresh --out")
    tensors = load_file(str(path))
    for name, m in modules.items():
        m.load_state_dict({k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".")}, strict=True)
    for name, opt in optims.items():
        for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
            st = {k[len(f"{name}.{i}."):]: v for k, v in tensors.items() if k.startswith(f"{name}.{i}.")}
            if st:
                opt.state[p] = st
    for k, v in (extra or {}).items():
        v.copy_(tensors[k])
    return meta
