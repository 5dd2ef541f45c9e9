"""Image method builders by method name: each returns (drafter, accept rule) for the shared decode loop."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch

from specgen.decoding.accept_relaxed import accept_lantern
from specgen.devices import module_device, on_gpu
from specgen.errors import UsageError
from specgen.image.neighbours import neighbour_table, scaled_k
from specgen.methods import get_method
from specgen.methods import options as O
from specgen.methods.adt_tree import AdtPolicy
from specgen.methods.eagle import EagleTreeDrafter, FixedShape, TreeShape
from specgen.methods.eagle_ahead import AheadTreeDrafter
from specgen.methods.mulo_sd import build_mulo
from specgen.methods.text import EmptyDrafter
from specgen.methods.vvs import build_vvs


@dataclass
class ImageParts:
    """What a method builder needs: the loaded target, its CFG adapter, drafter net, codebook and grid."""

    model: torch.nn.Module
    target: Any  # CFGTarget (c2i) or CaptionCFGTarget (t2i)
    drafter_net: torch.nn.Module | None
    codebook: torch.Tensor | None  # [V, D] raw VQ codebook (LANTERN neighbours)
    grid: int


def eagle_drafter(parts: ImageParts, policy, run_ahead: int = 1) -> EagleTreeDrafter:
    if parts.drafter_net is None:
        raise UsageError("this method needs an EAGLE drafter (--drafter NAME, or the target's shipped one)")
    # the committed pairs (at most the context) and one growth's levels: the largest tree's (at least 512 slots, the
    # headroom it always had: a captured growth pads its levels to node buckets)
    # run_ahead > 1: that many tree steps a host read (methods/eagle_ahead.py)
    if run_ahead > 1 and parts.model.cfg.cond_kind == "caption":
        raise UsageError("run_ahead (option of eagle2, adt-tree) needs a class-conditional (c2i) target: its steps "
                         "hide rejected nodes with the key mask that hides a caption's padding")
    kind, extra = (EagleTreeDrafter, {}) if run_ahead == 1 else (AheadTreeDrafter, {"run_ahead": run_ahead})
    return kind(parts.drafter_net, parts.model.output, policy, guidance=parts.target.cfg_scale,
                max_len=parts.model.rope_table.shape[0] + max(512, policy.largest.level_slots), **extra)


def fixed(o: O.TreeShapeOptions) -> FixedShape:
    return FixedShape(TreeShape(o.depth, o.top_k, o.total_tokens))


def adt(parts: ImageParts, o: O.AdtOptions) -> AdtPolicy:
    return AdtPolicy(o, parts.grid, parts.model.cfg.n_cond)


def lantern_rule(parts: ImageParts, o: O.LanternOptions):
    table = neighbour_table(parts.codebook, o.lantern_k or scaled_k(parts.codebook.shape[0]))
    return partial(accept_lantern, neighbours=table, delta=o.lantern_delta)


def mulo_sd(p: ImageParts, o: O.MuloOptions):
    if p.model.cfg.cond_kind == "caption":
        raise UsageError("mulo-sd supports class-conditional (c2i) targets only; its low-res drafter takes a label")
    return build_mulo(p, o), None  # its own acceptance (pooled mass >= tau)


def build_image_method(name: str, parts: ImageParts, options: dict | O.Options):
    """(drafter, rule) for an image method from its options (`MethodSpec.parse_options`, or a dict it parses with the
    defaults of the target's device); rule None = the lossless default."""
    if isinstance(options, dict):
        options = get_method(name).parse_options(options, gpu=on_gpu(module_device(parts.model)))
    return BUILDERS[name](parts, options)


BUILDERS: dict[str, Callable[[ImageParts, Any], tuple[Any, Any]]] = {  # every method that runs on images, by name
    "ar": lambda p, o: (EmptyDrafter(o.run_ahead), None),
    "eagle2": lambda p, o: (eagle_drafter(p, fixed(o), o.run_ahead), None),
    "adt-tree": lambda p, o: (eagle_drafter(p, adt(p, o), o.run_ahead), None),
    "lantern": lambda p, o: (eagle_drafter(p, fixed(o)), lantern_rule(p, o)),  # no run_ahead: options.lossless_ahead
    "adt-tree+lantern": lambda p, o: (eagle_drafter(p, adt(p, o)), lantern_rule(p, o)),
    "vvs": lambda p, o: (build_vvs(eagle_drafter(p, fixed(o)), p.codebook, o), lantern_rule(p, o)),
    "mulo-sd": mulo_sd,
}
