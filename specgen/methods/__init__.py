"""Decoding methods by name: METHODS, one entry per method (modalities, losslessness, options class, factory)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

from specgen.decoding.budget import FixedBudget
from specgen.decoding.draft_verify import judge
from specgen.decoding.loop import decode_batch
from specgen.decoding.stops import Stops
from specgen.errors import UnknownNameError, UsageError
from specgen.methods import ngram_cache
from specgen.methods import options as O
from specgen.methods.pcllm import MultiBlockDrafter
from specgen.methods.text import EmptyDrafter, JacobiDrafter, NgramDrafter
from specgen.models.tokenizer import tokenizer_hash


@dataclass(frozen=True)
class MethodSpec:
    """One method: what it is, its options class and how to build it."""

    name: str
    modality: str  # "text" | "image" | "mesh": the default modality (decides the default model)
    lossless: bool
    summary: str
    options_type: type  # frozen dataclass of the method options (`method_options.*`)
    drafter: Callable[[Any, int], Any] | None = None  # (options of `parse_options`, seed) -> text drafter
    target: str = "base"  # which model it decodes: "base" or a distilled variant's registry name
    modalities: tuple[str, ...] = ()  # every modality it runs on (empty: just `modality`)
    model_check: Callable[[Any, Any], None] | None = None  # (options, target's text tokenizer): assets fit the model

    @property
    def options(self) -> tuple[str, ...]:
        """Method option names accepted in `method_options` (besides `seed`)."""
        return tuple(f.name for f in fields(self.options_type))

    def runs_on(self, modality: str) -> bool:
        return modality in (self.modalities or (self.modality,))

    def parse_options(self, options: dict[str, Any], gpu: bool = False) -> Any:
        """The options as a validated `options_type` (`seed`, unless a field, is the caller's), on a GPU (`gpu`) with
        its GPU defaults (`options.gpu_defaults`) where not given; an unknown name or a bad value is one usage error."""
        unknown = sorted(set(options) - set(self.options) - {"seed"})
        if unknown:
            known = ", ".join(dict.fromkeys([*self.options, "seed"]))  # every method takes `seed`
            raise UsageError(f"method {self.name} has no option {unknown[0]!r}; its options: {known}")
        O.check_value("seed", options.get("seed", 0), O.SEED, self.name)
        given = {k: v for k, v in options.items() if k in self.options}
        opts = self.options_type(**(O.gpu_defaults(self.options_type) if gpu else {}) | given)
        opts.validate(self.name)
        return opts


def ngram_cache_fits(o: O.NgramOptions, tokenizer: Any) -> None:
    """A static n-gram cache must come from the target's tokenizer (its ids would mean other tokens); the
    tokenizer's hash (~60 ms over SmolLM2's vocabulary) is only computed when there is a cache to check."""
    if o.cache:
        ngram_cache.check_tokenizer(o.cache, tokenizer_hash(tokenizer))


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in [
        MethodSpec("ar", "text", True, "autoregressive baseline on the same static-cache loop", O.ArOptions,
                   drafter=lambda o, seed: EmptyDrafter(o.run_ahead), modalities=("text", "image", "mesh")),
        MethodSpec("jacobi", "text", True, "Jacobi fixed-point iteration over a block of n tokens",
                   O.JacobiOptions, JacobiDrafter),
        MethodSpec("ngram", "text", True, "prompt-lookup n-gram drafts verified by the target (and a static n-gram "
                   "cache: option cache)", O.NgramOptions, model_check=ngram_cache_fits,
                   drafter=lambda o, seed: NgramDrafter(o, ngram_cache.load(o.cache) if o.cache else None)),
        MethodSpec("cllm", "text", True, "Jacobi decoding of the CLLM-distilled model (consistency-distillation baseline)",
                   O.CllmOptions, JacobiDrafter, target="smollm2-135m-cllm"),
        MethodSpec("pcllm", "text", True, "Jacobi decoding of the pcLLM-distilled model (progressive consistency distillation)",
                   O.JacobiOptions, JacobiDrafter, target="smollm2-135m-pcllm"),
        MethodSpec("pcllm-mr", "text", True, "pcLLM multi-block decoding + rejection recycling",
                   O.MultiBlockOptions, MultiBlockDrafter, target="smollm2-135m-pcllm"),
        MethodSpec("xspecmesh", "mesh", False,
                   "XSpecMesh multi-head speculative decoding (LOSSY: p > delta / top-K_a; lossless: criterion=rejection)",
                   O.XSpecMeshOptions),
        MethodSpec("eagle2", "image", True, "EAGLE-2 dynamic draft trees from a feature drafter, under CFG",
                   O.TreeOptions),
        MethodSpec("adt-tree", "image", True,
                   "ADT-Tree: adjacency-adaptive draft-tree depth and width (default image method)",
                   O.AdtOptions),
        MethodSpec("lantern", "image", False,
                   "LOSSY: EAGLE-2 trees with LANTERN relaxed acceptance over VQ latent neighbours",
                   O.LanternTreeOptions),
        MethodSpec("adt-tree+lantern", "image", False, "LOSSY: ADT-Tree trees with LANTERN relaxed acceptance",
                   O.AdtLanternOptions),
        MethodSpec("vvs", "image", False,
                   "LOSSY: VVS partial verification skipping (unverified tokens) on EAGLE-2 + LANTERN",
                   O.VvsOptions),
        MethodSpec("mulo-sd", "image", False,
                   "LOSSY: MuLo-SD low-res drafter + up-sampler, pooled-mass threshold, local re-sampling",
                   O.MuloOptions),
    ]
}


def get_method(name: str, known: list[str] | None = None) -> MethodSpec:
    """The spec of a method, or a usage error naming the closest of `known` (default: every method)."""
    if name not in METHODS:
        raise UnknownNameError("method", name, list(METHODS) if known is None else known)
    return METHODS[name]


def model_for(spec: MethodSpec, model: str, default: str) -> str:
    """The model a method decodes: its distilled target when the user kept the default base model, however spelled
    (`target/NAME`; `NAME+int8`: the target at that precision)."""
    base = model.split("+")[0]
    if spec.target == "base" or base not in (default, f"target/{default}"):
        return model
    return spec.target + model[len(base):]


def run_batch(target, make_drafter: Callable[[int], Any], prompts: list[list[int]], max_new_tokens: int, params,
              stops: Stops | tuple[int, ...] = (), generators=None, batch_size: int = 0, on_done=None, rule=None,
              budget=None, max_draft: int = 256, on_tokens=None):
    """`decode_batch` of `prompts` under the step policy of prompt 0's drafter (`make_drafter(i)`: prompt i's)."""
    first = make_drafter(0)
    policy = first.step_policy(lambda i: first if i == 0 else make_drafter(i), target, rule or judge,
                          budget or FixedBudget(max_draft))
    return decode_batch(target, policy, prompts, max_new_tokens, params, stops, generators, batch_size=batch_size,
                        max_draft=max_draft, on_done=on_done, on_tokens=on_tokens)
