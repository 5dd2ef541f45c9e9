"""MuLo-SD up-/down-sampler pair (2x or 4x per side), row-causal throughout (docs/methods/mulo-sd.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from specgen.models.vq import nearest_code


@dataclass(frozen=True)
class UpsamplerConfig:
    """Both networks of a pair: `scale` is the per-side factor r, 2 (one stage) or 4 (two) (train/upsampler.py)."""

    codebook_size: int = 512
    embed_dim: int = 8  # VQ code dimension
    l2_norm: bool = True  # the VQ normalises latents and codes before the nearest-code search
    scale: int = 2
    channels: int = 64
    blocks: int = 2  # residual blocks per stage and after the last stage
    kernel: int = 3  # odd; k x k convolutions with the rows below the centre masked
    skip: bool = False  # add nearest-repeat (up) / average-pool (down) of the input codes; head starts at 0

    @property
    def stages(self) -> int:
        return self.scale.bit_length() - 1

    def to_dict(self) -> dict:
        return asdict(self)


class RowCausalConv2d(nn.Module):
    """A k x k convolution masked to rows <= the centre: output row i only sees input rows <= i."""

    def __init__(self, c_in: int, c_out: int, kernel: int = 3) -> None:
        super().__init__()
        self.pad = kernel // 2
        self.conv = nn.Conv2d(c_in, c_out, (kernel // 2 + 1, kernel))  # the unmasked rows of the k x k kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, Cin, H, W] -> [B, Cout, H, W]
        return self.conv(F.pad(x, (self.pad, self.pad, self.pad, 0)))


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over channels at every position (row-causal, unlike GroupNorm over H x W)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ResBlock(nn.Module):
    """norm-SiLU-conv x2 with a residual (row-causal convolutions)."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = ChannelNorm(channels, 1e-6), RowCausalConv2d(channels, channels, kernel)
        self.norm2, self.conv2 = ChannelNorm(channels, 1e-6), RowCausalConv2d(channels, channels, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.silu(self.norm2(self.conv1(F.silu(self.norm1(x))))))


class Stage(nn.Module):
    """Residual blocks, then up (conv C -> 4C, PixelShuffle(2): h, w -> 2h, 2w; key `expand`) or down
    (PixelUnshuffle(2), conv 4C -> C: H, W -> H/2, W/2; key `reduce`)."""

    def __init__(self, c: int, blocks: int, kernel: int, up: bool) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[ResBlock(c, kernel) for _ in range(blocks)])
        self.up = up
        if up:
            self.expand = RowCausalConv2d(c, 4 * c, kernel)
        else:
            self.reduce = RowCausalConv2d(4 * c, c, kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, h, w] -> [B, C, 2h, 2w] or [B, C, h/2, w/2]
        x = self.blocks(x)
        return F.pixel_shuffle(self.expand(x), 2) if self.up else self.reduce(F.pixel_unshuffle(x, 2))


class Resampler(nn.Module):
    """One direction: stem conv, `stages` up or down stages, post blocks, head conv to the code dim."""

    def __init__(self, cfg: UpsamplerConfig, direction: str) -> None:
        super().__init__()
        c, k = cfg.channels, cfg.kernel
        self.direction = direction
        self.stem = RowCausalConv2d(cfg.embed_dim, c, k)
        self.stages = nn.Sequential(*[Stage(c, cfg.blocks, k, direction == "up") for _ in range(cfg.stages)])
        self.post = nn.Sequential(*[ResBlock(c, k) for _ in range(cfg.blocks)])
        self.norm_out = ChannelNorm(c, 1e-6)
        self.head = RowCausalConv2d(c, cfg.embed_dim, k)
        self.skip, self.scale = cfg.skip, cfg.scale
        if cfg.skip:
            nn.init.zeros_(self.head.conv.weight)
            nn.init.zeros_(self.head.conv.bias)

    def forward(self, z: torch.Tensor) -> torch.Tensor:  # code vectors [B, D, h, w] -> latents [B, D, h', w']
        out = self.head(F.silu(self.norm_out(self.post(self.stages(self.stem(z))))))
        if not self.skip:
            return out
        base = F.interpolate(z, scale_factor=self.scale, mode="nearest") if self.direction == "up" \
            else F.avg_pool2d(z, self.scale)
        return base + out


class UpDownSampler(nn.Module):
    """The pair (U_r, D_r) plus the frozen VQ codebook they embed from and quantise to. Row-causal: either network on
    an image's first rows gives exactly the first rows of its output on the whole image."""

    def __init__(self, cfg: UpsamplerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.up = Resampler(cfg, "up")
        self.down = Resampler(cfg, "down")
        self.register_buffer("codebook", torch.zeros(cfg.codebook_size, cfg.embed_dim))

    def codes(self) -> torch.Tensor:
        """The codebook as the VQ uses it for lookup and search: [V, D] (unit rows when l2_norm)."""
        return F.normalize(self.codebook, dim=-1) if self.cfg.l2_norm else self.codebook

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids [B, h, w] -> code vectors [B, D, h, w] (what the VQ decoder would see)."""
        return F.embedding(tokens, self.codes()).permute(0, 3, 1, 2)

    def finish(self, z: torch.Tensor) -> torch.Tensor:
        """Raw network outputs -> latents on the VQ's sphere (L2-normalised over D when l2_norm)."""
        return F.normalize(z, dim=1) if self.cfg.l2_norm else z

    def quantize(self, z: torch.Tensor) -> torch.Tensor:
        """Latents [B, D, h, w] -> nearest code ids [B, h, w] (the VQ quantiser's rule)."""
        b, d, h, w = z.shape
        return nearest_code(self.finish(z).permute(0, 2, 3, 1).reshape(-1, d), self.codes())[0].view(b, h, w)

    def up_latents(self, tokens: torch.Tensor) -> torch.Tensor:
        """Low-res ids [B, h, w] -> high-res latents [B, D, r*h, r*w]."""
        return self.finish(self.up(self.embed(tokens)))

    def down_latents(self, tokens: torch.Tensor) -> torch.Tensor:
        """High-res ids [B, H, W] (H, W multiples of r) -> low-res latents [B, D, H/r, W/r]."""
        return self.finish(self.down(self.embed(tokens)))

    @torch.no_grad()
    def upsample_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """U_r on token ids: [B, h, w] -> [B, r*h, r*w]."""
        return self.quantize(self.up_latents(tokens))

    @torch.no_grad()
    def downsample_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """D_r on token ids: [B, H, W] -> [B, H/r, W/r]."""
        r = self.cfg.scale
        if tokens.shape[-2] % r or tokens.shape[-1] % r:
            raise ValueError(f"down-sampling needs sides divisible by {r}, got {tuple(tokens.shape[-2:])}")
        return self.quantize(self.down_latents(tokens))

    def warm_start_from(self, smaller: "UpDownSampler") -> list[str]:
        """Copy a pair with fewer stages into this one (2x -> 4x); returns the keys left at initialisation."""
        mine, theirs = self.state_dict(), smaller.state_dict()
        copied = {k: v for k, v in theirs.items() if k in mine and mine[k].shape == v.shape}
        self.load_state_dict({**mine, **copied})
        return sorted(set(mine) - set(copied))
