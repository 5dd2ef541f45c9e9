"""Checkpoint registry: $SPECGEN_HOME/checkpoints/<kind>/<name>/{config.json, model.safetensors}.

Writes are atomic (a temporary folder renamed into place), weights are safetensors only (nothing is
ever unpickled), and `config.json` carries the builder, its kwargs, the parent target, vocabulary
size, the creating command and metrics. Built-in entries (the embedded defaults) are materialised on
first use (`specgen/builtins.py`). An unknown name is an error that lists near matches.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from specgen.errors import CheckpointError, IncompatibleError, UnknownNameError, UsageError

KINDS = ("target", "draft", "heads", "adapter", "upsampler", "vq", "classifier")
WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def home() -> Path:
    """Registry root: $SPECGEN_HOME, else $XDG_CACHE_HOME/specgen, else ~/.cache/specgen."""
    if os.environ.get("SPECGEN_HOME"):
        return Path(os.environ["SPECGEN_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "specgen"


def checkpoints_dir() -> Path:
    return home() / "checkpoints"


@dataclass(frozen=True)
class Entry:
    """One registry entry (installed or a built-in not yet materialised)."""

    kind: str
    name: str
    path: Path
    meta: dict = field(default_factory=dict)
    builtin: bool = False

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def installed(self) -> bool:
        return (self.path / CONFIG).is_file()


def entry_at(folder: Path) -> Entry:
    """Read the entry stored in `folder` (must hold config.json)."""
    try:
        meta = json.loads((folder / CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"unreadable {CONFIG} in {folder}: {e}") from None
    from specgen.builtins import BUILTINS

    return Entry(meta.get("kind", folder.parent.name), meta.get("name", folder.name), folder, meta,
                 meta.get("name", folder.name) in BUILTINS)


def list_entries(kind: str | None = None) -> list[Entry]:
    """Installed entries plus built-ins (materialised or not), sorted by kind and name."""
    from specgen.builtins import BUILTINS

    found: dict[str, Entry] = {}
    root = checkpoints_dir()
    if root.is_dir():
        for cfg in sorted(root.glob(f"*/*/{CONFIG}")):
            try:
                e = entry_at(cfg.parent)
            except CheckpointError:
                continue
            found[e.ref] = e
    for b in BUILTINS.values():
        ref = f"{b.kind}/{b.name}"
        if ref not in found:
            found[ref] = Entry(b.kind, b.name, checkpoints_dir() / b.kind / b.name, {"description": b.description}, True)
    return [e for _, e in sorted(found.items()) if kind is None or e.kind == kind]


def find(name: str, progress: Callable[[str, int, int], None] | None = None) -> Entry:
    """Resolve a path, `kind/name`, or a bare name; materialise built-ins on first use."""
    from specgen.builtins import BUILTINS

    path = Path(name).expanduser()
    if (path / CONFIG).is_file() and (path / WEIGHTS).is_file():
        return entry_at(path)
    entries = list_entries()
    matches = [e for e in entries if name in (e.ref, e.name)]
    if not matches:
        raise UnknownNameError("checkpoint", name, [e.name for e in entries] + [e.ref for e in entries])
    if len(matches) > 1:
        raise UsageError(f"'{name}' is ambiguous: {', '.join(e.ref for e in matches)}; use kind/name")
    entry = matches[0]
    if not entry.installed:
        if entry.name not in BUILTINS:
            raise CheckpointError(f"{entry.ref} is incomplete on disk; remove it with `specgen registry remove`")
        BUILTINS[entry.name].materialize(progress)
    elif entry.builtin and stale_builtin(entry, BUILTINS[entry.name]):
        BUILTINS[entry.name].materialize(progress)  # the package ships other weights now (upgrade, new recipe run)
    return entry_at(entry.path)


def stale_builtin(entry: Entry, builtin) -> bool:
    """An installed built-in made from shipped files that have changed since (asset_sha differs)."""
    if entry.kind != builtin.kind or not builtin.asset:
        return False
    from specgen.builtins import ASSETS

    if not (ASSETS / builtin.asset).is_dir():
        return False  # not shipped in this build: keep what is installed
    return entry.meta.get("asset_sha") != builtin.fingerprint()


def save(
    kind: str,
    name: str,
    state: dict[str, torch.Tensor],
    meta: dict,
    extra: Callable[[Path], None] | None = None,
    dtype: torch.dtype | None = None,
) -> Entry:
    """Atomically write weights + config.json (and `extra(folder)` files) as <kind>/<name>."""
    from safetensors.torch import save_file

    if kind not in KINDS:
        raise UsageError(f"unknown checkpoint kind '{kind}'; kinds: {', '.join(KINDS)}")
    if not name or "/" in name or name.startswith("."):
        raise UsageError(f"invalid checkpoint name '{name}'")
    final = checkpoints_dir() / kind / name
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=final.parent))
    try:
        state, tied = untie(state)
        tensors = {k: (v.to(dtype) if dtype and v.is_floating_point() else v).contiguous() for k, v in state.items()}
        save_file(tensors, str(tmp / WEIGHTS))
        if extra:
            extra(tmp)
        from specgen import __version__

        meta = {"kind": kind, "name": name, "specgen_version": __version__, **meta, **({"tied": tied} if tied else {})}
        (tmp / CONFIG).write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
        if final.exists():
            old = final.with_name(f".{name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry_at(final)


def untie(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop tensors that alias an earlier one (tied embeddings); return {dropped: kept}."""
    seen: dict[tuple, str] = {}
    kept, tied = {}, {}
    for k, v in state.items():
        key = (v.data_ptr(), v.shape, v.stride()) if v.numel() else (id(v),)
        if key in seen:
            tied[k] = seen[key]
        else:
            seen[key] = k
            kept[k] = v
    return kept, tied


def remove(name: str) -> Entry:
    """Delete an installed entry (a built-in comes back on its next use)."""
    entry = find_installed(name)
    shutil.rmtree(entry.path)
    return entry


def find_installed(name: str) -> Entry:
    entries = [e for e in list_entries() if e.installed and name in (e.ref, e.name)]
    if not entries:
        raise UnknownNameError("installed checkpoint", name, [e.ref for e in list_entries() if e.installed])
    if len(entries) > 1:
        raise UsageError(f"'{name}' is ambiguous: {', '.join(e.ref for e in entries)}; use kind/name")
    return entries[0]


def read_state(entry: Entry) -> dict[str, torch.Tensor]:
    """The entry's weights; corrupt or truncated files are a one-line CheckpointError."""
    from safetensors.torch import load_file

    path = entry.path / WEIGHTS
    if not path.is_file():
        raise CheckpointError(f"{entry.ref} has no {WEIGHTS}")
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises SafetensorError / OSError on corruption
        raise CheckpointError(f"corrupt or truncated weights in {path}: {e}") from None


def load_module(entry: Entry, device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Build the entry's module with its builder and load its weights strictly."""
    from specgen.builders import BUILDERS

    builder = entry.meta.get("builder")
    if builder not in BUILDERS:
        raise CheckpointError(f"{entry.ref}: unknown builder {builder!r}")
    module = BUILDERS[builder](**entry.meta.get("kwargs", {}))
    state = read_state(entry)
    for dropped, kept in entry.meta.get("tied", {}).items():
        state[dropped] = state[kept]
    if getattr(getattr(module, "cfg", None), "tie_embeddings", False) and "output.weight" not in state:
        state["output.weight"] = state["tok_embeddings.weight"]
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = str(e).splitlines()[0] if str(e) else "state dict mismatch"
        raise CheckpointError(f"{entry.ref}: weights do not fit its config ({first})") from None
    return module.to(device=device, dtype=dtype).eval()


_DIGESTS: dict[tuple, str] = {}


def weights_digest(entry: Entry) -> str | None:
    """sha256 (16 hex) over an installed entry's tensors (names, dtypes, shapes, bytes), None without
    a weights file. Hashes tensor content, not file bytes, so a re-saved copy keeps its digest."""
    path = entry.path / WEIGHTS
    if not path.is_file():
        return None
    import hashlib

    from safetensors.torch import load_file

    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        for name, t in sorted(load_file(str(path)).items()):
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        _DIGESTS[key] = h.hexdigest()[:16]
    return _DIGESTS[key]


def check_pair(drafter: Entry, target: Entry) -> None:
    """A drafter/heads/adapter entry must name `target` as its parent and share its vocabulary; when it
    recorded its parent's `parent_digest`, the target's weights must still be those it was trained on."""
    parent = drafter.meta.get("parent")
    if parent not in (target.ref, target.name):
        raise IncompatibleError(f"{drafter.ref} was trained for {parent}, not {target.ref}")
    want = drafter.meta.get("parent_digest")
    if want and weights_digest(target) not in (None, want):
        raise IncompatibleError(f"{drafter.ref} was trained for other weights of {target.ref} (the backbone has "
                                "changed since): retrain it, or restore the backbone it was trained with")
    dv, tv = drafter.meta.get("vocab_size"), target.meta.get("vocab_size")
    if dv is not None and tv is not None and dv != tv:
        raise IncompatibleError(f"vocabulary mismatch: {drafter.ref} has {dv} tokens, {target.ref} has {tv}")
