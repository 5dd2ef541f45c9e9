"""Import external weights into the registry: HF folders, GGUF files, safetensors or .pt state dicts."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from specgen import checkpoints, registry
from specgen.builders import BUILDERS, IMAGE_BUILDERS, IMPORTED_FORMS
from specgen.builtins import import_gguf_target
from specgen.errors import CheckpointError, IncompatibleError, UsageError
from specgen.hf_tokenizer import load_tokenizer
from specgen.limits import check_declared_size
from specgen.models.llama import load_hf_folder

STATE_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")


def read_state_file(path: Path) -> dict[str, torch.Tensor]:
    """A flat tensor dict from safetensors, or from a pickle read with weights_only=True (never unpickled)."""
    try:
        if path.suffix == ".safetensors":
            state = load_file(str(path))
        else:
            # training scripts (LlamaGen's among them) save their argparse.Namespace beside the weights: a plain
            # record of options, admitted by name; any other object is still refused by weights_only
            with torch.serialization.safe_globals([argparse.Namespace]):
                state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt file, or a pickle with non-tensor objects refused by weights_only
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()  # torch colours its message
        # torch's own advice there is to unpickle: never repeated; an unknown opcode is bytes that are no pickle
        if "Weights only load failed" in text and "Unsupported operand" not in text:
            found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
            what = f" ({found[1]})" if found else ""
            raise CheckpointError(f"cannot read {path.name} as a state dict: it holds Python objects besides tensors"
                                  f"{what}, and specgen never unpickles; save only the tensors (a state dict, or "
                                  "safetensors) where the file was made") from None
        # the first line, or the weights-only unpickler's own (never torch's advice); a bare KeyError says only '101'
        first = (re.findall(r"Unsupported operand \S+", text) or text.splitlines() or [""])[0][:200]
        what = f"{type(e).__name__}: {first}" if first else type(e).__name__
        raise CheckpointError(f"cannot read {path.name} as a state dict: a corrupt file, or no PyTorch or safetensors "
                              f"checkpoint ({what})") from None
    for wrapper in ("model", "state_dict", "module"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path.name} is not a flat dict of tensors")
    return state


#: builder -> the entry kinds its module can be, the first its usual one (a text GPT is also a text drafter of its
#: own: `hf-assisted`'s draft); another kind is refused (a classifier stored as a target reads as a 'text model')
KINDS_OF = {"transformer": ("target", "draft"), "quantized-transformer": ("target", "draft"), "mesh_gpt": ("target",),
            "llamagen-gpt": ("target",), "eagle": ("draft",), "xspecmesh_heads": ("heads",), "vq": ("vq",),
            "image-classifier": ("classifier",), "mulo-updown": ("upsampler",)}
#: builders of drafters bound to one target (they read its features; each use checks the parent): --parent needed
BOUND = {"eagle": "a drafter", "xspecmesh_heads": "heads"}


def import_checkpoint(source: Path, name: str, kind: str = "target", builder: str | None = None,
                      kwargs_path: Path | None = None, parent: str | None = None, progress=None,
                      vq: str | None = None, force: bool = False) -> registry.Entry:
    """Convert `source` and save it as <kind>/<name>, all checks before anything is written (`registry.check_new`);
    `vq` names the VQ entry an image GPT decodes with (recorded for `generate`; its codebook must fit)."""
    if not source.exists():
        raise UsageError(f"no such file or folder: {source}")
    if source.is_dir() or source.suffix == ".gguf":  # a text target described by its own config: nothing to add
        what = "folder" if source.is_dir() else "GGUF file"
        if kind != "target":
            raise UsageError(f"a {what} imports as a text target, not --kind {kind}")
        given = [flag for flag, value in (("--builder", builder), ("--kwargs", kwargs_path), ("--parent", parent),
                                          ("--vq", vq)) if value is not None]
        if given:  # they were dropped unsaid: the entry would lack what the command line asked for
            raise UsageError(f"{given[0]} is for a raw state dict (.pt, .safetensors); a {what} imports as a text "
                             f"target that its own config describes: leave {given[0]} out")
    registry.check_new(kind, name, force)  # before any conversion: the registry's one write rule
    # an existing entry, installed or built-in
    parent_kind = None if parent is None else registry.pick(checkpoints.list_entries(), parent, "parent checkpoint").kind
    if source.is_dir():
        return import_hf_folder(source, name, force=force)
    if source.suffix == ".gguf":
        import_gguf_target(source, name, progress, created_by="registry import", force=force, builtin=False)
        return checkpoints.find(f"target/{name}")
    if source.suffix not in STATE_SUFFIXES:
        raise UsageError(f"cannot import {source.name}: expected a folder, .gguf, or one of {', '.join(STATE_SUFFIXES)}")
    if not builder or not kwargs_path:
        raise UsageError("a raw state dict needs --builder and --kwargs (a JSON file of builder arguments)")
    if builder not in BUILDERS:
        raise UsageError(f"unknown builder '{builder}'; builders: {', '.join(BUILDERS)}")
    if kind not in KINDS_OF[builder]:
        made = KINDS_OF[builder]
        raise UsageError(f"builder {builder} makes a {' or '.join(made)} entry, not a {kind}: add --kind {made[0]}")
    if builder in BOUND and parent_kind != "target":  # else registered, then refused by every use: no target
        raise UsageError(f"builder {builder} makes {BOUND[builder]} of one target: name it with --parent TARGET"
                         if parent is None else f"--parent {parent} is a {parent_kind} entry; builder {builder} makes "
                         f"{BOUND[builder]} of one target: name a target")
    if vq and builder not in IMAGE_BUILDERS:
        raise UsageError(f"--vq is for image GPTs (builders: {', '.join(IMAGE_BUILDERS)}), not {builder}")
    try:
        kwargs = json.loads(Path(kwargs_path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read builder kwargs {kwargs_path}: {e}") from None
    if not isinstance(kwargs, dict):
        raise UsageError(f"builder kwargs {kwargs_path} must be a JSON object")
    expand, convert = IMPORTED_FORMS.get(builder, (lambda k: k, lambda s, k: s))
    kwargs = expand(kwargs)
    state = convert(read_state_file(source), kwargs)
    declared = checkpoints.declared_params(builder, kwargs) or 0  # before allocating: fits the weights and machine
    check_declared_size(f"builder kwargs {kwargs_path}", declared, sum(t.numel() for t in state.values()),
                        f"the kwargs do not describe these weights ({source.name})", UsageError)
    try:
        module = BUILDERS[builder](**kwargs)
    except (TypeError, ValueError) as e:
        raise UsageError(f"builder kwargs {kwargs_path} do not fit builder {builder}: {e}") from None
    try:
        missing, unexpected = module.load_state_dict(state, strict=False)
    except RuntimeError as e:  # a shape mismatch (wrong config for these weights)
        detail = " ".join(str(e).split())
        raise CheckpointError(f"{source.name} does not fit builder {builder}: {detail[:300]}") from None
    tied = registry.untie(module.state_dict())[1]  # a tied head is stored once, under either of its names
    loaded = {tied.get(k, k) for k in state}
    missing = [k for k in missing if tied.get(k, k) not in loaded]
    if missing or unexpected:
        bad = (missing or unexpected)[0]
        raise CheckpointError(f"{source.name} does not fit builder {builder}: {'missing' if missing else 'unexpected'} key {bad}")
    meta = {"builder": builder, "kwargs": kwargs, "vocab_size": kwargs.get("vocab_size"), "parent": parent,
            "source": str(source), "created_by": "registry import"}
    if builder == "mesh_gpt":  # a mesh backbone: an entry without a modality is a text one to every command; its
        meta.update(modality="mesh", vocab_size=module.vocab_size)  # vocabulary is its decoder's (a nested kwarg)
    if builder in IMAGE_BUILDERS:  # an image GPT: its grid, conditioning, and the VQ it decodes with (checked to fit)
        meta.update(modality="image", grid=module.cfg.rope_grid, conditioning=module.cfg.cond_kind)
    if vq:
        entry = checkpoints.find(vq)
        codes = entry.meta.get("kwargs", {}).get("codebook_size")
        if entry.kind != "vq":
            raise UsageError(f"--vq {vq} is a {entry.kind} entry, not a VQ tokenizer")
        if codes is not None and codes != module.cfg.vocab_size:
            raise IncompatibleError(f"VQ {entry.ref} has {codes} codes but the GPT predicts {module.cfg.vocab_size}")
        meta["vq"] = entry.ref
    return registry.save(kind, name, dict(module.state_dict()), meta, force=force)


def import_hf_folder(folder: Path, name: str, force: bool = False) -> registry.Entry:
    """An HF folder of a supported architecture (`llama.HF_ARCHITECTURES`) with its tokenizer (docs/architectures.md:
    what loads exactly, what is refused), its own context recorded as a GGUF's is (`Loaded.record`)."""
    loaded = load_hf_folder(folder)
    cfg = loaded.cfg
    has_tok = (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()
    if has_tok:
        tok = load_tokenizer(folder)
        if len(tok) > cfg.vocab_size:  # its ids past the embedding would fail at the first forward
            raise IncompatibleError(f"{folder}: its tokenizer has {len(tok)} tokens but the model's vocabulary is "
                                    f"{cfg.vocab_size}; the tokenizer files are not this model's")

    def tokenizer(dest: Path) -> None:
        tok.save_pretrained(str(dest))

    return registry.save("target", name, loaded.state, {
        "builder": "transformer", "kwargs": cfg.to_dict(), "vocab_size": cfg.vocab_size, "modality": "text",
        "tokenizer": has_tok, "source": str(folder), "created_by": "registry import", **loaded.record(),
    }, extra=tokenizer if has_tok else None, force=force)
