"""Tiny random class-conditional GPT (2D RoPE, CFG) and a tiny EAGLE-style drafter for image tests."""

from __future__ import annotations

import torch
from torch import nn

from specgen.models.transformer import Transformer, TransformerConfig


def tiny_image_gpt(seed: int = 0, grid: int = 4, vocab: int = 32, classes: int = 3) -> Transformer:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=64,
                            rope_layout="interleaved", rope_grid=grid, n_cond=1, num_classes=classes,
                            tie_embeddings=False, max_seq_len=1 + grid * grid)
    model = Transformer(cfg)
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.normal_(p, std=0.4)
    return model.eval()


class TinyEagle(nn.Module):
    """fc(concat(embed(x_{p+1}), f_p)) -> one block; positions index the target's RoPE table."""

    graphs = None  # no captured steps

    def __init__(self, target: Transformer, seed: int = 1):
        super().__init__()
        torch.manual_seed(seed)
        c = target.cfg
        self.embed = target.tok_embeddings
        self.fc = nn.Linear(2 * c.dim, c.dim, bias=False)
        self.layer = Transformer(TransformerConfig(**{**c.to_dict(), "n_layers": 1, "num_classes": 0}))

    def new_cache(self, batch, max_len):
        return self.layer.new_cache(batch, max_len)

    def forward(self, features, tokens, positions, cache=None, tree_mask=None, attn_mask=None):
        h = self.fc(torch.cat([self.embed(tokens), features], -1))
        return self.layer.hidden_states(h, positions, cache, tree_mask, attn_mask=attn_mask)
