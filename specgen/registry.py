"""Checkpoint store: $SPECGEN_HOME/checkpoints/<kind>/<name>/{config.json, model.safetensors}, written atomically."""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import socket
import time
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from specgen import __version__
from specgen.errors import CheckpointError, IncompatibleError, RuntimeFailure, UnknownNameError, UsageError
from specgen.paths import ADVICE, atomic_dir, check_folder, umask

KINDS = ("target", "draft", "heads", "adapter", "upsampler", "vq", "classifier")
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
MAX_NAME = 100
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # no '+': `--model NAME+int8` reads it as a precision suffix
DIGEST = "weights_digest"  # config.json key: the weights' tensors_digest, recorded once by `save`
FILE = "weights_file"  # config.json key: [size, mtime_ns] of the weights file DIGEST was recorded for
STALE_FOREIGN_S = 24 * 3600  # temporaries older than this are removed whoever wrote them (see remove_stale_temporaries)
TRAINED_IN = "trained_in"  # config.json key: the run folder a training command registered the entry from
#: (run folder, resumed) of the training command registering now (`training_run`): its entries record the folder,
#: and that folder resumed replaces them without --force (a run's own outputs, registered at a `max_minutes` stop)
RUN: ContextVar[tuple[str, bool] | None] = ContextVar("specgen_registering_run", default=None)


@contextmanager
def registering_from(folder: Path, resumed: bool) -> Iterator[None]:
    """Saves inside record `folder` as their run folder; with `resumed`, entries it recorded are replaceable."""
    token = RUN.set((str(Path(folder).resolve()), resumed))
    try:
        yield
    finally:
        RUN.reset(token)


def run_record() -> dict[str, str]:
    """What a checkpoint written now records of its run folder (`registering_from`): {TRAINED_IN: folder} or {}."""
    run = RUN.get()
    return {} if run is None else {TRAINED_IN: run[0]}


def own_checkpoint(folder: Path) -> bool:
    """Whether the checkpoint in `folder` (a registry entry's, a ship_dir) was written from the run folder resumed now
    (`registering_from`); an unreadable config.json is nobody's."""
    run = RUN.get()
    if run is None or not run[1]:
        return False
    try:
        return json.loads((folder / CONFIG).read_text()).get(TRAINED_IN) == run[0]
    except (OSError, ValueError, AttributeError):
        return False


def home() -> Path:
    """Registry root: $SPECGEN_HOME, else $XDG_CACHE_HOME/specgen, else ~/.cache/specgen."""
    if os.environ.get("SPECGEN_HOME"):
        return Path(os.environ["SPECGEN_HOME"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specgen"


def checkpoints_dir() -> Path:
    return home() / "checkpoints"


def check_kind(kind: str) -> None:
    """One of KINDS; another is one line naming them."""
    if kind not in KINDS:
        raise UsageError(f"unknown checkpoint kind '{kind}'; kinds: {', '.join(KINDS)}")


def check_name(name: str, what: str = "checkpoint name") -> str:
    """A registry name: letters, digits, '.', '_', '-' (not first), at most MAX_NAME characters. '+' is refused:
    every command that takes a model splits `NAME+int8` into NAME and a precision, so such an entry could never be
    named."""
    if not isinstance(name, str) or not name:
        raise UsageError(f"empty {what}")
    if len(name) > MAX_NAME:
        raise UsageError(f"{what} is {len(name)} characters long; at most {MAX_NAME} are allowed")
    if "+" in name:
        raise UsageError(f"invalid {what} {name!r}: '+' marks a precision suffix (--model NAME+int8), so an entry "
                         "named so could never be loaded; use '-' instead")
    if not NAME_RE.fullmatch(name):
        raise UsageError(f"invalid {what} {name!r}: use letters, digits, '.', '_' and '-' (not first)")
    return name


def installed_entry(name: str) -> Entry | None:
    """An installed entry (a path, kind/name or bare name), nothing materialised; None when absent, ambiguous or
    unreadable."""
    path, (kind, _, bare) = Path(name).expanduser(), name.rpartition("/")
    folders = [path] if (path / CONFIG).is_file() else [checkpoints_dir() / k / bare for k in KINDS
                                                        if bare and kind in ("", k)]
    candidates = [f for f in folders if (f / CONFIG).is_file()]
    if len(candidates) != 1:
        return None
    try:
        return entry_at(candidates[0])
    except CheckpointError:
        return None


def installed_meta(name: str) -> dict | None:
    """config.json of an installed entry (`installed_entry`), or None."""
    entry = installed_entry(name)
    return None if entry is None else entry.meta


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

    @property
    def corrupt(self) -> str:
        """Why an installed entry cannot be used ("" when it can): unreadable config.json or no weights."""
        return self.meta.get("corrupt", "") if self.installed else ""


def entry_at(folder: Path) -> Entry:
    """Read the entry stored in `folder` (must hold config.json)."""
    try:
        meta = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"unreadable {CONFIG} in {folder}: {' '.join(str(e).split())}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"unreadable {CONFIG} in {folder}: not a JSON object")
    return Entry(meta.get("kind", folder.parent.name), meta.get("name", folder.name), folder, meta)


def installed_entries() -> list[Entry]:
    """Entries installed in the store, sorted by kind and name; a damaged one carries why in `meta["corrupt"]`."""
    found: dict[str, Entry] = {}
    for cfg in sorted(checkpoints_dir().glob(f"*/*/{CONFIG}")):  # none when the store is not made yet
        if cfg.parent.name.startswith("."):
            continue  # a temporary of a write in progress (or of a killed writer)
        try:
            e = entry_at(cfg.parent)
            if missing := missing_files(e):
                e = Entry(e.kind, e.name, e.path, {**e.meta, "corrupt": missing})
        except CheckpointError as err:
            e = Entry(cfg.parent.parent.name, cfg.parent.name, cfg.parent, {"corrupt": str(err)})
        found[e.ref] = e
    return [e for _, e in sorted(found.items())]


def missing_files(e: Entry) -> str:
    """What an installed entry lacks ("" when complete): its weights, their bytes (`size_mismatch`), or the tokenizer
    its config promises."""
    path = e.path / WEIGHTS
    if not path.is_file():
        return f"no {WEIGHTS}"
    # the file `save` wrote (its recorded size and mtime) is whole: only another one's header is read
    if e.meta.get(FILE) != file_stat(path) and (damage := size_mismatch(path)):
        return damage
    if e.meta.get("tokenizer") is True and not any((e.path / f).is_file() for f in TOKENIZER_FILES):
        return "its tokenizer files are missing"
    return ""


def size_mismatch(path: Path) -> str:
    """Why a safetensors file is not the size its header declares (8 + header + the data its offsets place), "" when
    it is: a cheap check of every listing (a few KB of header read, no tensor)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if 8 + n > size:
                return f"truncated weights: {size:,} bytes, shorter than their {n:,}-byte header"
            header = json.loads(f.read(n))
        want = 8 + n + max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except Exception as e:  # noqa: BLE001 - any malformed header is the file's damage
        return f"unreadable weights header ({one_line(e)})"
    return "" if size == want else f"{'truncated' if size < want else 'oversized'} weights: {size:,} bytes, " \
                                   f"their header declares {want:,}"


def save(
    kind: str,
    name: str,
    state: dict[str, torch.Tensor],
    meta: dict,
    extra: Callable[[Path], None] | None = None,
    dtype: torch.dtype | None = None,
    force: bool = False,
    builtin: bool = False,
) -> Entry:
    """Atomically write weights + config.json (and `extra(folder)` files) as <kind>/<name> (docs/registry.md).

    Concurrent writers of one name never see each other's halves: with `force` the last one wins, without it the
    first one wins and the others get a one-line UsageError."""
    check_new(kind, name, force, builtin)
    final = checkpoints_dir() / kind / name
    remove_stale_temporaries(final.parent)  # (none while the kind's folder is not made: atomic_dir makes it)

    def fill(tmp: Path) -> None:
        untied, tied = untie(state)
        tensors = {k: (v.to(dtype) if dtype and v.is_floating_point() else v).contiguous() for k, v in untied.items()}
        save_safetensors(tensors, tmp / WEIGHTS)
        if extra:
            extra(tmp)
        # a copied meta's run folder is not this save's; a built-in is installed from its files, whoever rebuilt them
        doc = {"kind": kind, "name": name, "specgen_version": __version__,
               **{k: v for k, v in meta.items() if k != TRAINED_IN}, **({} if builtin else run_record()),
               **({"tied": tied} if tied else {}),
               DIGEST: tensors_digest(tensors), FILE: file_stat(tmp / WEIGHTS)}  # after `meta`: a copied config's
        # digest is not these weights'; the rename into place keeps the file's mtime
        (tmp / CONFIG).write_text(json.dumps(doc, indent=2, sort_keys=True, default=str))
        follow_umask(tmp)

    written: list[Entry] = []

    @contextmanager
    def locked() -> Iterator[None]:  # the swap (old entry renamed onto an empty folder, then removed) under an
        fd = os.open(final.parent, os.O_RDONLY)  # exclusive flock of the kind's folder (no lock file is left behind)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if final.exists() and not force and not own_checkpoint(final):
                raise UsageError(f"{kind}/{name} already exists (another process wrote it meanwhile); "
                                 "choose another name or pass --force to replace it")
            yield
            written.append(entry_at(final))  # under the lock: outside it another writer's swap may move the folder
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    try:  # temporaries .<name>.tmp-<host>-<pid>-<random> and .<name>.old-...: see remove_stale_temporaries
        atomic_dir(final, fill, tag=f"-{socket.gethostname()}-{os.getpid()}-", guard=locked)
    except OSError as e:
        raise RuntimeFailure(f"cannot write {kind}/{name} in {final.parent}: {e.strerror or e}; nothing was "
                             f"registered: {ADVICE.get(e.errno, 'check SPECGEN_HOME')}") from None
    return written[0]


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None,
                     name: Path | None = None) -> None:
    """safetensors' `save_file`, a failed write raised as the OSError it is, naming `name` (default `path`): safetensors
    reports one as a SafetensorError ('... I/O error: No space left on device (os error 28)')."""
    try:
        save_file(tensors, str(path), metadata=metadata)
    except SafetensorError as e:
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1])), str(name or path)) from None


def check_new(kind: str, name: str, force: bool = False, builtin: bool = False) -> None:
    """The one rule of every registry write, checked before any work: a valid kind and name, a writable registry
    home, never a built-in's name (only its materialiser passes `builtin`), an existing entry only with `force`."""
    check_kind(kind)
    check_name(name)
    if not builtin and name in RESERVED:
        raise UsageError(f"'{name}' is a built-in entry and is never replaced; choose another name")
    check_store()
    folder = checkpoints_dir() / kind / name
    if not force and folder.exists() and not own_checkpoint(folder):
        raise UsageError(f"{kind}/{name} already exists; choose another name or pass --force to replace it")


def check_store() -> None:
    """A registry home that is a file, unwritable or full is one line, before any converting."""
    check_folder(checkpoints_dir(), f"SPECGEN_HOME {home()}")


#: Names reserved by the embedded defaults (filled by `specgen.builtins` when it is imported).
RESERVED: set[str] = set()


def follow_umask(folder: Path) -> None:
    """Permissions of a finished temporary folder as if made under the umask (mkdtemp and safetensors make
    0700/0600), so a SPECGEN_HOME shared by a group works."""
    mask = umask()
    for p in [folder, *folder.rglob("*")]:
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


TEMP_RE = re.compile(r"\.(?P<name>.+)\.(?:tmp|old)-(?P<host>[^-]+(?:-[^-]+)*)-(?P<pid>\d+)-[^-]+$")


def remove_stale_temporaries(folder: Path) -> None:
    """Remove hidden temporary folders of writers that are gone: dead on this host, or older than a day (a pid may
    have been reused; another host's writer is not seen)."""
    host, now = socket.gethostname(), time.time()
    for p in folder.glob(".*"):
        m = TEMP_RE.fullmatch(p.name)
        with suppress(OSError):  # one gone meanwhile: its writer finished
            if m and p.is_dir() and (now - p.stat().st_mtime > STALE_FOREIGN_S
                                     or m["host"] == host and not pid_alive(int(m["pid"]))):
                shutil.rmtree(p, ignore_errors=True)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        pass
    return True


def untie(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Drop tensors that alias an earlier one (tied embeddings); return {dropped: kept}."""
    seen: dict[tuple, str] = {}
    tied = {}
    for k, v in state.items():
        first = seen.setdefault((v.data_ptr(), v.shape, v.stride()) if v.numel() else (id(v),), k)
        if first != k:
            tied[k] = first
    return {k: v for k, v in state.items() if k not in tied}, tied


def remove(name: str) -> Entry:
    """Delete an installed entry (a built-in, replaced or not, comes back as shipped on its next use)."""
    entry = pick(installed_entries(), name, "installed checkpoint")  # (a built-in is not materialised for this)
    shutil.rmtree(entry.path)
    return entry


def pick(entries: list[Entry], name: str, what: str) -> Entry:
    """The one of `entries` named `name` (`kind/name` or bare); none or several is a one-line UsageError."""
    matches = [e for e in entries if name in (e.ref, e.name)]
    if not matches:
        raise UnknownNameError(what, name, [e.name for e in entries] + [e.ref for e in entries])
    if len(matches) > 1:
        raise UsageError(f"'{name}' is ambiguous: {', '.join(e.ref for e in matches)}; use kind/name")
    return matches[0]


#: Bytes of a weights file read through one mapping before it is closed (`state_parts`).
MAPPED_BYTES = 16 << 20


def read_state(entry: Entry) -> dict[str, torch.Tensor]:
    """The entry's weights; corrupt or truncated files are a one-line CheckpointError."""
    return {k: v for part in state_parts(entry) for k, v in part.items()}


def stored_shapes(entry: Entry) -> dict[str, list[int]] | None:
    """Each tensor's shape in the entry's weights file, read from its header only (None when unreadable)."""
    try:
        with safe_open(str(entry.path / WEIGHTS), "pt") as f:
            return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception:  # noqa: BLE001 - see above
        return None


def state_parts(entry: Entry) -> Iterator[dict[str, torch.Tensor]]:
    """The entry's weights in parts of about MAPPED_BYTES, the mapping closed after each (unmapping the pages read),
    so a caller copying each part into its module holds one part beside it. Corruption is a one-line CheckpointError."""
    path = entry.path / WEIGHTS
    if not path.is_file():
        raise CheckpointError(f"{entry.ref} has no {WEIGHTS}")
    try:
        with safe_open(str(path), "pt") as f:  # popped from the end: largest first, while the module's own pages
            keys = sorted(f.keys(), key=lambda k: (math.prod(f.get_slice(k).get_shape()), k))  # are untouched
        while keys:
            part: dict[str, torch.Tensor] = {}
            read = 0
            with safe_open(str(path), "pt") as f:
                while keys and read < MAPPED_BYTES:
                    key = keys.pop()
                    part[key] = f.get_tensor(key)
                    read += part[key].numel() * part[key].element_size()
            yield part
    except Exception as e:  # safetensors raises SafetensorError / OSError on corruption
        raise CheckpointError(f"corrupt or truncated weights in {path}: {e}") from None


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


def finite(t: torch.Tensor) -> bool:
    """Whether a floating tensor holds no NaN or infinity, in one reduction (a tenth of `isfinite(t).all()`'s time,
    allocating nothing of its size but for float8, widened first): aminmax propagates NaN, an infinity is an extreme."""
    if not t.numel():  # aminmax has no identity
        return True
    wide = t if t.element_size() > 1 else t.float()  # torch has no float8 aminmax
    return bool(torch.isfinite(torch.stack(torch.aminmax(wide))).all())


def nonfinite(tensors: Mapping[str, torch.Tensor]) -> str | None:
    """The name of the first floating tensor holding NaN or infinity (`finite`), or None."""
    return next((k for k, t in tensors.items() if t.is_floating_point() and not finite(t)), None)


def tensors_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 (16 hex) over tensors' names, dtypes, shapes and bytes in name order: a re-saved copy keeps it."""
    h = hashlib.sha256()
    for name, t in sorted(state.items()):
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():  # the bytes hashed through their buffer: a contiguous CPU tensor is not copied
            h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return h.hexdigest()[:16]


_DIGESTS: dict[tuple, str] = {}


def file_stat(path: Path) -> list[int]:
    """[size, mtime_ns] of a file: a cheap check that it is the file a record was made for."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def weights_digest(entry: Entry, read: bool = True) -> str | None:
    """The `tensors_digest` of an entry's weights: the one `save` recorded in its config while the file is the one it
    was recorded for (same size and mtime: no read), else (weights written since by other means, copied, or saved
    before specgen recorded them) with `read` computed from the file, once per file version; else None."""
    path = entry.path / WEIGHTS
    if not path.is_file():
        return entry.meta.get(DIGEST)
    stat = file_stat(path)
    if entry.meta.get(DIGEST) and entry.meta.get(FILE) == stat:
        return entry.meta[DIGEST]
    if not read:
        return None
    key = (str(path), *stat)
    if key not in _DIGESTS:
        _DIGESTS[key] = tensors_digest(read_state(entry))
    return _DIGESTS[key]


def same_weights(recorded: str | None, now: str | None) -> bool:
    """Two weights digests of one entry agree, or one is unknown (saved before specgen recorded them: not checked)."""
    return not (recorded and now) or recorded == now


def check_pair(drafter: Entry, target: Entry) -> None:
    """A drafter/heads/adapter must name `target` as parent, share its vocabulary and (`parent_digest`) weights."""
    parent = drafter.meta.get("parent")
    if not parent:
        raise IncompatibleError(f"{drafter.ref} is no drafter of {target.ref}: it names no target it was trained for "
                                f"({drafter.meta.get('modality', 'text')} {drafter.kind}, a model of its own)")
    if parent not in (target.ref, target.name):
        raise IncompatibleError(f"{drafter.ref} was trained for {parent}, not {target.ref}")
    want = drafter.meta.get("parent_digest")
    if want and not same_weights(want, weights_digest(target)):  # no digest recorded: the target is not read
        raise IncompatibleError(f"{drafter.ref} was trained for other weights of {target.ref} (the backbone has "
                                "changed since): retrain it, or restore the backbone it was trained with")
    dv, tv = drafter.meta.get("vocab_size"), target.meta.get("vocab_size")
    if dv is not None and tv is not None and dv != tv:
        raise IncompatibleError(f"vocabulary mismatch: {drafter.ref} has {dv} tokens, {target.ref} has {tv}")
