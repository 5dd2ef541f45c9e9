"""Train the tiny LlamaGen-architecture VQ on bundled image crops; resumable, writes fp16 safetensors + config.json."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from specgen import devices
from specgen.data.images import ImageCrops, ImageCropsConfig, crops
from specgen.errors import UsageError
from specgen.models.vq import VQ_CONFIGS, VQConfig, VQModel
from specgen.train.checkpoint import fp16_state, shipped_copy, write_entry
from specgen.train.loop import At, Loop, LoopOptions, Optim, Progress, StateFile, TrainTask, check_choices
from specgen.train.optim import OptimConfig
from specgen.train.script import parse_recipe, print_metrics, run_script, script_parser


@dataclass(frozen=True)
class VQTrainConfig(OptimConfig):
    """Everything a VQ training run depends on (a YAML recipe sets any subset; AdamW/schedule keys: OptimConfig)."""

    model: str = "vq-tiny"  # a VQ_CONFIGS name
    model_overrides: dict[str, Any] = field(default_factory=dict)  # VQConfig fields to change
    crop_size: int = 64
    data_seed: int = 0
    seed: int = 0
    steps: int = 3000
    stop_after: int = 0  # > 0: stop (and export) at this step of the `steps`-long schedule
    batch_size: int = 32
    patch_size: int = 32  # train on random patch_size sub-crops of each crop for the first steps ...
    patch_fraction: float = 0.7  # ... this fraction of them; the rest use the full crop_size
    warmup_steps: int = 100  # an OptimConfig key with this recipe's default
    l1_weight: float = 1.0
    mse_weight: float = 1.0
    edge_weight: float = 0.5
    codebook_weight: float = 1.0
    restart_every: int = 100  # 0 disables dead-code restarts
    restart_until: float = 0.8  # no restarts in the last (1 - this) fraction of steps
    eval_samples: int = 256
    eval_every: int = 250
    ckpt_every: int = 50
    log_every: int = 25
    num_threads: int = 1


def psnr(recon: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-image PSNR in dB of images in [-1,1] ([B,3,H,W] -> [B]), measured on the [0,1] scale."""
    mse = ((recon.clamp(-1, 1) - target) / 2).pow(2).flatten(1).mean(1)  # [B]
    return 10 * torch.log10(1.0 / mse.clamp_min(1e-10))


@torch.no_grad()
def evaluate(model: VQModel, images: torch.Tensor, batch_size: int = 64) -> dict[str, float]:
    """Held-out reconstruction PSNR, L1 and codebook usage/perplexity over `images` [N,3,H,W]."""
    model.eval()
    scores, l1s, counts = [], [], torch.zeros(model.config.codebook_size)
    for chunk in images.split(batch_size):
        out = model(chunk)
        scores.append(psnr(out.recon, chunk))
        l1s.append((out.recon.clamp(-1, 1) - chunk).abs().flatten(1).mean(1))
        counts += torch.bincount(out.indices.flatten(), minlength=counts.numel()).float()
    model.train()  # (the trainer's model, or a shipped copy of it)
    p = counts / counts.sum()
    entropy = -(p[p > 0] * p[p > 0].log()).sum()
    return {
        "psnr": float(torch.cat(scores).mean()),
        "l1": float(torch.cat(l1s).mean()),
        "codebook_usage": float((counts > 0).float().mean()),
        "codebook_perplexity": float(entropy.exp()),
    }


class VQTrainer(TrainTask):
    """Owns model, optimiser and run directory: `state.safetensors` (resume), `model.safetensors`, `config.json`.
    One process only: dead-code restarts count code hits per process (`batch` refuses shards)."""

    def __init__(self, cfg: VQTrainConfig, out_dir: str | os.PathLike, log: Callable[[str], None] = lambda s: None,
                 device: str = "cpu"):
        self.cfg, self.out, self.log, self.device = cfg, Path(out_dir), log, device
        torch.set_num_threads(cfg.num_threads)
        torch.manual_seed(cfg.seed)
        check_choices(cfg, {"model": VQ_CONFIGS})
        self.model_cfg = VQConfig(**{**VQ_CONFIGS[cfg.model].to_dict(), **cfg.model_overrides})
        self.model = VQModel(self.model_cfg).train()
        self.opt = cfg.adamw(self.model.parameters())
        self.modules = {"model": self.model}
        self.optims = {"optim": Optim(self.opt, lambda s: cfg.lr_at(s, cfg.steps), cfg.grad_clip)}
        data_cfg = ImageCropsConfig(crop_size=cfg.crop_size, seed=cfg.data_seed)
        self.train_data = ImageCrops(replace(data_cfg, split="train", num_samples=cfg.steps * cfg.batch_size))
        self.eval_images, _ = crops("eval", cfg.eval_samples, cfg.crop_size, cfg.data_seed)  # [N,3,C,C]
        self.hits = torch.zeros(self.model_cfg.codebook_size)  # code hits since the last restart check
        self._out = None  # the last step's VQ output (code hits, latents for restarts)

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return {"trainer.hits": self.hits}

    def export(self, p: Progress, history: list[dict[str, Any]], last: dict[str, Any], **extra: Any) -> dict[str, Any]:
        """Write the shipping artefacts, fp16 `model.safetensors` + `config.json`, with the run's metrics (held-out ones
        from `last`, an evaluation); returns those metrics."""
        metrics = {
            "step": p.step, "steps": self.cfg.steps, "train_seconds": round(p.elapsed, 1),
            "train_cpu_seconds": round(p.cpu, 1),
            "heldout_psnr": last.get("psnr"), "heldout_l1": last.get("l1"),
            "codebook_usage": last.get("codebook_usage"), "codebook_perplexity": last.get("codebook_perplexity"),
            "eval_samples": self.cfg.eval_samples, "history": history, **extra,
        }
        doc = {
            "builder": "vq",
            "kind": "vq",
            "model": self.cfg.model,
            "config": self.model_cfg.to_dict(),
            "kwargs": self.model_cfg.to_dict(),  # what the "vq" builder takes (checkpoints.load_module)
            "downsample": self.model_cfg.downsample,
            "image_size": self.cfg.crop_size,
            "grid_size": self.cfg.crop_size // self.model_cfg.downsample,
            "dtype": "float16",
            "command": "python -m specgen.train.vq",
            "train_config": asdict(self.cfg),
            "data": {"classes": list(self.train_data.classes), **asdict(self.train_data.config)},
            "metrics": metrics,
        }
        write_entry(self.out, fp16_state(self.model), doc, sort_keys=False)
        return metrics

    @torch.no_grad()
    def _restart_dead_codes(self, latents: torch.Tensor, step: int) -> int:
        """Re-seed codes with no hits since the last check from random current latents ([B,D,h,w])."""
        dead = (self.hits == 0).nonzero().flatten()
        self.hits.zero_()
        if dead.numel() == 0:
            return 0
        gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + step)  # reproducible across resumes
        pool = latents.permute(0, 2, 3, 1).reshape(-1, latents.shape[1])  # [N,D]
        pick = torch.randint(0, pool.shape[0], (dead.numel(),), generator=gen).to(pool.device)
        new = pool[pick] + 0.01 * torch.randn(dead.numel(), pool.shape[1], generator=gen).to(pool.device)  # [n_dead,D]
        weight = self.model.quantize.embedding.weight
        weight[dead.to(weight.device)] = F.normalize(new, dim=-1) if self.model_cfg.codebook_l2_norm else new
        state = self.opt.state.get(weight, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                state[key][dead.to(weight.device)] = 0.0
        return int(dead.numel())

    def batch(self, at: At) -> torch.Tensor:
        if at.shards > 1:
            raise UsageError("the VQ trainer runs in one process without grad accumulation (dead-code restarts "
                             "count code hits per process)")
        cfg, step = self.cfg, at.step  # the images of a step are a function of (config, step): resume-safe
        images, _ = self.train_data.batch(range(step * cfg.batch_size, (step + 1) * cfg.batch_size))  # [B,3,C,C]
        if step < int(cfg.patch_fraction * cfg.steps) and cfg.patch_size < cfg.crop_size:
            rng = np.random.default_rng([cfg.seed, step])
            p = cfg.patch_size
            ys, xs = rng.integers(0, cfg.crop_size - p + 1, size=(2, cfg.batch_size))
            images = torch.stack([im[:, y : y + p, x : x + p] for im, y, x in zip(images, ys, xs)])  # [B,3,P,P]
        return images

    def loss(self, images: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.cfg
        out = self.model(images)
        l1 = F.l1_loss(out.recon, images)
        mse = F.mse_loss(out.recon, images)
        dx, dy = (lambda t: t[..., :, 1:] - t[..., :, :-1]), (lambda t: t[..., 1:, :] - t[..., :-1, :])
        edge = F.l1_loss(dx(out.recon), dx(images)) + F.l1_loss(dy(out.recon), dy(images))  # L1 of image gradients
        loss = cfg.l1_weight * l1 + cfg.mse_weight * mse + cfg.edge_weight * edge + cfg.codebook_weight * out.quant_loss
        self._out = out
        return loss, {
            "loss": float(loss.detach()), "l1": float(l1.detach()), "mse": float(mse.detach()),
            "edge": float(edge.detach()),
            "codebook": float(out.codebook_loss.detach()), "commit": float(out.commit_loss.detach()),
            "psnr": float(psnr(out.recon.detach(), images).mean()),
        }

    def after_step(self, progress: Progress) -> dict[str, float]:
        """Count the step's code hits; every `restart_every` steps (before `restart_until`) re-seed unused codes."""
        cfg, out, step = self.cfg, self._out, progress.step
        self._out = None
        self.hits += torch.bincount(out.indices.flatten(), minlength=self.hits.numel()).float().cpu()
        restarted = 0
        if cfg.restart_every and step % cfg.restart_every == 0 and step < cfg.restart_until * cfg.steps:
            restarted = self._restart_dead_codes(out.latents.detach(), step)
        return {"restarted": restarted}

    def evaluate(self, progress: Progress) -> dict[str, Any]:
        """Held-out metrics; the fp16 export is rewritten with them (a usable VQ at every evaluation)."""
        ev = evaluate(self.model, self.eval_images.to(devices.module_device(self.model)))
        record = {"step": progress.step, "elapsed_s": round(progress.elapsed, 1), "cpu_s": round(progress.cpu, 1), **ev}
        self.export(progress, [*progress.history, record], record)
        return record

    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        loop = Loop(LoopOptions.of(cfg, device=self.device), self.log)
        loop.log(f"model {cfg.model} ({sum(p.numel() for p in self.model.parameters()) / 1e6:.2f}M params) "
                 f"config {self.model_cfg.to_dict()}")
        progress = loop.run(self, StateFile(self.out / "state.safetensors", {"config": asdict(cfg)}))
        self.model.cpu()
        ev = evaluate(shipped_copy(self.model), self.eval_images)  # the shipped fp16 weights, not the fp32 copy
        metrics = self.export(progress, progress.history, ev, weights="fp16")
        self.log(f"done: {json.dumps(metrics)}")
        return metrics


def main(argv: list[str] | None = None) -> int:
    parser = script_parser("specgen.train.vq", __doc__, "recipes/tiny/vq-images.yaml", config_required=True)
    cfg, args, log = parse_recipe(parser, VQTrainConfig, argv)
    return print_metrics(VQTrainer(cfg, args.out, log, args.device).run())


if __name__ == "__main__":
    raise SystemExit(run_script(main))
