"""EAGLE drafter: Block(fc(cat(embed(x_{t+1}), f_t))) at position t + 1 predicts f_{t+1} (docs/methods/eagle2.md)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from specgen.models.cache import KVCache
from specgen.models.transformer import (Block, Transformer, TransformerConfig, forward_mask, forward_rotation,
                                        new_cache, rope_table)


def drafter_config(target_cfg: TransformerConfig) -> TransformerConfig:
    """The drafter's config: the target's block shape and RoPE, one layer, no class/caption embedding; a dense
    feed-forward of the experts' width where the target routes experts (a drafter is trained: its block is ours)."""
    return dataclasses.replace(target_cfg, n_layers=1, num_classes=0, caption_dim=0, tie_embeddings=False, cross_dim=0,
                               nope_layers=(), local_layers=(), local_rope_theta=0.0, window=0, n_experts=0,
                               experts_per_token=0, expert_renorm=False, expert_weight_round=False,
                               shared_expert_dim=0)


class EagleNet(nn.Module):
    """One-layer EAGLE drafter: row i pairs the target's normed feature f_t with the token x_{t+1} sampled from it, at
    the target's position t + 1 in the target's RoPE table; its logits are `target.logits(h)` (no head of its own)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.fc = nn.Linear(2 * cfg.dim, cfg.dim, bias=True)  # EAGLE: fc(cat(embedding, feature)) with bias
        self.layers = nn.ModuleList([Block(cfg)])
        self.register_buffer("rope_table", rope_table(cfg), persistent=False)  # [P, 2, hd], the target's table
        # models/graphs.StepGraphs (graphs.attach): the catch-ups and tree growths as CUDA-graph replays (methods/eagle)
        self.graphs = None

    @classmethod
    def from_target(cls, target: Transformer) -> EagleNet:
        """A fresh drafter shaped for `target`, its embedding copied from the target's and frozen."""
        net = cls(drafter_config(target.cfg))
        with torch.no_grad():
            net.tok_embeddings.weight.copy_(target.tok_embeddings.weight)
        net.tok_embeddings.weight.requires_grad_(False)
        return net.to(target.tok_embeddings.weight.device)

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        return new_cache(self, 1, batch, max_len, self.fc.weight.dtype, self.fc.weight.device)

    def forward(
        self,
        features: torch.Tensor,  # [B, S, D] target (or drafter-predicted) features f_t
        tokens: torch.Tensor,  # [B, S] tokens x_{t+1}
        positions: torch.Tensor,  # [B, S] target positions t + 1 of those tokens
        cache: KVCache | None = None,
        tree_mask: torch.Tensor | None = None,  # [S, S] or [B, S, S] bool among the new nodes
        attn_mask: torch.Tensor | None = None,  # [B, 1, S, T] over cache slots (multi-level trees)
    ) -> torch.Tensor:
        """Predicted next features [B, S, D] (approximating f_{t+1}); not normed again (features are)."""
        h = self.fc(torch.cat([self.tok_embeddings(tokens), features.to(self.fc.weight.dtype)], dim=-1))
        rot = forward_rotation(self, positions, h.dtype)
        return self.layers[0](h, rot, 0, cache, *forward_mask(self.cfg, h, cache, tree_mask, attn_mask), None)

    @staticmethod
    def logits(hidden: torch.Tensor, target: Transformer) -> torch.Tensor:
        """Drafter logits [B, S, V]: the target's LM head on predicted features."""
        return target.logits(hidden.to(target.dtype))
