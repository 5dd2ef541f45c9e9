"""Decoding methods by name: METHODS maps a CLI name to its spec (modality, losslessness, drafter factory)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from specgen.errors import UnknownNameError, UsageError
from specgen.methods.pcllm import JACOBI_OPTIONS, MR_OPTIONS, MultiBlockDrafter
from specgen.methods.text import EmptyDrafter, JacobiDrafter, NgramDrafter
from specgen.methods.xspecmesh import OPTION_NAMES as XSPECMESH_OPTIONS, XSpecMeshOptions


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
        from specgen.methods.option_checks import check_option_values

        check_option_values(self.name, options)


#: Options of the shared batched loop itself, for text methods that draft on it: `budget` = "fixed" (the method's own
#: draft size) or "auto" (capped per number of live rows from the measured cost curve, decoding/budget.py).
LOOP_OPTIONS = ("budget",)

METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in [
        MethodSpec("ar", "text", True, "autoregressive baseline on the same static-cache loop",
                   lambda o: EmptyDrafter(), modalities=("text", "image", "mesh")),
        # Jacobi block sizes default to 4: TPF barely moves with n on these models while a verify of n tokens
        # costs more with n on a CPU (docs/results/text.md, "Verify cost c(n)"); GPU recipes set n themselves.
        MethodSpec("jacobi", "text", True, "Jacobi fixed-point iteration over a block of n tokens",
                   lambda o: JacobiDrafter(block_size=o.get("block_size", 4), seed=o.get("seed", 0)),
                   options=("block_size", *LOOP_OPTIONS)),
        MethodSpec("ngram", "text", True, "prompt-lookup n-gram drafts verified by the target",
                   lambda o: NgramDrafter(num_draft=o.get("num_draft", 4), max_ngram=o.get("max_ngram", 3),
                                          min_ngram=o.get("min_ngram", 2)),
                   options=("num_draft", "max_ngram", "min_ngram", *LOOP_OPTIONS)),
        MethodSpec("cllm", "text", True, "Jacobi decoding of the CLLM-distilled model (consistency-distillation baseline)",
                   lambda o: JacobiDrafter(block_size=o.get("block_size", 16), seed=o.get("seed", 0)),
                   options=(*JACOBI_OPTIONS, *LOOP_OPTIONS), target="smollm2-135m-cllm"),
        MethodSpec("pcllm", "text", True, "Jacobi decoding of the pcLLM-distilled model (progressive consistency distillation)",
                   lambda o: JacobiDrafter(block_size=o.get("block_size", 4), seed=o.get("seed", 0)),
                   options=(*JACOBI_OPTIONS, *LOOP_OPTIONS), target="smollm2-135m-pcllm"),
        MethodSpec("pcllm-mr", "text", True, "pcLLM multi-block decoding + rejection recycling",
                   lambda o: MultiBlockDrafter(**{k: o[k] for k in (*MR_OPTIONS, "seed") if k in o}),
                   options=(*MR_OPTIONS, *LOOP_OPTIONS), target="smollm2-135m-pcllm"),
        MethodSpec("xspecmesh", "mesh", False,
                   "XSpecMesh multi-head speculative decoding (LOSSY: p > delta / top-K_a; lossless: criterion=rejection)",
                   lambda o: XSpecMeshOptions(**{k: v for k, v in o.items() if k != "seed"}), options=XSPECMESH_OPTIONS),
    ]
}


def image_specs() -> list[MethodSpec]:
    """Image methods (built by specgen.image.methods; the drafter factory is not used for them)."""
    from specgen.image.options import IMAGE_METHOD_OPTIONS

    about = {
        "eagle2": (True, "EAGLE-2 dynamic draft trees from a feature drafter, under CFG"),
        "adt-tree": (True, "ADT-Tree: adjacency-adaptive draft-tree depth and width (default image method)"),
        "lantern": (False, "LOSSY: EAGLE-2 trees with LANTERN relaxed acceptance over VQ latent neighbours"),
        "adt-tree+lantern": (False, "LOSSY: ADT-Tree trees with LANTERN relaxed acceptance"),
        "vvs": (False, "LOSSY: VVS partial verification skipping (unverified tokens) on EAGLE-2 + LANTERN"),
        "mulo-sd": (False, "LOSSY: MuLo-SD low-res drafter + up-sampler, pooled-mass threshold, local re-sampling"),
    }
    return [MethodSpec(name, "image", lossless, summary, None, options=IMAGE_METHOD_OPTIONS[name])
            for name, (lossless, summary) in about.items()]


METHODS.update({spec.name: spec for spec in image_specs()})


def get_method(name: str) -> MethodSpec:
    """The spec of a method, or a usage error naming the closest known methods."""
    if name not in METHODS:
        raise UnknownNameError("method", name, list(METHODS))
    return METHODS[name]


def model_for(spec: MethodSpec, model: str, default: str) -> str:
    """The model a method decodes: its distilled target when the user kept the default base model."""
    return spec.target if spec.target != "base" and model == default else model


def run_drafter(target, drafter, prompt: list[int], max_new_tokens: int, params, stop_ids: tuple[int, ...] = (),
                generator=None, **loop_options):
    """The shared decode loop, or the method's own numbered loop when its drafter has one.

    A method whose control flow differs (pcllm-mr, vvs, mulo-sd) returns an object with
    `decode(target, prompt, max_new_tokens, params, stop_ids, generator, max_draft, rule)`, the same
    contract as `decoding.loop.decode` minus the drafter; everything else is a Drafter for the loop.
    """
    if hasattr(drafter, "decode"):
        return drafter.decode(target, prompt, max_new_tokens, params, stop_ids, generator, **loop_options)
    from specgen.decoding.loop import decode

    return decode(target, drafter, prompt, max_new_tokens, params, stop_ids, generator, **loop_options)


def run_batch(target, make_drafter: Callable[[int], Any], prompts: list[list[int]], max_new_tokens: int, params,
              stop_ids: tuple[int, ...] = (), generators=None, batch_size: int = 0, on_done=None, **loop_options):
    """Decode `prompts` together on the shared batched loop (`decoding.loop.decode_batch`); a `BatchResult`.

    A method object with its own step logic (vvs, mulo-sd) runs on that loop through its `batch_policy`
    (a `StepPolicy` of the loop's hooks). Other objects with a loop of their own (`decode` only) are not
    batched: their prompts run one after another, and the batch statistics are the sum of theirs.
    """
    from specgen.decoding.loop import BatchResult, decode_batch
    from specgen.decoding.stats import DecodeStats

    generators = list(generators) if generators is not None else [None] * len(prompts)
    first = make_drafter(0)
    if hasattr(first, "batch_policy"):  # the method's own steps through the shared loop's hooks
        policy = first.batch_policy(lambda i: first if i == 0 else make_drafter(i), target, loop_options.get("rule"))
        return decode_batch(target, policy, prompts, max_new_tokens, params, stop_ids, generators,
                            batch_size=batch_size, on_done=on_done,
                            **{k: v for k, v in loop_options.items() if k not in ("rule", "budget")})
    if not hasattr(first, "decode"):
        drafters = lambda i: first if i == 0 else make_drafter(i)  # noqa: E731
        if hasattr(first, "batch_pool"):  # a drafter that grows every row's draft in one forward per level
            drafters = first.batch_pool(drafters)
        return decode_batch(target, drafters, prompts, max_new_tokens, params, stop_ids, generators,
                            batch_size=batch_size, on_done=on_done, **loop_options)
    results, total, t0 = [], DecodeStats(), time.perf_counter()
    for i, prompt in enumerate(prompts):
        res = run_drafter(target, first if i == 0 else make_drafter(i), prompt, max_new_tokens, params, stop_ids,
                          generators[i], **{k: v for k, v in loop_options.items() if k != "budget"})
        res.stats.extras["latency_s"] = time.perf_counter() - t0  # as the batched loop: queueing included
        results.append(res)
        total.merge(res.stats)
        if on_done:
            on_done(i)
    return BatchResult(results, total)
