"""Checkpoints above the registry store: find and list entries (built-ins materialised on first use), build modules."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

import torch

from specgen import registry
from specgen.builders import BUILDERS
from specgen.builtins import ASSETS, BUILTINS, Progress, asset_fingerprint, builtin_named
from specgen.errors import CheckpointError, UnknownNameError, UsageError
from specgen.limits import check_declared_size
from specgen.models import layout_cache
from specgen.models.layout import decode_layout
from specgen.models.unfilled import random_fills_skipped
from specgen.registry import CONFIG, Entry, entry_at, one_line


def marked(entry: Entry) -> Entry:
    """The entry with `builtin` set when its name is an embedded default's."""
    return dataclasses.replace(entry, builtin=entry.name in BUILTINS)


def list_entries(kind: str | None = None) -> list[Entry]:
    """Installed entries plus built-ins (materialised or not), sorted by kind and name."""
    if kind is not None:
        registry.check_kind(kind)  # a misspelt kind is refused, not listed as nothing
    found = {f"{b.kind}/{b.name}": Entry(b.kind, b.name, registry.checkpoints_dir() / b.kind / b.name,
                                         {"description": b.description}, True) for b in BUILTINS.values()}
    found.update({e.ref: marked(e) for e in registry.installed_entries()})  # installed ones: as they are
    return [e for _, e in sorted(found.items()) if kind is None or e.kind == kind]


def find(name: str, progress: Progress = None) -> Entry:
    """Resolve a path, `kind/name`, or a bare name; materialise built-ins when missing, damaged or stale."""
    path = Path(name).expanduser()
    if (path / CONFIG).is_file() and (path / registry.WEIGHTS).is_file():
        entry = entry_at(path)
        if not {"builder", "kind"} & set(entry.meta):  # an HF model folder (its own config.json): not read in place
            raise UsageError(f"{name} is not a specgen checkpoint (its {CONFIG} names no kind); an HF model folder "
                             f"is imported first: `specgen registry import {name} --name NAME`, then use NAME")
        return marked(entry)
    try:
        entry = registry.pick(list_entries(), name, "checkpoint")
    except UnknownNameError:
        if name and path.exists():  # a file or folder meant as a checkpoint ("" is no path): why it is none
            raise UsageError(not_a_checkpoint(name, path)) from None
        raise
    shipped = next((b for b in BUILTINS.values() if (b.kind, b.name) == (entry.kind, entry.name)), None)
    if entry.corrupt and shipped is None:
        raise CheckpointError(f"corrupt entry {entry.ref} ({entry.corrupt}); remove it with `specgen registry remove "
                              f"{entry.ref}` and import it again")
    if shipped is not None and unmade(entry, shipped):
        with making():  # processes starting at once on an empty home: the first makes it, the others then find it
            if unmade(next(e for e in list_entries(entry.kind) if e.ref == entry.ref), shipped):
                shipped.materialize(progress)
    return marked(entry_at(entry.path))


def unmade(entry: Entry, shipped) -> bool:
    """Whether built-in `shipped` is to be made: missing, damaged, or the package ships other weights now."""
    return bool(entry.corrupt) or not entry.installed or stale_builtin(entry, shipped)


MAKING: ContextVar[bool] = ContextVar("specgen_making_builtin", default=False)


@contextlib.contextmanager
def making() -> Iterator[None]:
    """An exclusive flock of the checkpoint store while built-ins are made (re-entered by a derived one making its
    base), so one process makes each while the others wait: none replaces an entry another is reading."""
    if MAKING.get():
        yield
        return
    registry.check_store()  # a home that cannot be written: the one line `save` would give
    registry.checkpoints_dir().mkdir(parents=True, exist_ok=True)
    fd, token = os.open(registry.checkpoints_dir(), os.O_RDONLY), MAKING.set(True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        MAKING.reset(token)
        os.close(fd)  # closing the descriptor releases the lock


def find_linked(entry: Entry, name: str, role: str, progress: Progress = None) -> Entry:
    """`find(name)` for a name `entry`'s config gives (its parent, its adapter; `role` says which): a missing one is
    named as `entry`'s, not as an unknown name the user never typed."""
    try:
        return find(name, progress)
    except UnknownNameError:
        raise UsageError(f"{entry.ref} {role} {name!r}, which is not installed (removed?); import or train it again "
                         f"under that name, or remove {entry.ref}") from None


#: what a trainer's input key names -> how such an entry is made (said when the name is unknown)
MADE_BY = {
    "text target": "import one with `specgen registry import FOLDER|GGUF --name NAME`",
    "adapter": "`specgen distill` registers adapter/NAME-lora",
    "image target": "train one with `python -m specgen.train.image_gpt` or import LlamaGen's "
                    "(`specgen registry import ... --builder llamagen-gpt`)",
    "mesh target": "train one with `python -m specgen.train.mesh ... --register NAME`",
    "drafter": "`specgen train-heads --kind eagle` registers draft/NAME",
    "vq": "train one with `python -m specgen.train.vq` or import LlamaGen's (`specgen registry import ... --kind vq`)",
    "upsampler": "`specgen train-upsampler` registers upsampler/NAME",
}


@contextlib.contextmanager
def input_named(key: str, name: str, role: str) -> Iterator[None]:
    """A refusal of the checkpoint recipe key `key` names (`name`, a `role` of MADE_BY) inside is `key=name: ...`;
    an unknown name also says how such an entry is made."""
    try:
        yield
    except UsageError as e:
        how = f"; {MADE_BY[role]}" if isinstance(e, UnknownNameError) else ""
        raise UsageError(f"{key}={name}: {e}{how}") from None


def not_a_checkpoint(name: str, path: Path) -> str:
    """Why an existing path that is no registry name is no checkpoint, and the way on."""
    if (path / "train.log").is_file():  # every trainer's run folder (--out) holds its log
        return (f"{name} is a training run folder, not a checkpoint; use the name the run registered "
                f"(`specgen registry list`)")
    missing = [f for f in (CONFIG, registry.WEIGHTS) if not (path / f).is_file()]
    what = f"a folder without {' and '.join(missing)}" if path.is_dir() else "a file"
    return (f"{name} is {what}, not a checkpoint (a registry name, or a folder holding {CONFIG} and "
            f"{registry.WEIGHTS}); weights from elsewhere are imported first: "
            f"`specgen registry import PATH --name NAME`")


def modality_of(name: str) -> str:
    """The modality of an entry ("text" when its config records none), read without materialising a built-in."""
    meta = registry.installed_meta(name)
    if meta is None:
        if (b := builtin_named(name)) is not None:
            return b.asset.partition("/")[0] or "text"  # specgen/assets/<modality>/...; the GGUF one is text
        meta = find(name).meta
    return meta.get("modality", "text")


def declared_meta(name: str) -> dict:
    """An entry's config as declared, nothing materialised or loaded: the installed one, else a shipped built-in's
    (its config.json under specgen/assets) or what a built-in made on first use declares (`Builtin.declared`); {}
    when none (unknown or ambiguous)."""
    meta = registry.installed_meta(name)
    if meta is not None:
        return meta
    if (b := builtin_named(name)) is None:
        return {}
    shipped = ASSETS / b.asset / CONFIG
    return json.loads(shipped.read_text()) if b.asset and shipped.is_file() else dict(b.declared)


def stale_builtin(entry: Entry, builtin) -> bool:
    """An installed built-in made from shipped files that have changed since (asset_sha differs); one whose files are
    not shipped in this build is kept."""
    shipped = entry.kind == builtin.kind and builtin.asset and (ASSETS / builtin.asset).is_dir()
    return bool(shipped) and entry.meta.get("asset_sha") != asset_fingerprint(builtin.asset)


def load_module(entry: Entry, device: str = "cpu", dtype: torch.dtype = torch.float32,
                decode: bool = False) -> torch.nn.Module:
    """Build the entry's module with its builder and load its weights strictly; `decode`: in its decode layout
    (`models/layout.py`), its weights memory-mapped from the layout cache when it holds them, else loaded (each
    written once, into its decode form) and stored there (`models/layout_cache.py`)."""
    builder = entry.meta.get("builder")
    if builder not in BUILDERS:
        raise CheckpointError(f"{entry.ref}: unknown builder {builder!r}")
    kwargs = entry.meta.get("kwargs", {})
    shapes = registry.stored_shapes(entry)  # huge declared sizes: a one-line error, not an allocation failure
    check_declared_size(f"{entry.ref}'s {CONFIG}", declared_params(builder, kwargs) or 0,
                        None if shapes is None else sum(map(math.prod, shapes.values())),
                        f"corrupt entry {entry.ref}; repair or remove it (`specgen registry remove {entry.ref}`)")
    module = build(entry, builder, kwargs).to(device=device, dtype=dtype)  # before the load: each weight written once
    weights = entry.path / registry.WEIGHTS
    if decode:
        decode_layout(module, loaded=False)
    restored = decode and layout_cache.restore(module, weights)
    if not restored:
        try:
            load_state(module, entry)
        except RuntimeError as e:
            first = next((ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()), one_line(e))  # what differs
            raise CheckpointError(f"{entry.ref}: weights do not fit its config ({first})") from None
    if decode:
        decode_layout(module)  # what needs the loaded weights: int4/int8 kernel copies, a plan timed on them
        if not restored:
            layout_cache.store(module, weights)
    return module.eval()


def build(entry: Entry, builder: str, kwargs: dict) -> torch.nn.Module:
    """The entry's module, not loaded (on the current default device); a config that does not build is one line."""
    try:
        with random_fills_skipped():
            return BUILDERS[builder](**kwargs)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        raise CheckpointError(f"corrupt entry {entry.ref}: its {CONFIG} does not build a {builder} ({one_line(e)}); "
                              f"remove it with `specgen registry remove {entry.ref}` and import it again") from None


def load_state(module: torch.nn.Module, entry: Entry) -> None:
    """Copy the entry's weights into `module` strictly, a part at a time (`registry.state_parts`); keys stored once
    for several (`tied`: an LM head tied to the embedding) are copied to each. Float weights holding NaN or infinity
    are a CheckpointError naming the tensor."""
    stored = set(registry.stored_shapes(entry) or ())
    copies: dict[str, list[str]] = {}
    for dropped, kept in entry.meta.get("tied", {}).items():
        copies.setdefault(kept, []).append(dropped)
    if (getattr(getattr(module, "cfg", None), "tie_embeddings", False) and "output.weight" not in stored
            and "tok_embeddings.weight" in stored):  # quantized targets tie their int8 buffers via "tied"
        copies.setdefault("tok_embeddings.weight", []).append("output.weight")
    held = module.state_dict()
    missing, unexpected = set(held), []
    for part in registry.state_parts(entry):
        read = list(part)  # the file's tensors; the tied copies added next are the same tensors, checked once
        part.update({name: part[key] for key in read for name in copies.get(key, ())})
        # load_state_dict casts silently: integer weights for a float parameter (a damaged header: F16 read as I16,
        # the same size) would load as garbage
        kinds = ((k, t.is_floating_point(), held[k].is_floating_point()) for k, t in part.items() if k in held)
        if bad := next((k for k, stored_float, held_float in kinds if stored_float != held_float), None):
            raise CheckpointError(f"{entry.ref}: weights do not fit its config ({bad} is stored as "
                                  f"{str(part[bad].dtype).removeprefix('torch.')}, the model holds "
                                  f"{str(held[bad].dtype).removeprefix('torch.')}: damaged weights)")
        unexpected += module.load_state_dict(part, strict=False).unexpected_keys
        # NaN or inf weights load, then fail when sampling, naming no checkpoint (greedy decodes garbage). After the
        # copy, which paged the part in: the check reads memory (~0.04 s for SmolLM2's 538 MB on one core). A CPU
        # text decode load reaches here only on a layout-cache miss (once a weights file); the others at every load
        if bad := registry.nonfinite({k: part[k] for k in read}):
            raise CheckpointError(f"{entry.ref}: weights {entry.path / registry.WEIGHTS} hold NaN or infinite values "
                                  f"in {bad}")
        missing -= set(part)
    if missing or unexpected:
        raise CheckpointError(f"{entry.ref}: weights do not fit its config (missing {sorted(missing)[:3]}, "
                              f"unexpected {sorted(unexpected)[:3]})")


def meta_module(builder: str, kwargs: dict) -> torch.nn.Module | None:
    """The builder's module on the meta device, nothing allocated (None: it does not build there; the real build then
    says why)."""
    try:
        with torch.device("meta"), random_fills_skipped():  # a meta fill may import torch._dynamo
            return BUILDERS[builder](**kwargs)
    except Exception:  # noqa: BLE001 - see above
        return None


def declared_params(builder: str, kwargs: dict) -> int | None:
    """Parameters of the builder's module counted on the meta device (`meta_module`; None where it does not build)."""
    module = meta_module(builder, kwargs)
    return None if module is None else sum(p.numel() for p in module.parameters())
