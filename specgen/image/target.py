"""CFG target over a class-conditional LlamaGen-style GPT: one forward scores cond and uncond branches.

The KV cache holds two rows (conditional, null class) when guidance is on (scale != 1), one row
otherwise. Callers see a single sequence: `forward` duplicates the tokens, returns CFG-combined
logits [1, S, V] (uncond + scale * (cond - uncond), at the logits level as LlamaGen does) and
per-branch features [B, S, D] (row 0 cond, row 1 uncond) for drafters that run under CFG too.

Sequence layout (LlamaGen c2i): position 0 is the class condition, image token r sits at position
1 + r; the "prompt" the decode loop passes is `[label]`.
"""

from __future__ import annotations

import torch

from specgen.decoding.cache import KVCache
from specgen.decoding.sampling import cfg_combine
from specgen.decoding.target import TargetOut


class CFGTarget:
    """Target protocol for a class-conditional Transformer (needs `cfg.num_classes`)."""

    def __init__(self, model: torch.nn.Module, cfg_scale: float = 4.0) -> None:
        self.model = model
        self.cfg_scale = float(cfg_scale)
        self.vocab_size = model.cfg.vocab_size
        self.null_class = model.cfg.num_classes
        self.device = model.tok_embeddings.weight.device

    @property
    def guided(self) -> bool:
        return self.cfg_scale != 1.0

    @property
    def branches(self) -> int:
        return 2 if self.guided else 1

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return self.model.new_cache(self.branches * batch, max_len)  # slots, not positions: trees need room

    def combine(self, logits: torch.Tensor) -> torch.Tensor:
        """[branches, S, V] -> [1, S, V] CFG-combined logits."""
        if not self.guided:
            return logits
        return cfg_combine(logits[0:1], logits[1:2], self.cfg_scale)

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, cache: KVCache) -> TargetOut:
        """tokens [1, 1] = the class label; runs the condition position and commits it."""
        labels = tokens[0, :1].to(self.device)
        if self.guided:
            labels = torch.cat([labels, torch.full_like(labels, self.null_class)])
        embeds = self.model.cls_embedding(labels)  # [branches, 1, dim]
        positions = torch.zeros(self.branches, 1, dtype=torch.long, device=self.device)
        logits, hidden = self.model(None, positions, cache, embeds=embeds)
        for row in range(self.branches):
            cache.commit(row, [0])
        return TargetOut(self.combine(logits), hidden)

    @torch.inference_mode()
    def forward(self, tokens, positions, cache, tree_mask) -> TargetOut:
        b = self.branches
        logits, hidden = self.model(tokens.expand(b, -1), positions.expand(b, -1), cache, tree_mask)
        return TargetOut(self.combine(logits), hidden)

    def commit(self, cache: KVCache, keep: list[int]) -> None:
        for row in range(self.branches):
            cache.commit(row, keep)
