"""Train the image-metrics classifier (class = source photo) on train-split crops; writes fp16 weights + config.json."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from specgen import checkpoints, registry
from specgen.data.images import IMAGE_CLASSES, ImageCrops, ImageCropsConfig, crops
from specgen.errors import UsageError
from specgen.image.metrics import class_accuracy
from specgen.models.classifier import ImageClassifier
from specgen.train.checkpoint import brief, fp16_state, shipped_copy, write_entry, write_json
from specgen.train.image_gpt import load_vq
from specgen.train.loop import At, Loop, LoopOptions, Optim, Progress, TrainTask
from specgen.train.optim import OptimConfig
from specgen.train.script import parse_recipe, print_metrics, run_script, script_parser


@dataclass(frozen=True)
class ClassifierTrainConfig(OptimConfig):
    """Everything a classifier run depends on (a YAML recipe sets any subset; AdamW/schedule keys: OptimConfig)."""

    widths: list[int] = field(default_factory=lambda: [32, 64, 128])
    groups: int = 8
    dropout: float = 0.1
    crop_size: int = 64
    data_seed: int = 0
    seed: int = 0
    steps: int = 1200
    batch_size: int = 64
    lr: float = 2e-3  # OptimConfig keys with this recipe's defaults (beta2: AdamW's own default)
    beta2: float = 0.999
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    blur_p: float = 0.25  # per image: 2x average-pool then bilinear upsample
    noise_p: float = 0.25  # per image: add N(0, noise_std^2) pixel noise
    noise_std: float = 0.05
    jitter: float = 0.1  # per image: brightness +-jitter, contrast x(1 +- jitter), same for all channels
    eval_samples: int = 1024  # held-out crops (eval split), 64 per class
    eval_every: int = 200
    log_every: int = 50
    vq: str = "tiny-image-vq"  # VQ folder or registry name (a name: any cwd); "" = no VQ pool/report
    vq_pool: int = 1536  # train crops (seed data_seed + 1) reconstructed once by `vq`, mixed into batches
    vq_fraction: float = 0.25  # share of every batch drawn from that pool
    num_threads: int = 1


def augment(images: torch.Tensor, cfg: ClassifierTrainConfig, gen: torch.Generator) -> torch.Tensor:
    """Random blur / noise / global jitter of images [B,3,S,S] in [-1,1] (same shape out)."""
    b = images.shape[0]
    u = lambda: torch.rand(b, 1, 1, 1, generator=gen).to(images.device)  # noqa: E731
    blurred = F.interpolate(F.avg_pool2d(images, 2), size=images.shape[-2:], mode="bilinear", align_corners=False)
    x = torch.where(u() < cfg.blur_p, blurred, images)
    noise = torch.randn(x.shape, generator=gen).to(x.device) * cfg.noise_std
    x = torch.where(u() < cfg.noise_p, x + noise, x)
    mean = x.mean(dim=(1, 2, 3), keepdim=True)  # [B,1,1,1]
    x = (x - mean) * (1 + cfg.jitter * (2 * u() - 1)) + mean + cfg.jitter * (2 * u() - 1)
    return x.clamp(-1, 1)


@torch.no_grad()
def evaluate(model: ImageClassifier, cfg: ClassifierTrainConfig) -> dict[str, Any]:
    """Accuracy on held-out eval-split crops and on unseen train-region crops (seed data_seed + 2), real and VQ'd
    (docs/training.md: why both)."""
    eval_images, eval_labels = crops("eval", cfg.eval_samples, cfg.crop_size, cfg.data_seed)  # [N,3,S,S], [N]
    n = cfg.eval_samples // 2
    fresh_images, fresh_labels = crops("train", n, cfg.crop_size, cfg.data_seed + 2)  # [n,3,S,S], [n]
    model.eval()
    preds = torch.cat([model(c).argmax(-1) for c in eval_images.split(256)])  # [N]
    m: dict[str, Any] = {
        "heldout_accuracy": float((preds == eval_labels).float().mean()),
        "heldout_per_class": {c: float((preds[eval_labels == i] == i).float().mean())
                              for i, c in enumerate(IMAGE_CLASSES)},
        "eval_samples": cfg.eval_samples,
        "unseen_train_crops_accuracy": class_accuracy(model, fresh_images, fresh_labels), "unseen_train_crops": n,
    }
    if cfg.vq:
        m["heldout_vq_recon_accuracy"] = class_accuracy(model, vq_reconstructions(cfg.vq, eval_images), eval_labels)
        m["unseen_train_crops_vq_recon_accuracy"] = class_accuracy(
            model, vq_reconstructions(cfg.vq, fresh_images), fresh_labels)
        m["vq"] = cfg.vq
    return m


@torch.no_grad()
def vq_reconstructions(vq_ref: str, images: torch.Tensor) -> torch.Tensor:
    """Images [N,3,S,S] passed through the VQ `vq_ref` (a folder or registry name) -> [N,3,S,S]."""
    vq = load_vq(vq_ref)[0]
    return torch.cat([vq(c).recon.clamp(-1, 1) for c in images.split(64)])


class ClassifierTask(TrainTask):
    """Cross-entropy on augmented train crops, a share of every batch from the VQ pool. One generator streams over
    the whole run (pool picks, then augmentations, every step) and dropout draws from the global RNG: the run
    is one uninterrupted process (no resume, no data parallelism), as it always was."""

    def __init__(self, cfg: ClassifierTrainConfig, model: ImageClassifier, train_data: ImageCrops,
                 pool_images: torch.Tensor, pool_labels: torch.Tensor, k: int, eval_images: torch.Tensor,
                 eval_labels: torch.Tensor) -> None:
        self.cfg, self.model, self.train_data, self.k = cfg, model, train_data, k
        self.pool_images, self.pool_labels = pool_images, pool_labels
        self.eval_images, self.eval_labels = eval_images, eval_labels
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.modules = {"model": model}
        self.optims = {"optim": Optim(cfg.adamw(model.parameters()), lambda s: cfg.lr_at(s, cfg.steps), cfg.grad_clip)}

    def batch(self, at: At) -> tuple[torch.Tensor, torch.Tensor]:
        if at.shards > 1:
            raise UsageError("the classifier trainer runs in one process without grad accumulation")
        b, k = self.cfg.batch_size, self.k
        images, labels = self.train_data.batch(range(at.step * b, (at.step + 1) * b - k))  # [B-k,...]
        if k:
            pick = torch.randint(0, len(self.pool_images), (k,), generator=self.gen)
            images, labels = torch.cat([images, self.pool_images[pick]]), torch.cat([labels, self.pool_labels[pick]])
        return images, labels  # [B,...]

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        images, labels = batch
        logits = self.model(augment(images, self.cfg, self.gen))  # [B,C]
        loss = F.cross_entropy(logits, labels, label_smoothing=self.cfg.label_smoothing)
        return loss, {"loss": loss.item(), "train_acc": (logits.detach().argmax(-1) == labels).float().mean().item()}

    def evaluate(self, progress: Progress) -> dict[str, Any]:
        self.model.eval()
        acc = class_accuracy(self.model, self.eval_images, self.eval_labels)
        self.model.train()
        return {"step": progress.step, "heldout_accuracy": acc, "cpu_s": round(progress.cpu, 1)}


def train(cfg: ClassifierTrainConfig, out: Path, log: Callable[[str], None] = lambda s: None,
          device: str = "cpu") -> dict[str, Any]:
    """Train, measure the fp16 weights and write them to OUT (model.safetensors, config.json); returns the metrics."""
    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    data_cfg = ImageCropsConfig(crop_size=cfg.crop_size, seed=cfg.data_seed)
    train_data = ImageCrops(replace(data_cfg, split="train", num_samples=cfg.steps * cfg.batch_size))
    eval_images, eval_labels = crops("eval", cfg.eval_samples, cfg.crop_size, cfg.data_seed)  # [N,3,S,S], [N]
    kwargs = {"num_classes": train_data.num_classes, "widths": list(cfg.widths), "groups": cfg.groups,
              "image_size": cfg.crop_size, "dropout": cfg.dropout}
    pool_images, pool_labels = torch.zeros(0, 3, cfg.crop_size, cfg.crop_size), torch.zeros(0, dtype=torch.long)
    if cfg.vq and cfg.vq_pool > 0:
        c = time.process_time()
        pool_images, pool_labels = crops("train", cfg.vq_pool, cfg.crop_size, cfg.data_seed + 1)  # [P,3,S,S], [P]
        pool_images = vq_reconstructions(cfg.vq, pool_images)
        log(f"VQ pool: {cfg.vq_pool} train crops reconstructed by {cfg.vq} ({time.process_time() - c:.0f}s cpu)")
    k = round(cfg.vq_fraction * cfg.batch_size) if len(pool_images) else 0  # pool images per batch
    model = ImageClassifier(**{**kwargs, "widths": tuple(cfg.widths)}).train()
    task = ClassifierTask(cfg, model, train_data, pool_images, pool_labels, k, eval_images, eval_labels)
    log(f"classifier {sum(p.numel() for p in model.parameters()) / 1e3:.1f}K params, {cfg.steps} steps x "
        f"{cfg.batch_size}; config {json.dumps(asdict(cfg))}")
    loop = Loop(LoopOptions.of(cfg, device=device), log)
    progress = loop.run(task)  # no train state: OUT is the shipped folder, and a run takes minutes
    model.cpu()
    measured = evaluate(shipped_copy(model).eval(), cfg)
    metrics = progress.summary({**measured, "train_cpu_seconds": round(progress.cpu, 1)})
    doc = {
        "builder": "image-classifier", "kind": "classifier", "kwargs": kwargs, "modality": "image",
        "classes": list(train_data.classes), "feature_dim": cfg.widths[-1], "image_size": cfg.crop_size,
        "dtype": "float16", "command": "python -m specgen.train.classifier",
        "purpose": "feature space for FID and class accuracy of generated crops (not comparable with Inception FID)",
        "train_config": asdict(cfg), "data": {**asdict(data_cfg), "classes": list(train_data.classes)},
        "metrics": metrics,
    }
    write_entry(out, fp16_state(model), doc, sort_keys=False)
    return metrics


def evaluate_only(cfg: ClassifierTrainConfig, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Re-measure OUT's shipped weights with `evaluate` and merge the result into OUT/config.json's metrics."""
    torch.set_num_threads(cfg.num_threads)
    doc = json.loads((out / "config.json").read_text())
    metrics = {**doc.get("metrics", {}), **evaluate(checkpoints.load_module(registry.entry_at(out)), cfg)}
    write_json(out / "config.json", {**doc, "metrics": metrics}, sort_keys=False)
    log(f"re-evaluated {out}: {json.dumps(brief(metrics))}")
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = script_parser("specgen.train.classifier", __doc__, "recipes/tiny/image-classifier.yaml",
                           config_required=True, out_help="output folder for model.safetensors + config.json")
    parser.add_argument("--evaluate-only", action="store_true",
                        help="re-measure the weights already in OUT and update the metrics in OUT/config.json")
    cfg, args, log = parse_recipe(parser, ClassifierTrainConfig, argv)
    out = Path(args.out)
    metrics = evaluate_only(cfg, out, log) if args.evaluate_only else train(cfg, out, log, args.device)
    log(f"done (fp16 weights): {json.dumps(brief(metrics))}")
    return print_metrics(metrics)


if __name__ == "__main__":
    raise SystemExit(run_script(main))
