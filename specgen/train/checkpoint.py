"""Files a training run writes, atomic and never pickled: safetensors/JSON and the fp16 weights it ships."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specgen import builtins, registry
from specgen.errors import UsageError
from specgen.paths import atomic_write_text, check_folder
from specgen.registry import Entry
from specgen.tensor_files import save_tensors

#: Settings a rerun on OUT may change where a trainer has no others (the run folder's check and the state's): where
#: the result goes, not what training computes.
RESUME_LOOSE = ("name", "ship_dir")


class StaleStateError(UsageError, ValueError):
    """The run folder holds the resume state of another config (or target); the message says which."""


@dataclass(frozen=True)
class Published:
    """Rank 0's end of a run: its final metrics and what it registered (None when `name` is "")."""

    metrics: dict[str, Any]
    entry: Entry | None

    def row(self, out: Path, **columns: Any) -> dict[str, Any]:
        """A CLI row: ref, `columns`, the metrics without history, path (OUT when nothing was registered)."""
        e = self.entry
        return {"ref": e.ref if e else "-", **columns, "metrics": brief(self.metrics),
                "path": str(e.path if e else out)}


def brief(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """`metrics` without the per-evaluation history (what logs and tables show)."""
    return {k: v for k, v in metrics.items() if k != "history"}


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
    b = shipped_in(ship)
    return bool(b and b.name == name and b.kind == kind)


def shipped_in(ship: str) -> builtins.Builtin | None:
    """The built-in whose package folder `ship` is, if any (each built-in has a folder of its own)."""
    if not ship:
        return None
    where = Path(ship).resolve()
    return next((b for b in builtins.BUILTINS.values() if b.asset and (builtins.ASSETS / b.asset).resolve() == where),
                None)


def check_outputs(outputs: list[tuple[str, str, str]], force: bool = False, rename: str = "name=NEW") -> None:
    """Before training: each (kind, name, ship folder) to publish passes `registry.check_new`, bar rebuilt built-ins,
    and its ship folder can be made and written (`publish` registers first: a late refusal there left a registered
    entry under a failed run) and is no other built-in's package folder; `rename` is how the command names another
    output."""
    for kind, name, ship in outputs:
        rebuilds = ships_builtin(kind, name, ship)
        if ship:  # written after training: a file or unwritable folder there would fail the finished run
            check_folder(Path(ship), "ship_dir")
        if ship and not rebuilds:
            # publish writes the weights and config.json there: in another built-in's folder they would replace the
            # files that built-in is installed from (only the run that rebuilds it, under its name, writes there)
            owner = shipped_in(ship)
            if owner:
                own = rename.replace("NEW", owner.name)
                raise UsageError(f"ship_dir {ship} is the package folder of built-in {owner.kind}/{owner.name}; only "
                                 f"the run that rebuilds it ({own}) writes there: use another ship_dir, or "
                                 "ship_dir= for none")
            # any other folder already holding a checkpoint: replaced only with --force, as a registry entry is
            held = [f for f in (registry.WEIGHTS, registry.CONFIG) if (Path(ship) / f).exists()]
            if held and not force and not registry.own_checkpoint(Path(ship)):  # a resumed run's own: replaced
                raise UsageError(f"ship_dir {ship} already holds {held[0]}; pass --force to replace it, or use "
                                 "another ship_dir (ship_dir= for none)")
        if name and not rebuilds:
            try:
                registry.check_new(kind, name, force)
            except UsageError as e:
                raise UsageError(f"{e} ({rename})") from None


def publish(kind: str, name: str, ship_dir: str, state: dict[str, torch.Tensor], meta: dict,
            fallback: str, force: bool = False) -> Entry | None:
    """Register fp16 `state` as <kind>/<name> (not when name is "") and write it to `ship_dir` (if any); a built-in
    is re-installed from the package folder the run ships to, never written to the registry here."""
    if ships_builtin(kind, name, ship_dir):
        write_entry(Path(ship_dir), state, {"kind": kind, "name": name, **meta})
        builtins.BUILTINS[name].materialize(None)
        return registry.entry_at(registry.checkpoints_dir() / kind / name)
    entry = registry.save(kind, name, state, meta, dtype=torch.float16, force=force) if name else None
    if ship_dir:
        write_entry(Path(ship_dir), state, {"kind": kind, "name": name or fallback, **meta, **registry.run_record()})
    return entry
