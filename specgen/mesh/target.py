"""The Target of the decode loop for point-cloud-conditioned mesh GPTs: prompt `[i]` names cloud i of `clouds`."""

from __future__ import annotations

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
        """Score chains tokens [n, S] at positions [n, S] over each row's cache and condition."""
        logits, hidden = self.model.decoder(tokens, positions, cache, tree_mask)  # [n, S, V], [n, S, dim]
        return TargetOut(logits, hidden)
