"""Checkpoints above the registry store: find an entry (materialising a built-in on first use), list entries, and
build an entry's module with its builder."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from pathlib import Path
from typing import Callable

import torch

from specgen import registry
from specgen.builders import BUILDERS
from specgen.builtins import ASSETS, BUILTINS
from specgen.errors import CheckpointError, UnknownNameError, UsageError
from specgen.limits import check_declared_size as check_size
from specgen.models.layout import decode_layout
from specgen.registry import CONFIG, Entry, entry_at, one_line

Progress = Callable[[str, int, int], None]


def marked(entry: Entry) -> Entry:
    """The entry with `builtin` set when its name is an embedded default's."""
    return dataclasses.replace(entry, builtin=entry.name in BUILTINS)


def list_entries(kind: str | None = None) -> list[Entry]:
    """Installed entries plus built-ins (materialised or not), sorted by kind and name."""
    found = {e.ref: marked(e) for e in registry.installed_entries()}
    for b in BUILTINS.values():
        ref = f"{b.kind}/{b.name}"
        if ref not in found:
            found[ref] = Entry(b.kind, b.name, registry.checkpoints_dir() / b.kind / b.name,
                               {"description": b.description}, True)
    return [e for _, e in sorted(found.items()) if kind is None or e.kind == kind]


def find(name: str, progress: Progress | None = None) -> Entry:
    """Resolve a path, `kind/name`, or a bare name; materialise built-ins on first use (and again when damaged
    or when the package ships other weights)."""
    path = Path(name).expanduser()
    if (path / CONFIG).is_file() and (path / registry.WEIGHTS).is_file():
        return marked(entry_at(path))
    entries = list_entries()
    matches = [e for e in entries if name in (e.ref, e.name)]
    if not matches:
        raise UnknownNameError("checkpoint", name, [e.name for e in entries] + [e.ref for e in entries])
    if len(matches) > 1:
        raise UsageError(f"'{name}' is ambiguous: {', '.join(e.ref for e in matches)}; use kind/name")
    entry = matches[0]
    if entry.corrupt and entry.builtin and BUILTINS[entry.name].kind == entry.kind:
        BUILTINS[entry.name].materialize(progress)  # a damaged built-in is re-created from the package
        return marked(entry_at(entry.path))
    if entry.corrupt:
        raise CheckpointError(f"corrupt entry {entry.ref} ({entry.corrupt}); remove it with `specgen registry remove "
                              f"{entry.ref}` and import it again")
    if not entry.installed:
        if entry.name not in BUILTINS:
            raise CheckpointError(f"{entry.ref} is incomplete on disk; remove it with `specgen registry remove`")
        BUILTINS[entry.name].materialize(progress)
    elif entry.builtin and stale_builtin(entry, BUILTINS[entry.name]):
        BUILTINS[entry.name].materialize(progress)  # the package ships other weights now (upgrade, new recipe run)
    return marked(entry_at(entry.path))


def modality_of(name: str) -> str:
    """The modality of an entry ("text" when its config records none) without materialising a built-in: an
    installed entry's config.json, else the built-in's shipped config, else `find` (which may materialise)."""
    meta = registry.installed_meta(name)
    if meta is None:
        kind, _, bare = name.rpartition("/")
        b = BUILTINS.get(bare)
        if b is not None and kind in ("", b.kind):
            shipped = ASSETS / b.asset / CONFIG if b.asset else None
            meta = json.loads(shipped.read_text()) if shipped is not None and shipped.is_file() else {}
    if meta is None:
        meta = find(name).meta
    return meta.get("modality", "text")


def stale_builtin(entry: Entry, builtin) -> bool:
    """An installed built-in made from shipped files that have changed since (asset_sha differs)."""
    if entry.kind != builtin.kind or not builtin.asset:
        return False
    if not (ASSETS / builtin.asset).is_dir():
        return False  # not shipped in this build: keep what is installed
    return entry.meta.get("asset_sha") != builtin.fingerprint()


def load_module(entry: Entry, device: str = "cpu", dtype: torch.dtype = torch.float32,
                decode: bool = False) -> torch.nn.Module:
    """Build the entry's module with its builder and load its weights strictly; `decode`: straight into the decode
    layout (`decode_layout(loaded=False)`; the caller still runs `decode_layout`)."""
    builder = entry.meta.get("builder")
    if builder not in BUILDERS:
        raise CheckpointError(f"{entry.ref}: unknown builder {builder!r}")
    kwargs = entry.meta.get("kwargs", {})
    check_declared_size(entry, builder, kwargs)
    try:
        with random_fills_skipped():
            module = BUILDERS[builder](**kwargs)
    except (TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"corrupt entry {entry.ref}: its {CONFIG} does not build a {builder} ({one_line(e)}); "
                              f"remove it with `specgen registry remove {entry.ref}` and import it again") from None
    module = module.to(device=device, dtype=dtype)  # before the load: each weight is written once, as it runs
    if decode:
        decode_layout(module, loaded=False)
    try:
        load_state(module, entry)
    except RuntimeError as e:
        first = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), one_line(e))  # what differs
        raise CheckpointError(f"{entry.ref}: weights do not fit its config ({first})") from None
    return module.eval()


RANDOM_FILLS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                "xavier_normal_", "orthogonal_")


@contextlib.contextmanager
def random_fills_skipped():
    """Module construction without torch.nn.init's random fills (seconds for a 135M model at every start): each
    parameter is then overwritten by `load_state`, which refuses a state that misses any. Buffers a module computes
    (RoPE tables) are built as usual."""
    saved = {name: getattr(torch.nn.init, name) for name in RANDOM_FILLS}
    try:
        for name in RANDOM_FILLS:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fill in saved.items():
            setattr(torch.nn.init, name, fill)


def load_state(module: torch.nn.Module, entry: Entry) -> None:
    """Copy the entry's weights into `module` strictly, a part at a time from the memory-mapped file, so the process
    never holds the whole state beside the module (`registry.state_parts`). Keys the entry stores once for several
    (`tied`; an LM head tied to the embedding) are copied to each."""
    stored = set(registry.stored_shapes(entry) or ())
    copies: dict[str, list[str]] = {}
    for dropped, kept in entry.meta.get("tied", {}).items():
        copies.setdefault(kept, []).append(dropped)
    if (getattr(getattr(module, "cfg", None), "tie_embeddings", False) and "output.weight" not in stored
            and "tok_embeddings.weight" in stored):  # quantized targets tie their int8 buffers via "tied"
        copies.setdefault("tok_embeddings.weight", []).append("output.weight")
    missing, unexpected = set(module.state_dict()), []
    for part in registry.state_parts(entry):
        part.update({name: part[key] for key in list(part) for name in copies.get(key, ())})
        unexpected += module.load_state_dict(part, strict=False).unexpected_keys
        missing -= set(part)
    if missing or unexpected:
        raise CheckpointError(f"{entry.ref}: weights do not fit its config (missing {sorted(missing)[:3]}, "
                              f"unexpected {sorted(unexpected)[:3]})")


def check_declared_size(entry: Entry, builder: str, kwargs: dict) -> None:
    """Build the module on the meta device (no memory) and compare its size with the stored weights and this
    machine's memory, so a config.json declaring huge sizes is a one-line error, not an allocation failure."""
    if not isinstance(kwargs, dict):
        raise CheckpointError(f"corrupt entry {entry.ref}: kwargs in its {CONFIG} is not an object")
    try:
        with torch.device("meta"), random_fills_skipped():  # a meta fill imports torch's decompositions: seconds
            module = BUILDERS[builder](**kwargs)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise CheckpointError(f"corrupt entry {entry.ref}: its {CONFIG} does not build a {builder} ({one_line(e)}); "
                              f"remove it with `specgen registry remove {entry.ref}` and import it again") from None
    except Exception:  # noqa: BLE001 - a builder that cannot run on the meta device: checked when built
        return
    declared = sum(p.numel() for p in module.parameters())
    shapes = registry.stored_shapes(entry)
    stored = None if shapes is None else sum(math.prod(s) for s in shapes.values())
    check_size(f"{entry.ref}'s {CONFIG}", declared, stored,
               f"corrupt entry {entry.ref}; repair or remove it (`specgen registry remove {entry.ref}`)")
