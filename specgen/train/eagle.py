"""Train an EAGLE feature drafter (`specgen/models/eagle.py`) on an image target's own CFG samples (c2i or t2i)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from specgen import checkpoints, registry
from specgen.errors import UsageError
from specgen.image.captions import Caption, read_captions
from specgen.models.eagle import EagleNet
from specgen.models.transformer import Transformer
from specgen.paths import file_digest
from specgen.tensor_files import cached_tensors
from specgen.train.checkpoint import RESUME_LOOSE, Published, brief, fp16_state, publish, shipped_copy
from specgen.train.image_gpt import sample_images
from specgen.train.loop import At, Loop, LoopOptions, Optim, Progress, StateFile, TrainTask
from specgen.train.optim import OptimConfig


@dataclass(frozen=True)
class EagleTrainConfig(OptimConfig):
    """Everything an EAGLE drafter run depends on (a YAML recipe sets any subset; AdamW/schedule keys: OptimConfig)."""

    target: str = "tiny-image-gpt"  # registry name of an image target (LlamaGen c2i or t2i GPT)
    name: str = "image-eagle"  # registered as draft/<name> ("" = do not register)
    init: str = ""  # optional: warm-start from this registered drafter (must belong to `target`)
    data_cache: str = ".notes/eagle_data"
    samples_per_class: int = 24  # training generations per class (t2i: per caption)
    eval_samples_per_class: int = 2  # held-out generations per class or caption (other seed)
    captions: str = ""  # t2i targets only: caption-features file (.safetensors/.npz/.npy, as `generate --captions`)
    cfg_scale: float = 4.0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    gen_batch: int = 32
    feature_weight: float = 1.0
    token_weight: float = 0.1
    feature_noise: float = 0.1  # uniform noise in [-a/2, a/2] on input features during training
    seed: int = 0
    steps: int = 600
    batch_size: int = 16  # sequences (branch rows) per micro-batch (a step: grad_accum x processes of them)
    grad_accum: int = 1  # micro-batches per optimiser step
    warmup_steps: int = 30  # OptimConfig keys with this recipe's defaults
    grad_clip: float = 0.5
    log_every: int = 10
    eval_every: int = 100
    ckpt_every: int = 25
    num_threads: int = 1
    ship_dir: str = ""  # also write model.safetensors + config.json here (e.g. specgen/assets/image/eagle)


def training_captions(entry, model: Transformer, path: str) -> tuple[list[Caption], str]:
    """(captions, content hash) a t2i target trains on; ([], "") for c2i. Mismatches are one-line usage errors."""
    if model.cfg.cond_kind != "caption":
        if path:
            raise UsageError(f"{entry.ref} is class-conditional (c2i): its drafter trains on class labels, "
                             f"not caption features (drop captions={path})")
        return [], ""
    if not path:
        raise UsageError(f"{entry.ref} is text-conditional (t2i): pass captions=FILE (precomputed T5 caption "
                         "features, as for generate --captions; see docs/methods/eagle2.md)")
    captions = read_captions(path, model.cfg.n_cond, model.cfg.caption_dim)
    return captions, file_digest(path)


def first_image_position(cfg) -> int:
    """Position of image token 0: after the one class position (c2i) or the n_cond caption slots (t2i)."""
    return cfg.n_cond if cfg.cond_kind == "caption" else 1


def generations(model: Transformer, n_per_class: int, cfg: EagleTrainConfig, seed: int, digest: str,
                log: Callable[[str], None], captions: Sequence[Caption] = (), captions_sha: str = ""
                ) -> dict[str, torch.Tensor]:
    """Cached target samples: tokens [M, N], labels [M] (class, or caption index in its file) and features
    [M, 2, N, D] (branch 0 cond, 1 null; fp16). With `captions` (t2i) they are cycled `n_per_class` times."""
    # gen_batch is part of the key: the rows of a batch draw from the one generator in turn at every step, so other
    # batch sizes give other samples (a cache of another gen_batch would make a run's data depend on its history)
    key = (f"{digest}-n{n_per_class}-cfg{cfg.cfg_scale}-t{cfg.temperature}-k{cfg.top_k}-p{cfg.top_p}-seed{seed}"
           f"-b{cfg.gen_batch}")
    key += f"-cap{captions_sha}" if captions else ""
    path = Path(cfg.data_cache) / f"{key}.safetensors"

    def build() -> dict[str, torch.Tensor]:
        conds = list(captions) * n_per_class if captions else torch.arange(model.cfg.num_classes).repeat(n_per_class)
        labels = torch.tensor([c.index for c in conds]) if captions else conds
        gen = torch.Generator().manual_seed(seed)
        toks, feats = [], []
        t0 = time.perf_counter()
        for i in range(0, labels.shape[0], cfg.gen_batch):
            t, f = sample_images(model, conds[i : i + cfg.gen_batch], cfg.cfg_scale, cfg.temperature, cfg.top_k,
                                 cfg.top_p, gen, features=True)
            toks.append(t)
            feats.append(f.transpose(0, 1).half())  # [b, branches, N, D]
            log(f"generated {i + t.shape[0]}/{labels.shape[0]} target samples ({time.perf_counter() - t0:.0f}s)")
        if feats[0].shape[1] == 1:  # no CFG: only the conditional branch exists
            log("cfg_scale <= 1: training on the conditional branch only")
        return {"tokens": torch.cat(toks), "labels": labels, "features": torch.cat(feats)}

    return cached_tensors(path, build, log) if cfg.data_cache else build()


def drafter_inputs(feats: torch.Tensor, tokens: torch.Tensor, offset: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows the drafter sees for full sequences, as `EagleTreeDrafter` feeds them while decoding: features
    f_0..f_{N-2} [B, N-1, D], image tokens 0..N-2 [B, N-1] and their positions offset..offset+N-2 [B, N-1]."""
    b, n = tokens.shape
    positions = torch.arange(offset, offset + n - 1, device=tokens.device).expand(b, n - 1)
    return feats[:, :-1].float(), tokens[:, :-1], positions


def eagle_loss(net: EagleNet, target: Transformer, feats: torch.Tensor, tokens: torch.Tensor,
               cfg: EagleTrainConfig, noise: torch.Generator | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """EAGLE loss on full sequences: feats [B, N, D] = f_0..f_{N-1}, tokens [B, N] = image tokens 0..N-1."""
    inp, toks, positions = drafter_inputs(feats, tokens, first_image_position(target.cfg))
    if noise is not None and cfg.feature_noise > 0:
        inp = inp + ((torch.rand(inp.shape, generator=noise) - 0.5) * cfg.feature_noise).to(inp.device)
    hidden = net(inp, toks, positions)
    goal = feats[:, 1:].float()  # f_{t+1}
    vloss = F.smooth_l1_loss(hidden, goal)
    with torch.no_grad():
        p_target = target.logits(goal).float().softmax(-1)
    logp = F.log_softmax(EagleNet.logits(hidden, target).float(), -1)
    ploss = -(p_target * logp).sum(-1).mean()
    loss = cfg.feature_weight * vloss + cfg.token_weight * ploss
    return loss, {"vloss": float(vloss.detach()), "ploss": float(ploss.detach())}


@torch.no_grad()
def evaluate(net: EagleNet, target: Transformer, data: dict[str, torch.Tensor], cfg_scale: float) -> dict[str, float]:
    """Top-1 next-token accuracy of the drafter (CFG-combined over branches) on held-out generations."""
    net.eval()
    device = next(net.parameters()).device
    f, toks = data["features"].float().to(device), data["tokens"].to(device)
    br = f.shape[1]
    offset = first_image_position(target.cfg)
    d_logits = [EagleNet.logits(net(*drafter_inputs(f[:, i], toks, offset)), target).float() for i in range(br)]
    t_logits = [target.logits(f[:, i, 1:]).float() for i in range(br)]
    if br == 2:
        d, t = (x[1] + cfg_scale * (x[0] - x[1]) for x in (d_logits, t_logits))
    else:
        d, t = d_logits[0], t_logits[0]
    nxt = toks[:, 1:]
    net.train()
    return {"top1_vs_sampled": float((d.argmax(-1) == nxt).float().mean()),
            "top1_vs_target_top1": float((d.argmax(-1) == t.argmax(-1)).float().mean()),
            "target_top1_vs_sampled": float((t.argmax(-1) == nxt).float().mean()),
            "cond_branch_top1_vs_target_top1": float((d_logits[0].argmax(-1) == t_logits[0].argmax(-1)).float().mean())}


def train(cfg: EagleTrainConfig, out: Path, log: Callable[[str], None] = lambda s: None,
          device: str = "cpu", force: bool = False) -> Published | None:
    """Generate (or reuse) target samples, train (or resume) the drafter and register it (None on other ranks)."""
    torch.set_num_threads(cfg.num_threads)
    with checkpoints.input_named("target", cfg.target, "image target"):
        entry = checkpoints.find(cfg.target)
    if entry.kind != "target":
        raise UsageError(f"{entry.ref} is a {entry.kind}, not a target; pass target=<image target>")
    target = checkpoints.load_module(entry).requires_grad_(False)
    if not (isinstance(target, Transformer) and target.cfg.cond_kind in ("class", "caption") and target.cfg.rope_grid):
        raise UsageError(f"{entry.ref} is not an image target (LlamaGen c2i or t2i GPT)")
    captions, captions_sha = training_captions(entry, target, cfg.captions)
    torch.manual_seed(cfg.seed)
    net = EagleNet.from_target(target)
    if cfg.init:
        with checkpoints.input_named("init", cfg.init, "drafter"):
            init = checkpoints.find(cfg.init)
        registry.check_pair(init, entry)
        net.load_state_dict(checkpoints.load_module(init).state_dict(), strict=True)
    digest = file_digest(entry.path / registry.WEIGHTS)
    train_data, eval_data = (generations(target, n, cfg, cfg.seed * 2 + i, digest, log, captions, captions_sha)
                             for i, n in ((1, cfg.samples_per_class), (2, cfg.eval_samples_per_class)))
    f = train_data["features"]  # training rows: one per sequence and branch, [R, N, D] and their tokens [R, N]
    feats, tokens = f.flatten(0, 1), train_data["tokens"].repeat_interleave(f.shape[1], dim=0)
    loop = Loop(LoopOptions.of(cfg, eval_first=True, device=device), log)
    target.to(loop.device)  # the frozen head and embeddings the loss reads (samples were drawn on the CPU)
    # what the state must match to resume (and the drafter records): config, target weights, t2i captions' content
    record = {"config": asdict(cfg), "target_sha": digest, **({"captions_sha": captions_sha} if captions_sha else {})}
    task = EagleTask(cfg, net, target, feats, tokens, eval_data)
    n_params = sum(p.numel() for p in net.parameters() if p.requires_grad)
    loop.log(f"drafter for {entry.ref} ({n_params / 1e6:.2f}M trainable params); {feats.shape[0]} training rows")
    progress = loop.run(task, StateFile(out / "state.safetensors", record, RESUME_LOOSE))
    net.cpu(), target.cpu()
    if not loop.is_main:  # rank 0 measures and registers
        return None
    final = evaluate(shipped_copy(net), target, eval_data, cfg.cfg_scale)
    metrics = progress.summary({**{k: round(v, 4) for k, v in final.items()},
                                "eval_sequences": int(eval_data["tokens"].shape[0])})
    log(f"done: {json.dumps(brief(metrics))}")
    meta = {"builder": "eagle", "kwargs": net.cfg.to_dict(), "parent": entry.ref,
            "parent_digest": registry.weights_digest(entry), "vocab_size": net.cfg.vocab_size,
            "modality": "image", "drafter": "eagle", "embedding": "copy of the target's tok_embeddings (frozen)",
            "head": "target.output", "created_by": "specgen train-heads --kind eagle", "train_config": record["config"],
            "metrics": metrics, **{k: v for k, v in record.items() if k != "config"}}
    return Published(metrics, publish("draft", cfg.name, cfg.ship_dir, fp16_state(net), meta, "tiny-image-eagle",
                                      force))


class EagleTask(TrainTask):
    """The EAGLE objective on the target's sampled rows (a step's rows and feature noise: `At.draw`)."""

    def __init__(self, cfg: EagleTrainConfig, net: EagleNet, target: Transformer, feats: torch.Tensor,
                 tokens: torch.Tensor, eval_data: dict[str, torch.Tensor]) -> None:
        self.cfg, self.net, self.target, self.eval_data = cfg, net, target, eval_data
        self.feats, self.tokens = feats, tokens  # [R, N, D] fp16, [R, N]
        self.modules = {"model": net}
        params = [p for p in net.parameters() if p.requires_grad]
        self.optims = {"optim": Optim(cfg.adamw(params), lambda s: cfg.lr_at(s, cfg.steps), cfg.grad_clip)}

    def batch(self, at: At):
        """This shard's rows and the generator of their feature noise."""
        idx, g = at.draw(self.cfg.seed, self.cfg.steps, self.feats.shape[0], self.cfg.batch_size)
        return self.feats[idx], self.tokens[idx], g

    def loss(self, batch):
        feats, tokens, g = batch
        loss, parts = eagle_loss(self.net, self.target, feats, tokens, self.cfg, g)
        return loss, {"loss": float(loss.detach()), **parts}

    def evaluate(self, progress: Progress) -> dict[str, Any]:
        ev = evaluate(self.net, self.target, self.eval_data, self.cfg.cfg_scale)
        return {"step": progress.step, **{k: round(v, 4) for k, v in ev.items()}}

