"""Train the embedded tiny class-conditional LlamaGen GPT on VQ tokens of the bundled image crops (c2i objective)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from specgen import checkpoints, devices, registry
from specgen.data.images import IMAGE_CLASSES, ImageCrops, ImageCropsConfig
from specgen.decoding.recorder import FeatureRecorder
from specgen.decoding.sampling import SamplingParams
from specgen.errors import UsageError
from specgen.image.captions import Caption
from specgen.image.grid import image_grid
from specgen.image.target import cfg_target
from specgen.methods import run_batch
from specgen.models.llamagen import GPT_CONFIGS, find_multiple, llamagen_config
from specgen.models.transformer import Transformer
from specgen.tensor_files import cached_tensors
from specgen.train.checkpoint import brief, check_outputs, fp16_state, publish, shipped_copy
from specgen.train.loop import At, Loop, LoopOptions, Optim, Progress, StateFile, TrainTask
from specgen.train.optim import OptimConfig
from specgen.train.script import parse_recipe, print_metrics, registering, run_script, script_parser


@dataclass(frozen=True)
class ImageGPTTrainConfig(OptimConfig):
    """Everything an image-GPT run depends on (a YAML recipe sets any subset; AdamW/schedule keys: OptimConfig)."""

    vq: str = "tiny-image-vq"  # VQ folder (config.json + model.safetensors) or a registry name (a name: any cwd)
    vq_name: str = "tiny-image-vq"  # registry name of that VQ, recorded in the GPT's meta["vq"]
    token_cache: str = ".notes/image_tokens"
    num_crops: int = 16384  # train crops (class = i % num_classes)
    eval_crops: int = 512  # held-out crops (eval strip of every image)
    data_seed: int = 0
    model: str = "gpt-tiny"  # a GPT_CONFIGS name; the fields below override it when > 0
    n_layers: int = 0
    n_heads: int = 0
    dim: int = 0
    class_dropout: float = 0.1
    seed: int = 0
    steps: int = 800
    batch_size: int = 16  # crops per micro-batch (an optimiser step: grad_accum x processes of them)
    grad_accum: int = 1  # micro-batches per optimiser step
    weight_decay: float = 0.05  # an OptimConfig key with this recipe's default
    log_every: int = 10
    eval_every: int = 100
    ckpt_every: int = 20
    num_threads: int = 1
    samples_per_class: int = 4  # final evaluation samples (CFG, temperature 1, top-k 0, top-p 1)
    cfg_scale: float = 4.0
    name: str = "image-gpt"  # registry target name ("" = do not register)
    ship_dir: str = ""  # also write model.safetensors + config.json here (e.g. specgen/assets/image/gpt)

    def down(self) -> int:
        """Area downscale of every crop before tokenisation (1: the crops as they are)."""
        return 1


def vq_entry(ref: str, key: str = "vq") -> registry.Entry:
    """The VQ entry of a folder or registry name given as recipe key `key`; another kind of entry is a UsageError."""
    with checkpoints.input_named(key, ref, "vq"):
        entry = registry.entry_at(Path(ref)) if (Path(ref) / "config.json").is_file() else checkpoints.find(ref)
    if entry.meta.get("builder") != "vq":  # another model's weights would fail later, as an attribute error
        raise UsageError(f"{key}={ref}: {entry.ref} is not a VQ tokenizer (builder {entry.meta.get('builder')!r}); "
                         "name one such as tiny-image-vq")
    return entry


def check_vq_name(cfg) -> None:
    """`cfg.vq_name`, recorded as the registry name that decodes the trained model's tokens, names the VQ of
    `cfg.vq` (same weights): an unknown name left a GPT generate refuses, another VQ one that decodes wrongly."""
    if not cfg.vq_name:  # none recorded
        return
    named, used = vq_entry(cfg.vq_name, "vq_name"), vq_entry(cfg.vq)
    if registry.weights_digest(named) != registry.weights_digest(used):
        raise UsageError(f"vq_name={cfg.vq_name} is not the VQ of vq={cfg.vq} (other weights); name that VQ's "
                         "registry entry (or vq_name= to record none)")


def load_vq(ref: str):
    """(VQModel in eval mode, its config.json dict, sha256 of its weights file) of a folder or registry name."""
    entry = vq_entry(ref)
    try:
        raw = (entry.path / "model.safetensors").read_bytes()
    except OSError as e:
        raise UsageError(f"cannot load the VQ {ref!r}: {e}") from None
    return checkpoints.load_module(entry), entry.meta, hashlib.sha256(raw).hexdigest()[:16]


def downscale(images: torch.Tensor, factor: int) -> torch.Tensor:
    """Area downscale [B, 3, S, S] -> [B, 3, S/f, S/f] (the low-resolution view of the same crop)."""
    return F.interpolate(images, scale_factor=1.0 / factor, mode="area") if factor > 1 else images


@torch.no_grad()
def crop_tokens(vq, split: str, n: int, seed: int, crop: int, scale: int, log: Callable[[str], None],
                batch: int = 64, high: bool = True) -> dict[str, torch.Tensor]:
    """VQ tokens of `n` crops downscaled by `scale` (`lo`) and their labels; with `high` also the crops' own
    tokens (`hi`) and pixels (uint8)."""
    data = ImageCrops(ImageCropsConfig(split=split, num_samples=n, seed=seed, crop_size=crop))
    px, hi, lo, labels = [], [], [], []
    for start in range(0, n, batch):
        images, lab = data.batch(range(start, min(n, start + batch)))
        lo.append(vq.encode(downscale(images, scale)).to(torch.int16))
        labels.append(lab)
        if high:
            hi.append(vq.encode(images).to(torch.int16))
            px.append(((images + 1) * 127.5).round().clamp(0, 255).to(torch.uint8))
        if (start // batch) % 16 == 0:
            log(f"tokenised {split} {start + len(lab)}/{n}")
    out = {"lo": torch.cat(lo), "labels": torch.cat(labels)}
    return {**out, "pixels": torch.cat(px), "hi": torch.cat(hi)} if high else out


def token_dataset(cfg: ImageGPTTrainConfig, log: Callable[[str], None], down: int = 1) -> dict[str, Any]:
    """Cached token grids of train/eval crops area-downscaled by `down`, plus VQ facts (grid, codebook, classes)."""
    vq, doc, digest = load_vq(cfg.vq)
    crop = int(doc.get("image_size", 64))
    if crop % (down * vq.config.downsample):
        raise UsageError(f"downscale {down} must divide the crop {crop} into whole VQ tokens")
    key = f"vq{digest}-seed{cfg.data_seed}-crop{crop}{f'-down{down}' if down > 1 else ''}-train{cfg.num_crops}" \
          f"-eval{cfg.eval_crops}"
    path = Path(cfg.token_cache) / f"{key}.safetensors"

    def build() -> dict[str, torch.Tensor]:
        log(f"tokenising crops{f' downscaled {down}x' if down > 1 else ''} with VQ {cfg.vq} ({digest}) -> {path}")
        tr = crop_tokens(vq, "train", cfg.num_crops, cfg.data_seed, crop, down, log, high=False)
        ev = crop_tokens(vq, "eval", cfg.eval_crops, cfg.data_seed, crop, down, log, high=False)
        return {"train_tokens": tr["lo"].flatten(1), "train_labels": tr["labels"],
                "eval_tokens": ev["lo"].flatten(1), "eval_labels": ev["labels"]}

    return {**cached_tensors(path, build, log), "classes": list(IMAGE_CLASSES), "vq_sha": digest,
            "grid": crop // down // vq.config.downsample, "codebook_size": vq.config.codebook_size,
            "vq_model": vq, "image_size": crop // down}


def c2i_loss(model: Transformer, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """LlamaGen c2i cross-entropy: [cond, t_0..t_{N-2}] predicts [t_0..t_{N-1}]; tokens [B, N] long."""
    b, n = tokens.shape
    embeds = torch.cat([model.cls_embedding(labels), model.tok_embeddings(tokens[:, :-1])], dim=1)
    positions = torch.arange(n, device=tokens.device).expand(b, n)
    logits, _ = model(None, positions, embeds=embeds)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), tokens.reshape(-1))


@torch.no_grad()
def heldout_loss(model: Transformer, tokens: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean c2i loss of held-out token grids [M, N] (chunks of 64, on the model's device)."""
    device = devices.module_device(model)
    losses = [float(c2i_loss(model, tokens[i : i + 64].long().to(device), labels[i : i + 64].to(device)))
              for i in range(0, tokens.shape[0], 64)]
    return sum(losses) / len(losses)


@torch.no_grad()
def sample_images(model: Transformer, conds: torch.Tensor | list[Caption], cfg_scale: float = 4.0,
                  temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  generator: torch.Generator | None = None, features: bool = False):
    """AR tokens [B, G*G] of class labels (c2i: LlamaGen `generate`, logits-level CFG over the [cond; null] pair) or
    captions (t2i, as `CaptionCFGTarget` decodes them) in one batch of the shared loop; with `features` also the
    target's features f_t [branches, B, G*G, D] (branch 0 cond, 1 null; t = 0 from the prefill, for t2i the last
    condition slot's), EAGLE's training data.

    Every row draws from the one `generator` in row order, as LlamaGen's batched multinomial does."""
    if model.cfg.cond_kind == "caption":
        target = cfg_target(model, cfg_scale, list(conds))
        prompts = [target.prompt(i) for i in range(len(conds))]
    else:
        target, prompts = cfg_target(model, cfg_scale), [[int(c)] for c in conds]
    n = model.cfg.rope_grid ** 2
    recorders = [FeatureRecorder() for _ in prompts]  # each row's drafter: AR's empty one, recording the features
    res = run_batch(target, recorders.__getitem__, prompts, n, SamplingParams(temperature, top_k, top_p), (),
                    [generator] * len(prompts), len(prompts))
    tokens = torch.tensor([r.tokens for r in res.results], dtype=torch.long, device=model.device)
    # f_0..f_{n-1} of each row (a final forward past its last token, if any, is not one of them): [branches, B, N, D]
    return (tokens, torch.stack([torch.stack(r.features[:n], 1) for r in recorders], 1)) if features else tokens


def code_classifier(tokens: torch.Tensor, labels: torch.Tensor, vocab: int) -> Callable[..., float]:
    """A logistic regression on normalised bag-of-codes histograms of token grids [B, N] (no pretrained network)
    that predicts the source image: the accuracy(tokens, labels) it scores."""
    from sklearn.linear_model import LogisticRegression  # deferred: start-up (scikit-learn; final evaluation only)

    def hist(t: torch.Tensor):  # [B, vocab]
        t = t.long()
        return (torch.zeros(t.shape[0], vocab).scatter_add_(1, t, torch.ones_like(t, dtype=torch.float)) / t.shape[1]
                ).numpy()

    clf = LogisticRegression(max_iter=300, C=10.0).fit(hist(tokens), labels.numpy())
    return lambda t, y: float((torch.from_numpy(clf.predict(hist(t))) == y).float().mean())


def train(cfg: ImageGPTTrainConfig, out: Path, log: Callable[[str], None] = lambda s: None,
          command: str = "python -m specgen.train.image_gpt", device: str = "cpu", force: bool = False
          ) -> dict[str, Any]:
    """Train (or resume) in `out` on crops downscaled by `cfg.down()`, register the result; returns the metrics."""
    check_outputs([("target", cfg.name, cfg.ship_dir)], force)
    check_vq_name(cfg)
    torch.set_num_threads(cfg.num_threads)
    data = token_dataset(cfg, log, cfg.down())
    vocab, grid, classes = data["codebook_size"], data["grid"], data["classes"]
    n_layers, n_heads, dim = GPT_CONFIGS[cfg.model]  # the recipe's sizes where > 0, else the named config's
    dim, n_heads = cfg.dim or dim, cfg.n_heads or n_heads
    mcfg = replace(llamagen_config(cfg.model, vocab=vocab, grid=grid, num_classes=len(classes)),
                   n_layers=cfg.n_layers or n_layers, n_heads=n_heads, n_kv_heads=n_heads, dim=dim,
                   ffn_dim=find_multiple(int(2 * 4 * dim / 3), 256))
    torch.manual_seed(cfg.seed)
    model = Transformer(mcfg).train()
    with torch.no_grad():  # LlamaGen init: normal(0.02) linears/embeddings, zero output head
        for name, p in model.named_parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, std=0.02)
        model.output.weight.zero_()
    loop = Loop(LoopOptions.of(cfg, device=device), log)
    task = C2ITask(cfg, model, data)
    n_params = sum(p.numel() for p in model.parameters())
    loop.log(f"{n_params / 1e6:.2f}M params; config {mcfg.to_dict()}; {data['train_tokens'].shape[0]} train crops, "
             f"{len(classes)} classes")
    progress = loop.run(task, StateFile(out / "state.safetensors", {"config": asdict(cfg)}))
    model.cpu()
    if not loop.is_main:  # rank 0 measures and registers
        return {}
    metrics = progress.summary({**final_eval(cfg, model, data, out, log), "params": n_params})
    meta = {"builder": "llamagen-gpt", "kwargs": mcfg.to_dict(), "vocab_size": mcfg.vocab_size,
            "modality": "image", "parent": None, "vq": cfg.vq_name, "grid": mcfg.rope_grid,
            "classes": list(classes), "num_classes": mcfg.num_classes, "cls_token_num": mcfg.n_cond,
            "image_size": data["image_size"], "vq_sha": data["vq_sha"],
            "cfg_scale": cfg.cfg_scale, "created_by": command, "train_config": asdict(cfg), "metrics": metrics}
    publish("target", cfg.name, cfg.ship_dir, fp16_state(model), meta, "tiny-image-gpt", force)
    log(f"done: {json.dumps(brief(metrics))}")
    return metrics


class C2ITask(TrainTask):
    """LlamaGen's c2i objective on token grids: the data of a step is a function of (seed, step)."""

    def __init__(self, cfg: ImageGPTTrainConfig, model: Transformer, data: dict[str, Any]) -> None:
        self.cfg, self.model = cfg, model
        self.null_class = len(data["classes"])
        self.train_tokens, self.train_labels = data["train_tokens"].long(), data["train_labels"]
        self.eval_tokens, self.eval_labels = data["eval_tokens"].long(), data["eval_labels"]
        self.modules = {"model": model}
        self.optims = {"optim": Optim(cfg.adamw(model.parameters()), lambda s: cfg.lr_at(s, cfg.steps), cfg.grad_clip)}

    def batch(self, at: At) -> tuple[torch.Tensor, torch.Tensor]:
        """This shard's crops (`At.draw`), their labels dropped to the null class with p `class_dropout`."""
        cfg = self.cfg
        idx, g = at.draw(cfg.seed, cfg.steps, self.train_tokens.shape[0], cfg.batch_size)
        labels = self.train_labels[idx].clone()
        labels[torch.rand(len(idx), generator=g) < cfg.class_dropout] = self.null_class
        return self.train_tokens[idx], labels

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        loss = c2i_loss(self.model, *batch)
        return loss, {"loss": float(loss.detach())}

    def evaluate(self, progress: Progress) -> dict[str, Any]:
        self.model.eval()
        ev = heldout_loss(self.model, self.eval_tokens, self.eval_labels)
        self.model.train()
        return {"step": progress.step, "eval_loss": round(ev, 4), "elapsed_s": round(progress.elapsed, 1)}


def final_eval(cfg: ImageGPTTrainConfig, model: Transformer, data: dict, out: Path,
               log: Callable[[str], None]) -> dict[str, Any]:
    """Metrics of the fp16 weights: held-out loss and class accuracy of CFG samples by a bag-of-codes classifier."""
    shipped = shipped_copy(model).eval()
    vocab, classes = data["codebook_size"], data["classes"]
    eval_loss = heldout_loss(shipped, data["eval_tokens"], data["eval_labels"])
    accuracy = code_classifier(data["train_tokens"], data["train_labels"], vocab)
    real_acc = accuracy(data["eval_tokens"], data["eval_labels"])
    labels = torch.arange(len(classes)).repeat_interleave(cfg.samples_per_class)
    gen = torch.Generator().manual_seed(cfg.seed + 12345)
    t0 = time.perf_counter()
    toks = torch.cat([sample_images(shipped, labels[i : i + 32], cfg.cfg_scale, generator=gen)
                      for i in range(0, labels.shape[0], 32)])
    sample_s = time.perf_counter() - t0
    sample_acc = accuracy(toks, labels)
    per_class = {c: accuracy(toks[labels == i], labels[labels == i]) for i, c in enumerate(classes)}
    vq = data["vq_model"]
    with torch.no_grad():
        images = vq.decode_indices(toks.view(-1, model.cfg.rope_grid, model.cfg.rope_grid))
    image_grid(images, cfg.samples_per_class * 2).save(out / "samples.png")
    log(f"final: held-out loss {eval_loss:.4f}; bag-of-codes classifier accuracy real held-out {real_acc:.3f}, "
        f"CFG {cfg.cfg_scale} samples {sample_acc:.3f} ({labels.shape[0]} samples, {sample_s:.0f}s); per class "
        f"{json.dumps({k: round(v, 2) for k, v in per_class.items()})}; grid {out / 'samples.png'}")
    return {"heldout_loss": round(eval_loss, 4), "classifier_acc_real_heldout": round(real_acc, 4),
            "classifier_acc_samples": round(sample_acc, 4), "sample_cfg_scale": cfg.cfg_scale,
            "samples_per_class": cfg.samples_per_class, "classifier_acc_per_class": per_class}


def main(argv: list[str] | None = None, config: type[ImageGPTTrainConfig] = ImageGPTTrainConfig,
         module: str = "specgen.train.image_gpt", doc: str | None = __doc__,
         recipe: str = "recipes/tiny/image-gpt.yaml") -> int:
    """The script of `module` (this one, or image_gpt_lowres with its config class)."""
    cfg, args, log = parse_recipe(script_parser(module, doc, recipe, registers=True), config, argv)
    with registering(args.out):
        return print_metrics(train(cfg, Path(args.out), log, command=f"python -m {module}", device=args.device,
                                   force=args.force))


if __name__ == "__main__":
    raise SystemExit(run_script(main))
