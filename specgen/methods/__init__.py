"""Decoding methods by name: METHODS maps a CLI name to its spec (modality, losslessness, drafter factory)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from specgen.errors import UnknownNameError, UsageError
from specgen.methods.text import EmptyDrafter, JacobiDrafter, NgramDrafter


@dataclass(frozen=True)
class MethodSpec:
    """What a method is and how to build its drafter from the method options dict."""

    name: str
    modality: str  # "text" | "image" | "mesh": the default modality (decides the default model)
    lossless: bool
    summary: str
    make_drafter: Callable[[dict[str, Any]], Any]
    options: tuple[str, ...] = ()  # method option names accepted in `method_options`
    target: str = "base"  # which model it decodes: "base" or a distilled variant's registry name
    modalities: tuple[str, ...] = ()  # every modality it runs on (empty: just `modality`)

    def runs_on(self, modality: str) -> bool:
        return modality in (self.modalities or (self.modality,))

    def check_options(self, options: dict[str, Any]) -> None:
        """Refuse option names this method does not know (a typo must not be ignored)."""
        unknown = sorted(set(options) - set(self.options) - {"seed"})
        if unknown:
            known = ", ".join(self.options) or "none"
            raise UsageError(f"method {self.name} has no option {unknown[0]!r}; its options: {known}")


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in [
        MethodSpec("ar", "text", True, "autoregressive baseline on the same static-cache loop",
                   lambda o: EmptyDrafter(), modalities=("text", "image", "mesh")),
        MethodSpec("jacobi", "text", True, "Jacobi fixed-point iteration over a block of n tokens",
                   lambda o: JacobiDrafter(block_size=o.get("block_size", 8), seed=o.get("seed", 0)),
                   options=("block_size",)),
        MethodSpec("ngram", "text", True, "prompt-lookup n-gram drafts verified by the target",
                   lambda o: NgramDrafter(num_draft=o.get("num_draft", 4), max_ngram=o.get("max_ngram", 3),
                                          min_ngram=o.get("min_ngram", 2)),
                   options=("num_draft", "max_ngram", "min_ngram")),
    ]
}


def get_method(name: str) -> MethodSpec:
    """The spec of a method, or a usage error naming the closest known methods."""
    if name not in METHODS:
        raise UnknownNameError("method", name, list(METHODS))
    return METHODS[name]
