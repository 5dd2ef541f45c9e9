"""Train a MuLo-SD up/down-sampler pair between a low-res and the target's token grid (objective: docs/training.md)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from specgen import checkpoints
from specgen.errors import IncompatibleError, MissingDependencyError, UsageError
from specgen.image.neighbours import codebook_hash
from specgen.models.upsampler import UpDownSampler, UpsamplerConfig
from specgen.tensor_files import cached_tensors
from specgen.train.checkpoint import RESUME_LOOSE, Published, brief, fp16_state, publish, shipped_copy
from specgen.train.image_gpt import check_vq_name, crop_tokens, downscale, load_vq
from specgen.train.loop import At, Loop, LoopOptions, Optim, Progress, StateFile, TrainTask, check_choices
from specgen.train.optim import AdamWConfig


@dataclass(frozen=True)
class UpsamplerTrainConfig(AdamWConfig):
    """Everything a run depends on (a YAML recipe sets any subset; AdamW keys: AdamWConfig, at a constant lr)."""

    vq: str = "tiny-image-vq"  # VQ folder (config.json + model.safetensors) or a registry name (a name: any cwd)
    vq_name: str = "tiny-image-vq"  # registry name of that VQ, recorded in the pair's meta["vq"]
    scale: int = 2  # r: low-res grid = target grid / r (a power of two)
    warm_start: str = ""  # a smaller-scale pair (registry name or folder) to start from (2x -> 4x)
    crop_size: int = 64  # target image side in pixels (the tiny VQ: 64 -> 16 x 16 tokens)
    num_crops: int = 4096
    eval_crops: int = 128
    data_seed: int = 0
    token_cache: str = ".notes/upsampler_tokens"
    channels: int = 64
    blocks: int = 2
    kernel: int = 3
    skip: bool = False  # add the plain re-sampling of the input codes (specgen/models/upsampler.py); head starts at 0
    seed: int = 0
    steps: int = 1500
    batch_size: int = 16  # crops per micro-batch (an optimiser step: grad_accum x processes of them)
    grad_accum: int = 1  # micro-batches per optimiser step
    lr: float = 3e-4  # AdamWConfig keys with this recipe's defaults
    weight_decay: float = 0.01
    beta2: float = 0.99
    disc_lr: float = 5e-4  # the discriminators' (same AdamW keys otherwise)
    mse_weight: float = 1.0
    perceptual: str = "auto"  # auto | lpips | vq-features | none
    perceptual_weight: float = 1.0
    commit_weight: float = 1.0
    latent_weight: float = 0.0  # NOT in the paper: MSE of latents to the real image's code vectors (0 = off)
    gan_weight: float = 0.25
    gan_start: int = 200  # steps without the adversarial term (paper: 20k of 150k)
    disc_channels: int = 32
    lecam_weight: float = 0.001
    lecam_decay: float = 0.999
    augment: bool = True
    log_every: int = 10
    eval_every: int = 250
    ckpt_every: int = 25
    num_threads: int = 1
    name: str = "image-upsampler-2x"  # registry name ("" = do not register)
    ship_dir: str = ""  # also write model.safetensors + config.json here


def pair_dataset(cfg: UpsamplerTrainConfig, vq, digest: str, log: Callable[[str], None]) -> dict[str, torch.Tensor]:
    key = f"vq{digest}-seed{cfg.data_seed}-crop{cfg.crop_size}-x{cfg.scale}-train{cfg.num_crops}-eval{cfg.eval_crops}"
    path = Path(cfg.token_cache) / f"{key}.safetensors"

    def build() -> dict[str, torch.Tensor]:
        log(f"tokenising crops (high {cfg.crop_size}px, low {cfg.crop_size // cfg.scale}px) -> {path}")
        return {f"{split}_{k}": v for split, n in (("train", cfg.num_crops), ("eval", cfg.eval_crops))
                for k, v in crop_tokens(vq, split, n, cfg.data_seed, cfg.crop_size, cfg.scale, log).items()}

    return cached_tensors(path, build, log)


def vq_features(vq, x: torch.Tensor) -> list[torch.Tensor]:
    """Activations of the frozen VQ encoder after conv_in and after every resolution level, each at its level's
    resolution (before the level's downsample: the shipped up-sampler was trained on these)."""
    h = vq.encoder.conv_in(x)
    feats = [h]
    for level in vq.encoder.conv_blocks:
        h = level.body(h)
        feats.append(h)
        h = level.resampled(h)
    return feats


class VQFeatureDistance(nn.Module):
    """LPIPS-style distance (unit layer weights) in the frozen VQ encoder's feature space: the offline substitute."""

    name = "vq-features"

    def __init__(self, vq) -> None:
        super().__init__()
        self.vq = vq

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        unit = lambda f: f / (f.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)  # noqa: E731 - unit length over channels
        total = a.new_zeros(())
        for fa, fb in zip(vq_features(self.vq, a), vq_features(self.vq, b)):
            total = total + (unit(fa) - unit(fb)).pow(2).sum(1).mean()
        return total


def perceptual_loss(kind: str, vq) -> nn.Module | None:
    """The distance `perceptual` names: auto is LPIPS (VGG) if the package and the VGG weights are already on this
    machine (nothing is downloaded), else the VQ-feature distance."""
    if kind == "none":
        return None
    if kind in ("auto", "lpips"):
        try:
            import lpips  # optional dependency
        except ImportError:
            lpips = None
        if lpips is not None and any((Path(torch.hub.get_dir()) / "checkpoints").glob("vgg16-*.pth")):
            net = lpips.LPIPS(net="vgg", verbose=False).eval()
            net.name = "lpips"  # one distance per image: the trainer takes their mean
            return net
        if kind == "lpips":
            raise MissingDependencyError("perceptual=lpips needs the lpips package and the VGG16 weights in the "
                                         "torch hub cache (nothing is downloaded); use perceptual=vq-features")
    return VQFeatureDistance(vq)


class PatchGAN(nn.Module):
    """Three-convolution PatchGAN (Isola et al.): per-patch real/fake logits [B, 1, h, w]."""

    def __init__(self, channels: int = 32) -> None:
        super().__init__()
        c = channels
        self.net = nn.Sequential(
            nn.Conv2d(3, c, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(c, 2 * c, 4, 2, 1), nn.GroupNorm(8 if (2 * c) % 8 == 0 else 1, 2 * c), nn.LeakyReLU(0.2),
            nn.Conv2d(2 * c, 1, 3, 1, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Differentiable augmentation: random horizontal flip and translation (<= side/8, zero fill)."""
    if float(torch.rand((), generator=g)) < 0.5:
        x = x.flip(-1)
    s = max(1, x.shape[-1] // 8)
    dy, dx = (int(v) for v in torch.randint(-s, s + 1, (2,), generator=g))
    x = F.pad(x, (s, s, s, s))
    return x[..., s + dy : s + dy + x.shape[-2] - 2 * s, s + dx : s + dx + x.shape[-1] - 2 * s]


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(F.mse_loss(a.clamp(-1, 1), b.clamp(-1, 1)))
    return 10 * math.log10(4.0 / max(mse, 1e-12))


@torch.no_grad()
def evaluate(pair: UpDownSampler, vq, data: dict, r: int) -> dict[str, float]:
    """Held-out token agreement and PSNR of U_r / D_r against the real crops, next to naive baselines."""
    device = pair.codebook.device
    hi, lo = data["eval_hi"].long().to(device), data["eval_lo"].long().to(device)
    x_hi = data["eval_pixels"].to(device).float() / 127.5 - 1.0  # uint8 pixels -> [-1, 1]
    x_lo = downscale(x_hi, r)
    out: dict[str, float] = {}
    up = torch.cat([pair.upsample_tokens(lo[i : i + 64]) for i in range(0, lo.shape[0], 64)])
    down = torch.cat([pair.downsample_tokens(hi[i : i + 64]) for i in range(0, hi.shape[0], 64)])
    naive_up = lo.repeat_interleave(r, 1).repeat_interleave(r, 2)
    naive_down = hi[:, ::r, ::r]
    dec = lambda t: torch.cat([vq.decode_indices(t[i : i + 64]) for i in range(0, t.shape[0], 64)])  # noqa: E731
    for side, got, naive, real, x in (("up", up, naive_up, hi, x_hi), ("down", down, naive_down, lo, x_lo)):
        out[f"{side}_token_acc"] = float((got == real).float().mean())
        out[f"{side}_token_acc_naive"] = float((naive == real).float().mean())
        out[f"{side}_psnr"] = psnr(dec(got), x)
        out[f"{side}_psnr_naive"] = psnr(dec(naive), x)
        out[f"{side}_psnr_vq_ceiling"] = psnr(dec(real), x)
    return {k: round(v, 4) for k, v in out.items()}


class PairTask(TrainTask):
    """The pair's objective and, once the GAN is on, the discriminators' hinge + LeCam step.

    The two losses reach disjoint parameters (discriminators frozen in the generator's term, images detached in
    theirs), so computing both before either optimiser steps changes nothing."""

    def __init__(self, cfg: UpsamplerTrainConfig, model: nn.ModuleDict, vq, data: dict[str, torch.Tensor],
                 perc: nn.Module | None) -> None:
        self.cfg, self.model, self.pair, self.vq, self.data, self.perc = cfg, model, model.pair, vq, data, perc
        self.modules = {"model": model}
        self.optims = {"opt_g": Optim(cfg.adamw(model.pair.parameters()), lambda s: cfg.lr, cfg.grad_clip),
                       "opt_d": Optim(cfg.adamw(model.disc.parameters(), cfg.disc_lr), lambda s: cfg.disc_lr)}
        self.ema = {"up": [0.0, 0.0], "down": [0.0, 0.0]}  # LeCam's EMAs of each discriminator's real / fake outputs

    def batch(self, at: At):
        d = self.data
        idx, g = at.draw(self.cfg.seed, self.cfg.steps, d["train_hi"].shape[0], self.cfg.batch_size)
        return d["train_pixels"][idx], d["train_lo"][idx].long(), d["train_hi"][idx].long(), g, at.step

    def lecam(self, side: str, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
        """LeCam regulariser (Tseng et al. 2021) against EMAs of the discriminator's real/fake outputs."""
        d, ema = self.cfg.lecam_decay, self.ema[side]
        ema[:] = d * ema[0] + (1 - d) * real.mean().item(), d * ema[1] + (1 - d) * fake.mean().item()
        return F.relu(real - ema[1]).pow(2).mean() + F.relu(ema[0] - fake).pow(2).mean()

    def render(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Straight-through decode of latents; returns (image, commitment loss)."""
        pair = self.pair
        e = pair.embed(pair.quantize(z.detach()))
        commit = F.mse_loss(z, e)
        return self.vq.decode_latents(z + (e - z).detach()), commit

    def loss(self, batch):
        cfg, pair, model, perc = self.cfg, self.pair, self.model, self.perc
        pixels, lo, hi, g, step = batch
        x_hi = pixels.float() / 127.5 - 1.0  # uint8 pixels -> [-1, 1]
        x_lo = downscale(x_hi, cfg.scale)
        gan_on = cfg.gan_weight > 0 and step >= cfg.gan_start
        z_up = pair.up_latents(lo)
        z_dn = pair.down_latents(hi)
        img_up, c_up = self.render(z_up)
        img_dn, c_dn = self.render(z_dn)
        logs: dict[str, float] = {}
        loss = img_up.new_zeros(())
        if cfg.latent_weight > 0:  # optional shortcut for short CPU runs (documented deviation)
            lat_up = F.mse_loss(z_up, pair.embed(hi))
            lat_dn = F.mse_loss(z_dn, pair.embed(lo))
            loss = loss + cfg.latent_weight * (lat_up + lat_dn)
            logs["up_latent"], logs["down_latent"] = lat_up.item(), lat_dn.item()
        for side, img, real, commit in (("up", img_up, x_hi, c_up), ("down", img_dn, x_lo, c_dn)):
            mse = F.mse_loss(img, real)
            part = cfg.mse_weight * mse + cfg.commit_weight * commit
            logs[f"{side}_mse"], logs[f"{side}_commit"] = mse.item(), commit.item()
            if perc is not None and cfg.perceptual_weight > 0:
                p = perc(img, real).mean()
                part = part + cfg.perceptual_weight * p
                logs[f"{side}_perc"] = p.item()
            if gan_on:
                model.disc[side].requires_grad_(False)
                adv = -model.disc[side](augment(img, g) if cfg.augment else img).mean()
                model.disc[side].requires_grad_(True)
                part = part + cfg.gan_weight * adv
                logs[f"{side}_gan"] = adv.item()
            loss = loss + part
        if not gan_on:
            return {"opt_g": loss}, logs
        d_loss = x_hi.new_zeros(())  # discriminator step: hinge + LeCam on augmented real / fake
        for side, img, real in (("up", img_up, x_hi), ("down", img_dn, x_lo)):
            dr = model.disc[side](augment(real, g) if cfg.augment else real)
            df = model.disc[side](augment(img.detach(), g) if cfg.augment else img.detach())
            d_side = F.relu(1 - dr).mean() + F.relu(1 + df).mean()
            d_loss = d_loss + d_side + cfg.lecam_weight * self.lecam(side, dr, df)
            logs[f"{side}_disc"] = d_side.item()
        return {"opt_g": loss, "opt_d": d_loss}, logs

    def evaluate(self, progress: Progress) -> dict[str, Any]:
        self.pair.eval()
        ev = evaluate(self.pair, self.vq, self.data, self.cfg.scale)
        self.pair.train()
        return {"step": progress.step, **ev, "elapsed_s": round(progress.elapsed, 1)}

    def meta(self) -> dict[str, Any]:
        return {"lecam": self.ema}

    def restore(self, meta: dict[str, Any], progress: Progress) -> None:
        self.ema = {k: list(meta["lecam"][k]) for k in self.ema}


def train(cfg: UpsamplerTrainConfig, out: Path, log: Callable[[str], None] = lambda s: None,
          device: str = "cpu", force: bool = False) -> Published | None:
    """Train (or resume) in `out` and register the pair (None on other ranks)."""
    torch.set_num_threads(cfg.num_threads)
    check_vq_name(cfg)
    vq, doc, digest = load_vq(cfg.vq)
    vq.requires_grad_(False)
    vcfg = vq.config
    # one-line usage errors for values no run could use (counts >= 1: specgen.config_checks)
    if cfg.scale < 2 or cfg.scale & (cfg.scale - 1):
        raise UsageError(f"scale must be a power of two >= 2 (2 or 4 in the paper), got {cfg.scale}")
    if cfg.crop_size % (cfg.scale * vcfg.downsample):
        raise UsageError(f"crop_size {cfg.crop_size} must be a multiple of scale x VQ downsample "
                         f"({cfg.scale} x {vcfg.downsample})")
    if cfg.kernel % 2 == 0:
        raise UsageError(f"kernel must be odd, got {cfg.kernel}")
    check_choices(cfg, {"perceptual": ("auto", "lpips", "vq-features", "none")})
    pcfg = UpsamplerConfig(codebook_size=vcfg.codebook_size, embed_dim=vcfg.codebook_embed_dim,
                           l2_norm=vcfg.codebook_l2_norm, scale=cfg.scale, channels=cfg.channels,
                           blocks=cfg.blocks, kernel=cfg.kernel, skip=cfg.skip)
    warm = None
    if cfg.warm_start:
        with checkpoints.input_named("warm_start", cfg.warm_start, "upsampler"):
            entry = checkpoints.find(cfg.warm_start)
        if entry.meta.get("builder") != "mulo-updown":
            raise UsageError(f"{entry.ref} is not a MuLo-SD up/down-sampler pair")
        warm = checkpoints.load_module(entry)
        if warm.cfg.scale >= cfg.scale or (warm.cfg.channels, warm.cfg.blocks, warm.cfg.kernel) != (
                cfg.channels, cfg.blocks, cfg.kernel):
            raise IncompatibleError(f"warm_start {cfg.warm_start} is a {warm.cfg.scale}x pair with channels "
                                    f"{warm.cfg.channels}, blocks {warm.cfg.blocks}, kernel {warm.cfg.kernel}; "
                                    f"a {cfg.scale}x run needs a smaller scale and the same widths")
        if not torch.allclose(warm.codebook.float(), vq.quantize.embedding.weight.float(), atol=1e-3):
            raise IncompatibleError(f"warm_start {cfg.warm_start} was trained for another VQ codebook than {cfg.vq}")
    data = pair_dataset(cfg, vq, digest, log)
    torch.manual_seed(cfg.seed)
    pair = UpDownSampler(pcfg)  # made first: the pair's initialisation draws before the discriminators'
    disc = nn.ModuleDict({"up": PatchGAN(cfg.disc_channels), "down": PatchGAN(cfg.disc_channels)})
    model = nn.ModuleDict({"pair": pair, "disc": disc}).train()  # one state dict for checkpoints
    with torch.no_grad():
        pair.codebook.copy_(vq.quantize.embedding.weight.float())
    if warm is not None:
        fresh = pair.warm_start_from(warm)
        log(f"warm start from {cfg.warm_start}: {len(fresh)} tensors of the new stage(s) left at initialisation")
    loop = Loop(LoopOptions.of(cfg, device=device), log)
    perc = perceptual_loss(cfg.perceptual, vq)
    vq.to(loop.device)
    if perc is not None:
        perc.to(loop.device)
    task = PairTask(cfg, model, vq, data, perc)
    r = cfg.scale
    n_params = sum(p.numel() for p in pair.up.parameters()), sum(p.numel() for p in pair.down.parameters())
    loop.log(f"up {n_params[0] / 1e6:.3f}M, down {n_params[1] / 1e6:.3f}M params; perceptual "
             f"{perc.name if perc else 'none'}; {data['train_hi'].shape[0]} train crops; grids "
             f"{tuple(data['train_lo'].shape[1:])} <-> {tuple(data['train_hi'].shape[1:])}")
    # what the state must match to resume: the config and the VQ's weights (its tokens, codebook and decoder)
    progress = loop.run(task, StateFile(out / "state.safetensors", {"config": asdict(cfg), "vq_sha": digest},
                                        RESUME_LOOSE))
    model.cpu(), vq.cpu()
    if not loop.is_main:  # rank 0 measures and registers
        return None
    metrics = progress.summary({**evaluate(shipped_copy(pair).eval(), vq, data, r), "perceptual":
                                perc.name if perc else "none", "params_up": n_params[0], "params_down": n_params[1]})
    grid_hi = cfg.crop_size // vcfg.downsample
    meta = {"builder": "mulo-updown", "kwargs": pcfg.to_dict(), "scale": r, "vq": cfg.vq_name, "vq_sha": digest,
            "codebook_hash": codebook_hash(vq.quantize.embedding.weight), "vocab_size": vcfg.codebook_size,
            "grid_low": grid_hi // r, "grid_high": grid_hi, "modality": "image", "parent": None,
            "warm_start": cfg.warm_start or None, "created_by": "specgen train-upsampler", "train_config": asdict(cfg),
            "metrics": metrics}
    log(f"done: {json.dumps(brief(metrics))}")
    return Published(metrics, publish("upsampler", cfg.name, cfg.ship_dir, fp16_state(pair), meta, "upsampler", force))

