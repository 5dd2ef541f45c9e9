"""The Target of the decode loop for point-cloud-conditioned mesh GPTs: prompt `[i]` names cloud i of `clouds`."""

from __future__ import annotations

from typing import Callable

import torch

from specgen.decoding.target import TargetOut
from specgen.models.cache import KVCache
from specgen.models.static_step import first_node


class MeshTarget:
    """Target protocol over a `MeshGPT` and the point clouds [N_i, 6] of the sequences it decodes."""

    branches = 1

    def __init__(self, model: torch.nn.Module, clouds: list[torch.Tensor]) -> None:
        self.model, self.clouds = model, clouds
        self.vocab_size = model.vocab_size
        self.device = model.start.device
        self.dtype = model.start.dtype  # clouds arrive as float32: the encoder runs in the model's dtype
        self.conditions: dict[int, torch.Tensor] = {}  # cloud index -> condition [1, M, cross_dim]
        # a pool's post-step of every verify forward (XSpecMesh's heads run ahead: xspecmesh_pool.ReadAhead), inside
        # its captured replay: (logits, hidden) -> (logits, hidden, the block `TargetOut.ahead` holds)
        self.along: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]] | None = None

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return self.model.new_cache(batch, max_len)

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, cache: KVCache) -> TargetOut:
        """tokens [1, 1] = the cloud's index; logits [1, 1, V] of mesh token 1, features [1, 1, dim] (the start's h)."""
        i = int(tokens[0, 0])
        pc = self.clouds[i].to(dtype=self.dtype).unsqueeze(0)  # [1, N, 6], on the host or the device
        if self.model.decoder.graphs is None:
            self.conditions[i], cross = self.model.condition(pc.to(self.device))
            logits, hidden = self.model.prefill(cache, cross)  # [1, V], [1, dim]
        else:
            self.conditions[i], logits, hidden = self.replayed_prefill(pc, cache)
        return TargetOut(logits[:, None], hidden[:, None])

    def replayed_prefill(self, pc: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, ...]:
        """`MeshGPT.condition` and `prefill` as one replay a point count, where ~250 eager launches ran (the encoder's
        products over N points, the K/V, the start's decoder step: gpu.md): the condition [1, M, cross_dim], logits
        [1, V] and hidden [1, dim]; the row's cache holds the conditions' K/V and the start in slot 0."""
        def run(pc: torch.Tensor) -> tuple[torch.Tensor, ...]:
            cond, cross = self.model.condition(pc)
            logits, hidden, k, v = first_node(self.model.decoder, self.model.start.view(1, 1, -1), cross)
            return cond, logits[:, 0], hidden[:, 0], k, v, *(t for kv in cross for t in kv)

        graphs = self.model.decoder.graphs.prompt_graphs()
        cond, logits, hidden, k, v, *kv = graphs.call(("mesh", tuple(pc.shape)), run, {"pc": pc})
        # the graph's own buffers, which the next cloud's replay rewrites: the K/V are copied into the loop's cache
        # before the next prefill (`KVCache.absorb`), the rest is kept (a batch prefills every free slot before its
        # rows read their logits, and XSpecMesh's heads their condition)
        cache.cross = list(zip(kv[::2], kv[1::2]))
        cache.commit_first(k, v, 1)  # [L, 1, Hkv, 1, hd]: the start's keys and values in the row's slot 0
        return cond.clone(), logits.clone(), hidden.clone()

    @torch.inference_mode()
    def forward(self, tokens, positions, cache, tree_mask) -> TargetOut:
        """Score chains tokens [n, S] at positions [n, S] over each row's cache and condition: logits [n, S, V],
        features [n, S, dim] and, with `along`, its block."""
        decoder = self.model.decoder
        outs = None if decoder.graphs is None else decoder.graphs.forward(tokens, positions, cache, tree_mask,
                                                                          post=self.along)
        if outs is None:  # no captured steps, or they declined this call
            outs = decoder.eager(tokens, positions, cache, tree_mask)
            outs = outs if self.along is None else self.along(*outs)
        return TargetOut(outs[0], outs[1], ahead=outs[2] if self.along is not None else None, graphs=decoder.graphs)
