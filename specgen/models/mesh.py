"""Point-cloud-conditioned mesh GPT: a perceiver point encoder + the specgen Transformer with cross-attention."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specgen.models.cache import KVCache
from specgen.models.prompt import prompt_mode
from specgen.models.transformer import CrossAttention, Transformer, TransformerConfig


@dataclass(frozen=True)
class PointEncoderConfig:
    """Shape of the perceiver point encoder; JSON-serialisable."""

    width: int = 256
    num_latents: int = 64
    enc_layers: int = 2
    n_heads: int = 4
    num_freqs: int = 8  # Fourier frequencies 2^k * pi, k < num_freqs, per axis (BPT/miche: 8)
    out_dim: int = 256  # = the decoder's cross_dim

    def to_dict(self) -> dict:
        return asdict(self)


class _EncBlock(nn.Module):
    """Pre-norm attention (to `ctx`, or self when ctx is None) + GELU MLP."""

    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CrossAttention(dim, dim, n_heads, dim // n_heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor, ctx: torch.Tensor | None = None) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, self.attn.context_kv(h if ctx is None else ctx))
        return x + self.mlp(self.norm2(x))


class PointEncoder(nn.Module):
    """Perceiver over surface samples (the shape of BPT's Michelangelo encoder, scaled down and trained from scratch:
    miche is GPL-3.0): [B, N, 6] points+normals -> [B, num_latents, out_dim]."""

    def __init__(self, cfg: PointEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        freqs = torch.tensor([2.0**k * math.pi for k in range(cfg.num_freqs)])  # no op: a meta op may import dynamo
        self.register_buffer("freqs", freqs, persistent=False)  # [K]
        in_dim = 3 + 3 + 3 * 2 * cfg.num_freqs
        self.embed = nn.Sequential(nn.Linear(in_dim, cfg.width), nn.GELU(), nn.Linear(cfg.width, cfg.width))
        self.latents = nn.Parameter(nn.init.normal_(torch.empty(cfg.num_latents, cfg.width), std=0.02))
        self.ctx_norm = nn.LayerNorm(cfg.width)
        self.cross = _EncBlock(cfg.width, cfg.n_heads)
        self.blocks = nn.Sequential(*(_EncBlock(cfg.width, cfg.n_heads) for _ in range(cfg.enc_layers)))
        self.out_norm = nn.LayerNorm(cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.out_dim)

    def forward(self, pc: torch.Tensor) -> torch.Tensor:
        ang = (pc[..., :3].unsqueeze(-1) * self.freqs).flatten(-2)  # [B, N, 3K]: 2^k pi xyz
        features = torch.cat([pc[..., :6], ang.sin(), ang.cos()], dim=-1)  # [B, N, in_dim]: xyz, normals, sin, cos
        pts = self.ctx_norm(self.embed(features))  # [B, N, W]
        x = self.latents.unsqueeze(0).expand(pc.shape[0], -1, -1)  # [B, M, W]
        return self.proj(self.out_norm(self.blocks(self.cross(x, pts))))  # [B, M, out_dim]


class MeshGPT(nn.Module):
    """Point encoder + cross-attention decoder + learned start vector (BPT has no BOS id)."""

    def __init__(self, decoder: dict, encoder: dict) -> None:
        super().__init__()
        self.dec_cfg = TransformerConfig(**decoder)
        self.enc_cfg = PointEncoderConfig(**encoder)
        if self.dec_cfg.cross_dim != self.enc_cfg.out_dim:
            raise ValueError(f"decoder cross_dim {self.dec_cfg.cross_dim} != encoder out_dim {self.enc_cfg.out_dim}")
        self.encoder = PointEncoder(self.enc_cfg)
        self.decoder = Transformer(self.dec_cfg)
        self.start = nn.Parameter(nn.init.normal_(torch.empty(self.dec_cfg.dim), std=0.02))
        nn.init.normal_(self.decoder.tok_embeddings.weight, std=0.02)  # tied LM head: keep initial logits small

    @property
    def vocab_size(self) -> int:
        return self.dec_cfg.vocab_size

    def builder_kwargs(self) -> dict:
        return {"decoder": self.dec_cfg.to_dict(), "encoder": self.enc_cfg.to_dict()}

    def forward_train(self, pc: torch.Tensor, tokens: torch.Tensor, table: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Teacher-forced pass over tokens [B, L] (pad -1): logits [B, L, V] (row i predicts tokens[:, i]), hidden
        [B, L, dim], the condition; `table` [V, dim] replaces the tied embedding / LM head (train/mesh_embedding.py)."""
        cond, ids = self.encoder(pc), tokens[:, :-1].clamp_min(0)
        emb = self.decoder.tok_embeddings(ids) if table is None else F.embedding(ids, table)
        h = torch.cat([self.start.view(1, 1, -1).expand(ids.shape[0], 1, -1), emb], 1)  # [B, L, dim]: start, x_1 ..
        pos = torch.arange(h.shape[1], device=h.device).expand(h.shape[0], -1)
        hidden = self.decoder.hidden_states(h, pos, None, None, self.decoder.context_kv(cond))
        logits = self.decoder.output(hidden) if table is None else F.linear(hidden, table)
        return logits, hidden, cond

    # -- cached decoding -------------------------------------------------------------------------
    def new_cache(self, batch: int, max_len: int) -> KVCache:
        """`max_len` slots, not positions: a draft tree's nodes share positions, and near the context they take slots
        past it (the positions are the decoder's to guard)."""
        return self.decoder.new_cache(batch, max_len)

    def condition(self, pc: torch.Tensor) -> tuple[torch.Tensor, list]:
        """What decoding reads of clouds pc [B, N, 6], computed once a mesh: the encoder's condition [B, M, cross_dim]
        (in prompt mode: it runs once a mesh, alike in every method) and the decoder's per-layer cross-attention K/V
        of it ([B, H, M, hd] x 2, a decode step's products: the K/V every step reads)."""
        with prompt_mode():
            cond = self.encoder(pc)
        return cond, self.decoder.context_kv(cond)

    @torch.inference_mode()
    def prefill(self, cache: KVCache, cross: list) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the condition's K/V `cross` (`condition`), run the start vector at position 0 and commit it: logits
        [B, V] of token 1 and the start's hidden state [B, dim]."""
        cache.cross = cross
        b, device = cross[0][0].shape[0], cross[0][0].device
        h = self.start.view(1, 1, -1).expand(b, 1, -1)
        pos = torch.zeros(b, 1, dtype=torch.long, device=device)
        hidden = self.decoder.hidden_states(h, pos, cache)
        cache.commit_seqs(dict.fromkeys(range(b), [0]), 1)
        return self.decoder.output(hidden[:, -1]), hidden[:, -1]
