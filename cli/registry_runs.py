"""`specgen registry`'s torch-side work: listing with the built-ins' state, materialising, importing, merging."""

from __future__ import annotations

from pathlib import Path

from cli import _output
from specgen import builtins, checkpoints, registry
from specgen.errors import CheckpointError, UnknownNameError, UsageError
from specgen.importer import import_checkpoint  # noqa: F401 - `specgen registry import` calls it here
from specgen.models.lora import merge_scale
from specgen.registry import Entry
from specgen.text.merge import adapter_source, register_merged  # also registers the distilled built-ins' maker


def listing(kind: str | None) -> tuple[Path, list[dict]]:
    """(the registry's home, one row per entry of `kind`, installed or built-in, with its status)."""
    return registry.home(), [{"ref": e.ref, "kind": e.kind, "name": e.name, "installed": e.installed, "builtin": e.builtin,
             "parent": e.meta.get("parent"), "path": str(e.path), "status": status(e)}
            for e in checkpoints.list_entries(kind)]


def status(e: Entry) -> str:
    """ok, or why an entry is corrupt, not the shipped built-in or a built-in this build cannot make, and what to do."""
    if not e.corrupt and e.installed and e.builtin and checkpoints.stale_builtin(e, builtins.BUILTINS[e.name]):
        return f"not the shipped weights; `specgen registry remove {e.ref}` restores them"
    if not e.installed and e.builtin and (why := builtins.BUILTINS[e.name].unavailable()):
        return f"cannot be made here: {why}"
    if not e.corrupt:
        return "ok"
    fix = "re-created on next use" if e.builtin else f"remove with `specgen registry remove {e.ref}` and import again"
    return f"corrupt ({e.corrupt}); {fix}"


def shown(name: str) -> Entry:
    """The entry `registry show` prints: `find`'s, or a corrupt installed entry as it is (its config with why it is
    corrupt: the config names the source to import again), which `find` refuses to use."""
    try:
        return checkpoints.find(name, _output.registry_progress())
    except CheckpointError:
        entry = registry.pick(checkpoints.list_entries(), name, "checkpoint")
        if not entry.corrupt:
            raise
        return entry


def remove(name: str) -> Entry:
    """`registry.remove`; a built-in that is not installed is named so (nothing to remove), where the store's refusal
    called it unknown and offered other entries to remove."""
    try:
        return registry.remove(name)
    except UnknownNameError:
        builtin = [e for e in checkpoints.list_entries() if name in (e.ref, e.name)]  # installed ones were matched
        if len(builtin) != 1:
            raise
        raise UsageError(f"{builtin[0].ref} is a built-in that is not installed in {registry.home()}: nothing to "
                         "remove (it is installed from the package on first use)") from None


def merge(source: str, name: str, scale: float | None, force: bool, quiet: bool) -> str:
    registry.check_new("target", name, force)
    merge_scale({}, scale)  # a bad --scale is refused before the adapter loads (None: the adapter's own, checked then)
    adapter, state = adapter_source(source, _output.registry_progress(quiet))
    return register_merged(adapter, state, name, scale, {"created_by": "registry merge"},
                           _output.registry_progress(quiet), force=force).ref
