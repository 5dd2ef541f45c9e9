"""LlamaGen-compatible VQ image tokenizer (conv encoder/decoder + L2-normalised codebook), same state-dict keys."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

USAGE_WINDOW = 65536  # length of LlamaGen's `quantize.codebook_used` buffer (part of released state dicts)


@dataclass(frozen=True)
class VQConfig:
    """Architecture of a LlamaGen VQ tokenizer. `ch_mult` has one entry per resolution level."""

    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    codebook_show_usage: bool = True  # keeps the `quantize.codebook_used` buffer (released checkpoints have it)
    commit_loss_beta: float = 0.25
    entropy_loss_ratio: float = 0.0
    ch: int = 128
    encoder_ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    decoder_ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    z_channels: int = 256
    num_res_blocks: int = 2  # per encoder level; decoder levels have num_res_blocks + 1 (as LlamaGen)
    norm_groups: int = 32  # LlamaGen: GroupNorm(32, eps=1e-6)
    dropout_p: float = 0.0
    image_size: int = 256  # nominal training resolution (informational; the nets are fully convolutional)

    def __post_init__(self) -> None:
        for k in ("encoder_ch_mult", "decoder_ch_mult"):  # JSON's lists as tuples, so that equal configs compare equal
            object.__setattr__(self, k, tuple(getattr(self, k)))
        if len(self.encoder_ch_mult) != len(self.decoder_ch_mult):
            raise ValueError("encoder_ch_mult and decoder_ch_mult must have the same number of levels")
        for m in (*self.encoder_ch_mult, *self.decoder_ch_mult):
            if (self.ch * m) % self.norm_groups:
                raise ValueError(f"channels {self.ch * m} not divisible by norm_groups {self.norm_groups}")

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.encoder_ch_mult) - 1)

    def to_dict(self) -> dict:
        return asdict(self)


VQ_CONFIGS: dict[str, VQConfig] = {
    # LlamaGen VQ-16 (vq_ds16_c2i.pt / vq_ds16_t2i.pt): 256px -> 16x16, 384px -> 24x24.
    "vq-16": VQConfig(),
    # LlamaGen VQ-8 (vq_ds8_c2i.pt): 256px -> 32x32.
    "vq-8": VQConfig(encoder_ch_mult=(1, 2, 2, 4), decoder_ch_mult=(1, 2, 2, 4)),
    # Embedded tiny tokenizer: 64x64 crops -> 16x16 grid (downsample 4), 512 codes, trains on a CPU.
    "vq-tiny": VQConfig(
        codebook_size=512,
        codebook_embed_dim=8,
        ch=32,
        encoder_ch_mult=(1, 2, 2),
        decoder_ch_mult=(1, 2, 2),
        z_channels=64,
        norm_groups=8,
        image_size=64,
    ),
}


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=groups, num_channels=channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """norm-swish-conv x2 with a residual; `nin_shortcut` (1x1) when channels change."""

    def __init__(self, c_in: int, c_out: int, groups: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = _norm(c_in, groups)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.norm2 = _norm(c_out, groups)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B,Cin,H,W] -> [B,Cout,H,W]
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over all H*W positions with 1x1-conv q/k/v/proj_out."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.norm = _norm(channels, groups)
        self.q = nn.Conv2d(channels, channels, 1)
        self.k = nn.Conv2d(channels, channels, 1)
        self.v = nn.Conv2d(channels, channels, 1)
        self.proj_out = nn.Conv2d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B,C,H,W] -> [B,C,H,W]
        b, c, h, w = x.shape
        hn = self.norm(x)
        q, k, v = (m(hn).flatten(2).transpose(1, 2) for m in (self.q, self.k, self.v))  # each [B,HW,C]
        out = F.scaled_dot_product_attention(q, k, v)  # [B,HW,C], scale C^-0.5
        return x + self.proj_out(out.transpose(1, 2).reshape(b, c, h, w))


class Resample(nn.Module):
    """Down: zero-pad right/bottom by one, then 3x3 stride-2 conv (H,W -> H/2,W/2); up: nearest x2, then 3x3 conv."""

    def __init__(self, channels: int, down: bool) -> None:
        super().__init__()
        self.down = down
        self.conv = nn.Conv2d(channels, channels, 3, stride=2 if down else 1, padding=0 if down else 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)) if self.down else F.interpolate(x, scale_factor=2.0, mode="nearest"))


class _Level(nn.Module):
    """One resolution level: `res.{j}`, `attn.{j}` (lowest resolution only), then its resampler when it has one
    (`downsample` in the encoder, `upsample` in the decoder: LlamaGen's keys)."""

    def __init__(self, res: list[nn.Module], attn: list[nn.Module], resample: str | None, channels: int) -> None:
        super().__init__()
        self.res = nn.ModuleList(res)
        self.attn = nn.ModuleList(attn)
        self.resample = resample
        if resample is not None:
            setattr(self, resample, Resample(channels, resample == "downsample"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resampled(self.body(x))

    def body(self, x: torch.Tensor) -> torch.Tensor:
        """The level's blocks at its own resolution, before its resampler."""
        for j, block in enumerate(self.res):
            x = block(x)
            if len(self.attn):
                x = self.attn[j](x)
        return x

    def resampled(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.resample is None else getattr(self, self.resample)(x)


def _levels(cfg: VQConfig, c: int, encoder: bool) -> tuple[nn.Sequential, int]:
    """`conv_blocks` and their output channels: the encoder's from the full resolution down, each level but the last
    downsampling; the decoder's from the lowest up (one more block per level), each but the last upsampling."""
    mult = cfg.encoder_ch_mult if encoder else cfg.decoder_ch_mult
    last = len(mult) - 1
    blocks = nn.Sequential()
    for level in range(last + 1) if encoder else reversed(range(last + 1)):
        res, attn = [], []
        for _ in range(cfg.num_res_blocks + (0 if encoder else 1)):
            res.append(ResnetBlock(c, cfg.ch * mult[level], cfg.norm_groups, cfg.dropout_p))
            c = cfg.ch * mult[level]
            if level == last:
                attn.append(AttnBlock(c, cfg.norm_groups))
        resample = None if level == (last if encoder else 0) else "downsample" if encoder else "upsample"
        blocks.append(_Level(res, attn, resample, c))
    return blocks, c


def _mid(channels: int, groups: int, dropout: float) -> nn.Sequential:
    return nn.Sequential(ResnetBlock(channels, channels, groups, dropout), AttnBlock(channels, groups),
                         ResnetBlock(channels, channels, groups, dropout))


class Coder(nn.Module):
    """The encoder [B,3,H,W] -> [B,z_channels,H/f,W/f] (f = 2 ** (levels - 1)), or the decoder back, whose mid blocks
    come first and whose `conv_blocks.0` is the lowest resolution (as LlamaGen's)."""

    def __init__(self, cfg: VQConfig, encoder: bool) -> None:
        super().__init__()
        self.encodes, c = encoder, cfg.ch if encoder else cfg.ch * cfg.decoder_ch_mult[-1]
        self.conv_in = nn.Conv2d(3 if encoder else cfg.z_channels, c, 3, padding=1)
        if not encoder:  # each net built in LlamaGen's order, so that a seed draws the same initial weights
            self.mid = _mid(c, cfg.norm_groups, cfg.dropout_p)
        self.conv_blocks, c = _levels(cfg, c, encoder)
        if encoder:
            self.mid = _mid(c, cfg.norm_groups, cfg.dropout_p)
        self.norm_out = _norm(c, cfg.norm_groups)
        self.conv_out = nn.Conv2d(c, cfg.z_channels if encoder else 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        h = self.mid(self.conv_blocks(h)) if self.encodes else self.conv_blocks(self.mid(h))
        return self.conv_out(F.silu(self.norm_out(h)))


@dataclass(frozen=True)
class QuantizeOut:
    """Quantiser result (with `recon` from `VQModel.forward`). Losses are 0-dim tensors (zero outside training)."""

    z_q: torch.Tensor  # [B,D,h,w] straight-through quantised latents (L2-normalised if l2_norm)
    latents: torch.Tensor  # [B,D,h,w] pre-quantisation latents (L2-normalised if l2_norm)
    indices: torch.Tensor  # [B,h,w] int64 code ids
    codebook_loss: torch.Tensor  # mean ||sg(z) - e||^2: moves codes towards encoder outputs
    commit_loss: torch.Tensor  # beta * mean ||z - sg(e)||^2: keeps the encoder near its codes
    entropy_loss: torch.Tensor  # entropy_loss_ratio * (per-sample entropy - batch entropy)
    recon: torch.Tensor | None = None  # [B,3,H,W] in about [-1,1]

    @property
    def quant_loss(self) -> torch.Tensor:
        return self.codebook_loss + self.commit_loss + self.entropy_loss


def _entropy_loss(affinity: torch.Tensor, temperature: float = 0.01) -> torch.Tensor:
    """[N,K] affinities -> scalar: low per-sample entropy, high codebook-average entropy."""
    logits = affinity.reshape(-1, affinity.shape[-1]) / temperature  # [N,K]
    probs = logits.softmax(-1)
    avg = probs.mean(0)  # [K]
    avg_entropy = -(avg * torch.log(avg + 1e-5)).sum()
    sample_entropy = -(probs * logits.log_softmax(-1)).sum(-1).mean()
    return sample_entropy - avg_entropy


def nearest_code(flat: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest code ids [N] of rows flat [N, D] among codes [K, D], and the squared distances [N, K]."""
    dist = flat.pow(2).sum(1, keepdim=True) + codes.pow(2).sum(1) - 2.0 * flat @ codes.t()
    return dist.argmin(1), dist


class VectorQuantizer(nn.Module):
    """Nearest-code lookup; with l2_norm both latents and codes are L2-normalised before the search."""

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.codebook_size, cfg.codebook_embed_dim)
        with torch.no_grad():
            self.embedding.weight.uniform_(-1.0 / cfg.codebook_size, 1.0 / cfg.codebook_size)
            if cfg.codebook_l2_norm and not self.embedding.weight.is_meta:  # a size check's meta build: no values
                self.embedding.weight.copy_(F.normalize(self.embedding.weight, dim=-1))
        if cfg.codebook_show_usage:
            # Rolling window of the last USAGE_WINDOW code ids seen in training (float, as LlamaGen stores it).
            self.register_buffer("codebook_used", torch.zeros(USAGE_WINDOW))

    def codebook(self) -> torch.Tensor:
        """The codebook as used for lookup: [K,D] (unit rows if l2_norm)."""
        w = self.embedding.weight
        return F.normalize(w, dim=-1) if self.cfg.codebook_l2_norm else w

    def lookup(self, indices: torch.Tensor) -> torch.Tensor:
        """indices [...] -> code vectors [..., D]."""
        return F.embedding(indices, self.codebook())

    def forward(self, z: torch.Tensor) -> QuantizeOut:  # z [B,D,h,w]
        b, d, h, w = z.shape
        z = z.permute(0, 2, 3, 1)  # [B,h,w,D]
        if self.cfg.codebook_l2_norm:
            z = F.normalize(z, dim=-1)
        emb = self.codebook()  # [K,D]
        idx, dist = nearest_code(z.reshape(-1, d), emb)  # [N], [N,K]
        z_q = emb[idx].view_as(z)  # [B,h,w,D]
        codebook_loss = commit_loss = entropy_loss = z.new_zeros(())
        if self.training:
            if self.cfg.codebook_show_usage:  # the window's oldest ids make room for this batch's last ones
                n, used = min(idx.numel(), USAGE_WINDOW), self.codebook_used
                used[:-n] = used[n:].clone()
                used[-n:] = idx[-n:].to(used.dtype)
            codebook_loss = F.mse_loss(z_q, z.detach())
            commit_loss = self.cfg.commit_loss_beta * F.mse_loss(z, z_q.detach())
            if self.cfg.entropy_loss_ratio > 0:
                entropy_loss = self.cfg.entropy_loss_ratio * _entropy_loss(-dist)
        z_q = z + (z_q - z).detach()  # straight-through estimator
        return QuantizeOut(
            z_q=z_q.permute(0, 3, 1, 2).contiguous(),
            latents=z.permute(0, 3, 1, 2),
            indices=idx.view(b, h, w),
            codebook_loss=codebook_loss,
            commit_loss=commit_loss,
            entropy_loss=entropy_loss,
        )


class VQModel(nn.Module):
    """LlamaGen VQ tokenizer. Images are [B,3,H,W] in [-1,1]; token grids are [B,H/f,W/f]."""

    def __init__(self, config: VQConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = Coder(config, encoder=True)
        self.decoder = Coder(config, encoder=False)
        self.quantize = VectorQuantizer(config)
        self.quant_conv = nn.Conv2d(config.z_channels, config.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.codebook_embed_dim, config.z_channels, 1)

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """[B,3,H,W] in [-1,1] -> code ids [B,H/f,W/f] (int64)."""
        return self.quantize(self.quant_conv(self.encoder(images))).indices

    def decode_latents(self, z_q: torch.Tensor) -> torch.Tensor:
        """Quantised latents [B,D,h,w] -> images [B,3,h*f,w*f]."""
        return self.decoder(self.post_quant_conv(z_q))

    def decode_indices(self, indices: torch.Tensor) -> torch.Tensor:
        """Code ids [B,h,w] (or [B,h*w] with a square grid) -> images [B,3,h*f,w*f] in about [-1,1]."""
        if indices.ndim == 2:
            side = math.isqrt(indices.shape[1])
            if side * side != indices.shape[1]:
                raise ValueError(f"flat token sequence of length {indices.shape[1]} is not a square grid")
            indices = indices.view(indices.shape[0], side, side)
        z_q = self.quantize.lookup(indices.long()).permute(0, 3, 1, 2)  # [B,D,h,w]
        return self.decode_latents(z_q)

    def forward(self, images: torch.Tensor) -> QuantizeOut:
        q = self.quantize(self.quant_conv(self.encoder(images)))
        return replace(q, recon=self.decode_latents(q.z_q))
