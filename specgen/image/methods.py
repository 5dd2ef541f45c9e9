"""Image method builders: each returns (drafter, accept rule) for the shared decode loop.

`specgen.methods.METHODS` names each image method's builder here (`MethodSpec.build_image`) and its options class
(names, defaults, checks: `specgen.methods.options`); `build_image_method` fills in those defaults.

vvs and mulo-sd keep their own step logic as a step policy of the shared batched loop (`decoding/pool.py`:
`plan` says per row what to feed or emit without a forward, `settle` judges it); their one-row `decode` loops
remain only as the reference the tests compare them with.

| method            | tree shape                          | acceptance                       |
|-------------------|-------------------------------------|----------------------------------|
| ar                | none                                | lossless                         |
| eagle2            | EAGLE-2 dynamic tree (depth, top_k, total_tokens fixed) | lossless     |
| adt-tree          | ADT-Tree adaptive (depth, top_k) per tree               | lossless     |
| lantern           | EAGLE-2                             | LANTERN relaxed (LOSSY)          |
| adt-tree+lantern  | ADT-Tree                            | LANTERN relaxed (LOSSY)          |
| vvs               | EAGLE-2, some verifications skipped | LANTERN relaxed + unverified tokens (LOSSY) |
| mulo-sd           | low-res rows, up-sampled            | pooled mass >= tau, local re-sampling (LOSSY) |
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Callable

import torch

from specgen.decoding.accept_relaxed import accept_lantern
from specgen.errors import UsageError
from specgen.methods import METHODS, get_method
from specgen.methods.adt_tree import AdtParams, AdtPolicy
from specgen.methods.eagle import EagleTreeDrafter, FixedShape, TreeShape
from specgen.methods.options import defaults
from specgen.methods.text import EmptyDrafter

# A builder called without the table's defaults (tests) falls back to EAGLE-2/LANTERN for LlamaGen (depth 4,
# top_k 10, total_token 59 + root; `AdtParams`' paper defaults); LANTERN delta 0.1 and k = 1000 of 16,384 codes
# scaled to the codebook (lantern_k 0).


@dataclass
class ImageParts:
    """What a method builder needs: the loaded target, its CFG adapter, drafter net, codebook and grid."""

    model: torch.nn.Module
    target: Any  # CFGTarget (c2i) or CaptionCFGTarget (t2i)
    drafter_net: torch.nn.Module | None
    codebook: torch.Tensor | None  # [V, D] raw VQ codebook (LANTERN neighbours)
    grid: int


def eagle_drafter(parts: ImageParts, policy) -> EagleTreeDrafter:
    if parts.drafter_net is None:
        raise UsageError("this method needs an EAGLE drafter (--drafter NAME, or the target's shipped one)")
    return EagleTreeDrafter(parts.drafter_net, parts.model.output, parts.target.combine, policy,
                            max_len=parts.model.rope_table.shape[0] + 512)


def fixed(parts: ImageParts, o: dict) -> FixedShape:
    shape = TreeShape(int(o.get("depth", 4)), int(o.get("top_k", 10)), int(o.get("total_tokens", 60)))
    if not (1 <= shape.depth <= 64 and 1 <= shape.top_k <= 512 and shape.total_tokens >= 1):
        raise UsageError(f"tree bounds out of range: depth 1..64, top_k 1..512, total_tokens >= 1 (got {shape})")
    return FixedShape(shape)


def adt(parts: ImageParts, o: dict) -> AdtPolicy:
    names = {f.name for f in fields(AdtParams)} - {"grid", "n_cond"}
    return AdtPolicy(AdtParams(grid=parts.grid, n_cond=parts.model.cfg.n_cond,
                               **{k: v for k, v in o.items() if k in names}))


def lantern_rule(parts: ImageParts, o: dict):
    from specgen.image.neighbours import neighbour_table, scaled_k

    if parts.codebook is None:
        raise UsageError("lantern needs the target's VQ codebook")
    delta = float(o.get("lantern_delta", 0.1))
    k = int(o.get("lantern_k", 0)) or scaled_k(parts.codebook.shape[0])
    if not 0 <= delta <= 1 or k < 1:
        raise UsageError(f"lantern needs 0 <= delta <= 1 and k >= 1 (got delta {delta}, k {k})")
    table = neighbour_table(parts.codebook, k)
    return partial(_lantern, neighbours=table, delta=delta)


def _lantern(draft, logits, params, generator, neighbours, delta):
    return accept_lantern(draft, logits, params, generator, neighbours, delta)


def vvs_decoder(parts: ImageParts, o: dict):
    from specgen.methods.vvs import build_vvs

    return build_vvs(eagle_drafter(parts, fixed(parts, o)), parts.codebook, o)


def mulo_decoder(parts: ImageParts, o: dict):
    from specgen.methods.mulo_sd import build_mulo

    if parts.model.cfg.cond_kind == "caption":
        raise UsageError("mulo-sd supports class-conditional (c2i) targets only; its low-res drafter takes a label")

    return build_mulo(parts, o)


def ar(p: ImageParts, o: dict):
    return EmptyDrafter(), None


def eagle2(p: ImageParts, o: dict):
    return eagle_drafter(p, fixed(p, o)), None


def adt_tree(p: ImageParts, o: dict):
    return eagle_drafter(p, adt(p, o)), None


def lantern(p: ImageParts, o: dict):
    return eagle_drafter(p, fixed(p, o)), lantern_rule(p, o)


def adt_tree_lantern(p: ImageParts, o: dict):
    return eagle_drafter(p, adt(p, o)), lantern_rule(p, o)


def vvs(p: ImageParts, o: dict):
    return vvs_decoder(p, o), lantern_rule(p, o)


def mulo_sd(p: ImageParts, o: dict):
    return mulo_decoder(p, o), None  # its own acceptance (pooled mass >= tau)


Builder = Callable[[ImageParts, dict], tuple[Any, Any]]


def build_image_method(name: str, parts: ImageParts, options: dict):
    """(drafter, rule) for an image method; rule None = the lossless default. Given options win over the method's
    defaults (its options class; values as given, checked by `MethodSpec.check_options` before)."""
    spec = get_method(name)
    base = {k: v for k, v in defaults(spec.options_type).items() if v is not None}
    return IMAGE_METHODS[name](parts, {**base, **options})


#: Method name -> builder, read off the method table (tests call a builder with their own options).
IMAGE_METHODS: dict[str, Builder] = {name: globals()[spec.build_image] for name, spec in METHODS.items()
                                     if spec.build_image}
