"""EAGLE feature drafter: one decoder block that predicts the target's next final hidden state.

    h = Block(fc(concat(embed(x_{t+1}), f_t)))     # f_t: target feature at position t
    logits = target.output(h)                        # the drafter has no head of its own

Alignment (EAGLE's shift). `f_t` is the target's final *normed* hidden state at sequence position t
(`TargetOut.features`, what `target.output` turns into the logits for the token at position t+1).
Drafter row i pairs `f_t` with the token `x_{t+1}` that was sampled from those logits, and runs at
`positions = t + 1`, the target's own position of `x_{t+1}`, indexing the **same** RoPE table as the
target (LlamaGen c2i: 2D table with one zero condition row; image token r at position 1 + r). Its
output `h` approximates `f_{t+1}`, so `target.output(h)` scores the token at position t + 2.
For LlamaGen c2i: t = 0 is the condition position, so the first drafter row is
(f_0, image token 0, position 1) and predicts image token 1. (LANTERN's drafter table has
`cls_token_num - 1` zero rows and uses position t; that is the same rotation as ours at t + 1.)

Under CFG the drafter runs once per branch (cond and null-class features, same tokens), exactly as
the target does, and the caller combines the two logits.

Token embedding: a *copy* of the target's `tok_embeddings`, made when the drafter is created for a
target (`EagleNet.from_target`) and frozen during training (as EAGLE does); it is stored with the
drafter, so the drafter loads on its own. The head is never stored: logits always come from the
target's `output` (`EagleNet.logits(hidden, target)`).

KV cache: the drafter's single block uses a `KVCache` with one layer (`new_cache`), with the same
pending/commit semantics as the target (`decoding/cache.py`): `forward` writes S pending nodes,
`tree_mask` [S, S] says which of them see which, the caller commits accepted ones.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from specgen.decoding.cache import KVCache
from specgen.models.attention import plan
from specgen.models.kernel_choice import attention_path
from specgen.models.rope import check_positions, rotation, table_1d, table_2d
from specgen.models.transformer import Block, Transformer, TransformerConfig


def drafter_config(target_cfg: TransformerConfig) -> TransformerConfig:
    """The drafter's config: the target's block shape and RoPE, one layer, no class/caption embedding."""
    return dataclasses.replace(target_cfg, n_layers=1, num_classes=0, caption_dim=0, tie_embeddings=False, cross_dim=0)


class EagleNet(nn.Module):
    """One-layer EAGLE drafter over target features; see the module docstring for the alignment."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.fc = nn.Linear(2 * cfg.dim, cfg.dim, bias=True)  # EAGLE: fc(cat(embedding, feature)) with bias
        self.layers = nn.ModuleList([Block(cfg)])
        if cfg.rope_grid:
            table = table_2d(cfg.rope_grid, cfg.hd, cfg.rope_theta, cfg.n_cond)
        else:
            table = table_1d(cfg.max_seq_len, cfg.hd, cfg.rope_theta)
        self.register_buffer("rope_table", table, persistent=False)  # [P, hd/2, 2], the target's table
        self.graphs = None  # models/graphs.StepGraphs: cached forwards as CUDA-graph replays (graphs.attach)

    @classmethod
    def from_target(cls, target: Transformer) -> EagleNet:
        """A fresh drafter shaped for `target`, its embedding copied from the target's and frozen."""
        net = cls(drafter_config(target.cfg))
        with torch.no_grad():
            net.tok_embeddings.weight.copy_(target.tok_embeddings.weight)
        net.tok_embeddings.weight.requires_grad_(False)
        return net.to(target.tok_embeddings.weight.device)

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        p = self.fc.weight
        if self.graphs is not None:
            return self.graphs.new_cache(batch, max_len or self.cfg.max_seq_len)
        return KVCache.allocate(1, batch, self.cfg.n_kv_heads, max_len or self.cfg.max_seq_len, self.cfg.hd,
                                p.dtype, p.device)

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
        if self.graphs is not None and cache is not None and attn_mask is None:  # captured trees: methods/eagle_grow
            replayed = self.graphs.forward(tokens, positions, cache, tree_mask, features.to(self.fc.weight.dtype))
            if replayed is not None:
                return replayed[0]
        s = tokens.shape[1]
        limit = self.rope_table.shape[0]
        check_positions(positions, limit, lambda top: ValueError(f"position {top} exceeds the drafter's {limit}"))
        h = self.fc(torch.cat([self.tok_embeddings(tokens), features.to(self.fc.weight.dtype)], dim=-1))
        rot = rotation(self.rope_table[positions].to(h.dtype), self.cfg.rope_layout)  # as Transformer.hidden_states
        if cache is not None:
            cache.check_room(s)
            mask = cache.hide_keys(attn_mask) if attn_mask is not None else cache.prefix_mask(s, tree_mask)
            causal = False
            if attention_path(h.dtype, h.device) != "sdpa":  # the block takes an attention plan (as the target's)
                t = mask.shape[-1] if mask is not None else max(cache.lengths) + s
                c = self.cfg
                mask = plan(mask, h.shape[0], s, t, c.n_heads, c.n_kv_heads, c.hd, h.device, h.dtype, cache.lengths)
        else:
            mask = None if tree_mask is None else tree_mask.view(-1, 1, s, s)
            causal = tree_mask is None
        return self.layers[0](h, rot, 0, cache, mask, causal, None)

    @staticmethod
    def logits(hidden: torch.Tensor, target: Transformer) -> torch.Tensor:
        """Drafter logits [B, S, V]: the target's LM head on predicted features."""
        return target.output(hidden.to(target.dtype))


def build_eagle(**kwargs) -> EagleNet:
    """Registry builder "eagle": kwargs are the drafter's `TransformerConfig` fields (n_layers = 1)."""
    return EagleNet(TransformerConfig(**kwargs))
