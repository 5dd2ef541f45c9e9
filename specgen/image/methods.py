"""Image methods by name: each builder returns (drafter, accept rule) for the shared decode loop.

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
from specgen.image.options import IMAGE_METHOD_OPTIONS
from specgen.methods.adt_tree import AdtParams, AdtPolicy
from specgen.methods.eagle import EagleTreeDrafter, FixedShape, TreeShape
from specgen.methods.text import EmptyDrafter

# Defaults: EAGLE-2/LANTERN for LlamaGen (depth 4, top_k 10, total_token 59 + root); LANTERN delta 0.1 and
# k = 1000 of 16,384 codes scaled to the codebook (lantern_k 0). Recipes may override them.


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


Builder = Callable[[ImageParts, dict], tuple[Any, Any]]
IMAGE_METHODS: dict[str, Builder] = {
    "ar": lambda p, o: (EmptyDrafter(), None),
    "eagle2": lambda p, o: (eagle_drafter(p, fixed(p, o)), None),
    "adt-tree": lambda p, o: (eagle_drafter(p, adt(p, o)), None),
    "lantern": lambda p, o: (eagle_drafter(p, fixed(p, o)), lantern_rule(p, o)),
    "adt-tree+lantern": lambda p, o: (eagle_drafter(p, adt(p, o)), lantern_rule(p, o)),
    "vvs": lambda p, o: (vvs_decoder(p, o), lantern_rule(p, o)),
    "mulo-sd": lambda p, o: (mulo_decoder(p, o), None),  # its own acceptance (pooled mass >= tau)
}
assert set(IMAGE_METHOD_OPTIONS) <= set(IMAGE_METHODS)


# CPU defaults, chosen from measurements on 2 cores with the embedded 16x16 generator (docs/results/image.md):
# a 60-node verify costs several 1-token forwards there, so trees are kept to 16 nodes and narrow. The papers'
# GPU settings (EAGLE-2/LANTERN depth 4, top_k 10, 60 nodes; ADT-Tree for LlamaGen l_k 10, top_k in (3, 40))
# are the dataclass defaults: pass them explicitly (docs/methods/eagle2.md, adt-tree.md).
SMALL_TREE = {"depth": 6, "top_k": 4, "total_tokens": 16}
SMALL_ADT = {"total_tokens": 16, "k0": 4, "l_k": 2, "k_min": 1, "k_max": 12}
CPU_DEFAULTS: dict[str, dict] = {
    "eagle2": SMALL_TREE, "lantern": SMALL_TREE, "vvs": SMALL_TREE,
    "adt-tree": SMALL_ADT, "adt-tree+lantern": SMALL_ADT,
}


def build_image_method(name: str, parts: ImageParts, options: dict):
    """(drafter, rule) for an image method; rule None = the lossless default. User options win over CPU defaults."""
    return IMAGE_METHODS[name](parts, {**CPU_DEFAULTS.get(name, {}), **options})
