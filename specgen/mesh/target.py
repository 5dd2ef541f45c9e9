"""The Target of the decode loop for point-cloud-conditioned mesh GPTs: prompt `[i]` names cloud i of `clouds`."""

from __future__ import annotations

from typing import Callable

import torch

from specgen.decoding.target import TargetOut
from specgen.models.cache import KVCache
from specgen.models.prompt import prompt_mode


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
        # the point encoder runs once a mesh, alike in every method: a prompt's products (on a GPU 256-row slices, 8
        # launches a product over 2,048 points where a decode step's 64-row slices ran 32: gpu.md, the mesh prefill)
        with prompt_mode():
            cond = self.model.encoder(self.clouds[i].to(self.device, self.dtype).unsqueeze(0))
        self.conditions[i] = cond
        logits, hidden = self.model.prefill(cache, cond)  # [1, V], [1, dim]
        return TargetOut(logits[:, None], hidden[:, None])

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
        return TargetOut(outs[0], outs[1], ahead=outs[2] if self.along is not None else None)
