"""Train XSpecMesh heads, then heads + LoRA, on the backbone's samples (sec. 4.3, A.2; docs/methods/xspecmesh.md)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from safetensors import SafetensorError

from specgen import checkpoints, devices, registry
from specgen.decoding.sampling import SamplingParams, logits_to_probs
from specgen.errors import CheckpointError, UsageError
from specgen.limits import decoder_context_of
from specgen.mesh.procedural import ProceduralSpec
from specgen.mesh.vertex_lookup import VertexMemory
from specgen.models.heads import HEAD_KINDS, HeadsConfig, XSpecMeshHeads
from specgen.models.mesh import MeshGPT
from specgen.tensor_files import load_tensors, save_tensors
from specgen.train.checkpoint import half, publish
from specgen.train.loop import At, Loop, LoopOptions, Optim, Progress, StateFile, TrainTask, check_choices
from specgen.train.lora import apply_lora, check_targets, lora_disabled, lora_state, merge_lora
from specgen.train.mesh import SeedStream, mesh_example, sequence_loss
from specgen.train.optim import cosine_lr


@dataclass
class HeadsTrainConfig:
    """Recipe keys of `train-heads --kind xspecmesh`."""

    target: str = "mesh-gpt-tiny"  # backbone (registry name)
    name: str = "xspecmesh-ca"  # output heads name (stage 1 gets "-s1", the adapter "-lora")
    head_kind: str = "ca"  # "ca" | "mlp"
    token_input: bool = False  # beyond the paper: heads also see E(x_{s+1}) (models/heads.py)
    num_heads: int = 4
    inner_dim: int = 128
    res_layers: int = 1  # residual blocks per head (Medusa's medusa_num_layers; paper: unspecified)
    history: int = 0  # beyond the paper: CA heads also attend to the last `history` hidden states (models/heads.py)
    num_sequences: int = 256
    eval_sequences: int = 32
    label_seed: int = 1
    label_temperature: float = 0.5  # BPT's sampling: T 0.5, top-k 50, top-p 0.95
    label_top_k: int = 50
    label_top_p: float = 0.95
    label_batch: int = 32
    max_tokens: int = 512
    batch_size: int = 8
    weight_decay_d: float = 0.8  # w(d) = 0.8^d
    stage1_epochs: int = 12
    stage1_lr: float = 5e-4
    stage1_min_lr: float = 5e-5
    stage2_epochs: int = 4
    stage2_lr: float = 1e-4
    stage2_min_lr: float = 1e-5
    lora_rank: int = 16
    lora_alpha: float = 32.0
    lora_targets: list = field(default_factory=lambda: ["wqkv", "wo", "wq", "w1", "w2", "w3"])
    backbone_weight: float = 50.0  # lambda
    backbone_loss: str = "ce"  # "ce": paper, CE on the labels; "kl": KL(frozen backbone || LoRA backbone), no drift
    head_targets: str = "hard"  # "hard": paper, CE on the sampled labels; "soft": the distribution they were sampled from
    skip_known_offsets: bool = False  # beyond the paper: no head loss where vertex lookup supplies the candidate
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    seed: int = 0
    num_threads: int = 1
    stages: int = 2  # 1 = stop after stage 1
    ship_dir: str = ""  # also write every registered entry to <ship_dir>/<name> (package assets)


#: Settings stage 1 does not read: a finished stage 1 is reused when only these change.
STAGE2_KEYS = ("stages", "stage2_epochs", "stage2_lr", "stage2_min_lr", "lora_rank", "lora_alpha", "lora_targets",
               "backbone_weight", "backbone_loss")
#: Settings that never change what training computes (names, CPU threads): resuming ignores them.
NAMING_KEYS = ("name", "num_threads")


def check_config(cfg: HeadsTrainConfig) -> None:
    """One-line usage errors for settings no run could use, before anything loads."""
    check_choices(cfg, {"head_kind": HEAD_KINDS, "backbone_loss": BACKBONE_LOSSES, "head_targets": HEAD_TARGETS})
    if cfg.num_heads < 1 or cfg.stages not in (1, 2):  # the other counts: specgen.config_checks
        raise UsageError("num_heads must be >= 1 and stages 1 or 2")
    if cfg.max_tokens < 2:  # the heads learn the tokens after a position: 1-token labels leave nothing to learn
        raise UsageError(f"max_tokens must be >= 2, got {cfg.max_tokens}")
    if not cfg.name:  # the three entries' names derive from it (the heads name their adapter): none is optional
        raise UsageError("name= is empty: train-heads --kind xspecmesh registers heads/NAME, heads/NAME-s1 and "
                         "adapter/NAME-lora; give a name")
    registry.check_name(cfg.name + "-lora", "name (+ -s1/-lora: heads/NAME-s1, adapter/NAME-lora)")


def resume_loose(out: Path) -> tuple[str, ...]:
    """Settings a rerun on OUT may change: names and shipping, and stage-2 settings until stage 2 has begun."""
    return NAMING_KEYS + ("ship_dir",) + (() if (Path(out) / "stage2.safetensors").exists() else STAGE2_KEYS)


@torch.inference_mode()
def sample_batch(model: MeshGPT, pcs: torch.Tensor, params: SamplingParams, max_tokens: int,
                 generator: torch.Generator, eos: int = 5120) -> list[list[int]]:
    """Batched AR sampling (every row one token per forward) of point clouds [B, N, 6]."""
    b = pcs.shape[0]
    cache = model.new_cache(b, max_tokens + 2)
    logits, _ = model.prefill(cache, model.condition(pcs)[1])  # [B, V]
    seqs: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b
    for pos in range(1, max_tokens + 1):
        toks = torch.multinomial(logits_to_probs(logits, params), 1, generator=generator)  # [B, 1]
        for r in range(b):
            if not done[r]:
                seqs[r].append(int(toks[r]))
                done[r] = seqs[r][-1] == eos
        if all(done) or pos == max_tokens:
            return seqs
        logits = model.decoder(toks, torch.full_like(toks, pos), cache)[0][:, 0]
        cache.commit_seqs(dict.fromkeys(range(b), [0]), 1)
    return seqs


def make_labels(model: MeshGPT, cfg: HeadsTrainConfig, num_points: int, log: Callable[[str], None],
                train_max_tokens: int = 512, spec: ProceduralSpec | None = None):
    """(point clouds [S, N, 6], padded tokens [S, L]) the backbone samples for meshes of its own training data."""
    count = cfg.num_sequences + cfg.eval_sequences
    stream = SeedStream(cfg.label_seed + 1000, train_max_tokens, spec)
    seeds = [s for i in range(count // 64 + 1) for s in stream.pool(i, 64)][:count]
    pcs = torch.from_numpy(np.stack([mesh_example(s, num_points, s, spec)[0] for s in seeds]))
    params = SamplingParams(cfg.label_temperature, cfg.label_top_k, cfg.label_top_p)
    gen = torch.Generator().manual_seed(cfg.label_seed)
    seqs: list[list[int]] = []
    t0 = time.perf_counter()
    for i in range(0, count, cfg.label_batch):
        seqs += sample_batch(model, pcs[i : i + cfg.label_batch], params, cfg.max_tokens, gen)
        log(f"labels {len(seqs)}/{count} ({time.perf_counter() - t0:.0f} s)")
    return pcs, pad_sequence([torch.tensor(s, dtype=torch.long) for s in seqs], batch_first=True, padding_value=-1)


def soft_cross_entropy(logits: torch.Tensor, probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens (tokens [B, L] >= 0) of -sum_v probs log softmax(logits); [B, L, V] inputs."""
    mask = (tokens >= 0).float()  # [B, L]
    ce = -(probs * F.log_softmax(logits.float(), -1)).sum(-1)  # [B, L]
    return (ce * mask).sum() / mask.sum().clamp(min=1)


def heads_loss(heads: XSpecMeshHeads, hidden: torch.Tensor, cond: torch.Tensor, tokens: torch.Tensor,
               lm_head: torch.nn.Module, decay: float, soft: torch.Tensor | None = None,
               embed: torch.nn.Module | None = None, known: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, list[float]]:
    """L_mhd = sum_d decay^d * CE(head d at row i, tokens[:, i + d]); also per-head accuracies.

    hidden [B, L, dim]: row i predicts tokens[:, i]; soft [B, L, V]: the distributions tokens were drawn from (the
    one-hot targets' replacement); known [B, L] (`known_rows`): head d skips target j when known[:, j] <= j - d."""
    kv = heads.context_kv(cond)
    emb = embed(tokens.clamp(min=0)) if heads.cfg.token_input else None  # [B, L, dim]; padding masked below
    total, accs = hidden.new_zeros(()), []
    for d in range(1, heads.num_heads + 1):
        if tokens.shape[1] <= d:
            break
        rows = tokens.shape[1] - d
        feats = heads.head_features(d - 1, hidden[:, :rows], kv[d - 1], None if emb is None else emb[:, :rows])
        logits = lm_head(feats)  # [B, L-d, V]
        target = tokens[:, d:]
        if known is not None:  # [B, L - d]: vertex lookup proposes these, the head is never asked
            rows_i = torch.arange(rows, device=tokens.device)
            target = target.masked_fill(known[:, d:] <= rows_i, -1)
        loss = sequence_loss(logits, target) if soft is None else soft_cross_entropy(logits, soft[:, d:], target)
        total = total + decay**d * loss
        mask = target >= 0
        accs.append(float((logits.argmax(-1) == target)[mask].float().mean()) if mask.any() else 0.0)
    return total, accs


def kl_term(model: MeshGPT, pcs: torch.Tensor, tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Mean over label positions of KL(p_frozen || p_lora) at T 1; its minimiser is the unchanged backbone."""
    with torch.no_grad(), lora_disabled(model):
        ref, _, _ = model.forward_train(pcs, tokens)  # [B, L, V], the frozen backbone
    mask = (tokens >= 0).float()  # [B, L]
    kl = F.kl_div(F.log_softmax(logits.float(), -1), F.log_softmax(ref.float(), -1), log_target=True,
                  reduction="none").sum(-1)  # [B, L]
    return (kl * mask).sum() / mask.sum().clamp(min=1)


#: Stage 2's backbone term (`backbone_loss`), on the LoRA backbone's logits [B, L, V].
BACKBONE_LOSSES = {"ce": lambda model, pcs, tokens, logits: sequence_loss(logits, tokens),  # the paper's: CE on labels
                   "kl": kl_term}
#: What the heads are trained towards (`head_targets`); eval losses always use the hard labels.
HEAD_TARGETS = ("hard", "soft")


@torch.no_grad()
def backbone_features(model: MeshGPT, pcs: torch.Tensor, tokens: torch.Tensor, batch: int = 8):
    """Frozen backbone's hidden [S, L, dim] and condition [S, M, cross] for every labelled sequence."""
    hs, cs = [], []
    for i in range(0, len(tokens), batch):
        t = trim(tokens[i : i + batch])
        _, h, c = model.forward_train(pcs[i : i + batch], t)
        hs.append(F.pad(h, (0, 0, 0, tokens.shape[1] - h.shape[1])))
        cs.append(c)
    return torch.cat(hs), torch.cat(cs)


def known_rows(tokens: torch.Tensor) -> torch.Tensor:
    """Per label position, the first row whose vertex memory proposes it [S, L]; L where none does."""
    out = torch.full_like(tokens, tokens.shape[1])
    for r, row in enumerate(tokens.tolist()):
        seq = [t for t in row if t >= 0]
        rows = torch.tensor(VertexMemory().known_rows(seq), dtype=tokens.dtype)  # len(seq) = never
        out[r, : len(seq)] = rows.masked_fill(rows >= len(seq), tokens.shape[1])
    return out


def trim(tokens: torch.Tensor) -> torch.Tensor:
    """Drop all-padding columns at the end of tokens [B, L]."""
    return tokens[:, : max(1, int((tokens >= 0).sum(1).max()))]


#: A stage's loss on sequences `idx` (`hard`: against the sampled labels): (loss, named parts to report).
StageLoss = Callable[..., tuple[torch.Tensor, dict[str, Any]]]


@torch.no_grad()
def eval_record(loss_fn: StageLoss, idx: list[int]) -> dict[str, Any]:
    """The held-out parts of a stage's loss on the hard labels (comparable across head_targets)."""
    _, parts = loss_fn(idx, hard=True)
    return {f"eval_{k}": [round(a, 3) for a in v] if k == "head_acc" else round(v, 4) for k, v in parts.items()}


class StageTask(TrainTask):
    """One stage of heads training: a step's sequences are a slice of the epoch's seeded permutation."""

    def __init__(self, cfg: HeadsTrainConfig, stage: int, per_epoch: int, optim: Optim,
                 loss_fn: StageLoss, modules: dict, eval_idx: list[int]) -> None:
        self.cfg, self.stage, self.per_epoch, self.loss_fn, self.eval_idx = cfg, stage, per_epoch, loss_fn, eval_idx
        self.modules, self.optims = modules, {"optim": optim}

    def batch(self, at: At) -> list[int]:
        """One process, no accumulation: batch k of epoch e; else shard j of step s is batch s * shards + j."""
        cfg = self.cfg
        epoch, k = divmod(at.step * at.shards + at.shard, self.per_epoch)
        order = np.random.default_rng([cfg.seed, self.stage, epoch]).permutation(cfg.num_sequences)
        return order[k * cfg.batch_size : (k + 1) * cfg.batch_size].tolist()

    def loss(self, idx: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        loss, _ = self.loss_fn(idx)
        return loss, {"loss": float(loss.detach())}

    def evaluate(self, progress: Progress) -> dict[str, Any]:
        return {"epoch": progress.step // self.per_epoch,
                "train_loss": progress.recent_mean("loss", self.per_epoch), **eval_record(self.loss_fn, self.eval_idx)}


class HeadsTrainer:
    """Owns backbone, heads, optimiser and run directory (labels + per-stage resumable state)."""

    def __init__(self, cfg: HeadsTrainConfig, out: Path, log: Callable[[str], None] = lambda s: None,
                 device: str = "cpu") -> None:
        self.cfg, self.out, self.log, self.device, self.is_main = cfg, Path(out), log, device, True
        torch.set_num_threads(cfg.num_threads)
        torch.manual_seed(cfg.seed)
        with checkpoints.input_named("target", cfg.target, "mesh target"):
            self.target = checkpoints.find(cfg.target)
        if self.target.kind != "target":  # heads and their adapter are mesh entries too, but build no backbone
            raise UsageError(f"{self.target.ref} is not a target entry; pass target=<mesh backbone>")
        if self.target.meta.get("modality") != "mesh":
            raise UsageError(f"{self.target.ref} is not a mesh model; XSpecMesh heads need a mesh backbone")
        context = decoder_context_of(self.target.meta)  # from its config: refused before the weights load
        if context is not None and cfg.max_tokens > context:  # labels: the start vector + max_tokens - 1 tokens fed
            raise UsageError(f"max_tokens {cfg.max_tokens} exceeds {self.target.ref}'s context of {context} tokens; "
                             f"use at most {context}")
        self.model = checkpoints.load_module(self.target).float().requires_grad_(False)
        dc = self.model.dec_cfg
        self.heads = XSpecMeshHeads(**HeadsConfig(cfg.num_heads, cfg.head_kind, dc.dim, dc.cross_dim, dc.n_heads,
                                                  cfg.inner_dim, dc.vocab_size, cfg.token_input,
                                                  cfg.res_layers, cfg.history).to_dict())
        self.num_points = int(self.target.meta.get("num_points", 2048))
        if cfg.stages == 2:  # stage 2 wraps them after the labels and stage 1: refused before that work
            check_targets(self.model.decoder, cfg.lora_targets, f"{self.target.ref}'s decoder")
        if cfg.skip_known_offsets and self.model.vocab_size != 5121:
            raise UsageError(f"skip_known_offsets needs a BPT backbone (5121 tokens); {self.target.ref} has "
                             f"{self.model.vocab_size}")

    def labels(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys = ("num_sequences", "eval_sequences", "label_seed", "label_temperature", "label_top_k", "label_top_p",
                "label_batch", "max_tokens")  # what the labels depend on, stored with them: other settings are refused
        want = {**{k: str(getattr(self.cfg, k)) for k in keys}, "target": self.target.ref,
                "target_digest": registry.weights_digest(self.target)}
        path = self.out / "labels.safetensors"
        if path.exists():
            try:
                t, have = load_tensors(path)
            except (OSError, SafetensorError) as e:
                raise CheckpointError(f"corrupt labels file {path}: {e}; delete it to regenerate the labels") from None
            k = next((k for k in want if have.get(k) != want[k]), None)  # none recorded: made by an older specgen
            if k is not None:
                raise UsageError(f"{path} holds labels made with {k} {have.get(k, '(not recorded)')}, not {want[k]}; "
                                 "use a new --out (or delete that file to regenerate the labels)")
            return t["pcs"], t["tokens"]
        self.model.eval()
        pcs, tokens = make_labels(self.model, self.cfg, self.num_points, self.log,
                                  int(self.target.meta.get("max_tokens", self.cfg.max_tokens)),
                                  ProceduralSpec.from_meta(self.target.meta))
        save_tensors(path, {"pcs": pcs, "tokens": tokens}, metadata=want)
        lengths = (tokens >= 0).sum(1).float()
        eos = (tokens == 5120).any(1).float().mean()
        self.log(f"labels: {len(tokens)} sequences, mean length {lengths.mean():.0f}, EOS reached {eos:.0%}")
        return pcs, tokens

    def run_stage(self, stage: int, params: list, epochs: int, lr: float, min_lr: float, loss_fn: StageLoss,
                  modules: dict, eval_idx: list[int]) -> list[dict]:
        """One stage: epochs of shuffled batches, cosine lr; an evaluation and `stage{N}.safetensors` every epoch."""
        cfg, n = self.cfg, self.cfg.num_sequences
        opt = torch.optim.AdamW(params, lr=lr, betas=(cfg.beta1, cfg.beta2), weight_decay=0.0)
        per_epoch = (n + cfg.batch_size - 1) // cfg.batch_size
        total = epochs * per_epoch
        config = {**{k: v for k, v in asdict(cfg).items() if k != "ship_dir"}, "stage": stage}  # shipping: not training
        loose = NAMING_KEYS + (STAGE2_KEYS if stage == 1 else ())  # stage 1 resumes under new stage-2 settings
        task = StageTask(cfg, stage, per_epoch, Optim(opt, lambda s: cosine_lr(s, total, lr, min_lr), cfg.grad_clip),
                         loss_fn, modules, eval_idx)
        loop = Loop(LoopOptions(steps=total, log_every=per_epoch, eval_every=per_epoch, device=self.device), self.log)
        self.is_main = loop.is_main
        state = StateFile(self.out / f"stage{stage}.safetensors", {"config": config}, loose=loose)
        self.log(f"stage {stage}: {epochs} epochs of {per_epoch} steps")
        return loop.run(task, state).history

    def train(self) -> dict[str, Any]:
        cfg = self.cfg
        pcs, tokens = self.labels()  # sampled on the CPU (cached in OUT); training follows `device`
        dev = devices.resolve_device(self.device)
        self.model.to(dev), self.heads.to(dev)
        pcs, tokens = pcs.to(dev), tokens.to(dev)
        lm_head, embed = self.model.decoder.output, self.model.decoder.tok_embeddings  # both frozen (tied)
        # stage 1: frozen backbone features, computed once
        self.model.eval()
        hidden, cond = backbone_features(self.model, pcs, tokens)
        ev_idx = list(range(cfg.num_sequences, len(tokens)))
        label_params = SamplingParams(cfg.label_temperature, cfg.label_top_k, cfg.label_top_p)
        use_soft = cfg.head_targets == "soft"
        known = known_rows(tokens) if cfg.skip_known_offsets else None  # [S, L]

        def skip(idx, t):  # the rows of `known` for a batch trimmed to t [B, L]
            return None if known is None else known[idx, : t.shape[1]]

        def s1_loss(idx, hard=False):
            t = trim(tokens[idx])
            h = hidden[idx, : t.shape[1]]  # [B, L, dim]
            with torch.no_grad():  # soft: the distributions the labels were drawn from [B, L, V]
                targets = logits_to_probs(lm_head(h), label_params) if use_soft and not hard else None
            mhd, accs = heads_loss(self.heads, h, cond[idx], t, lm_head, cfg.weight_decay_d, targets, embed,
                                   skip(idx, t))
            return mhd, {"mhd": float(mhd.detach()), "head_acc": accs}

        self.log(f"stage 1: {cfg.head_kind} heads x{cfg.num_heads}, "
                 f"{sum(p.numel() for p in self.heads.parameters()) / 1e6:.2f}M parameters")
        h1 = self.run_stage(1, list(self.heads.parameters()), cfg.stage1_epochs, cfg.stage1_lr, cfg.stage1_min_lr,
                            s1_loss, {"heads": self.heads}, ev_idx)
        result = {"stage1": h1, "heads_s1": {k: v.detach().cpu().clone() for k, v in self.heads.state_dict().items()}}
        if cfg.stages < 2:
            return result
        # stage 2: LoRA on the backbone decoder + heads, lambda * L_backbone + L_mhd
        hidden = None  # stage 1's features [S, L, dim] freed (s1_loss, their one reader, is done)
        apply_lora(self.model.decoder, tuple(cfg.lora_targets), cfg.lora_rank, cfg.lora_alpha)  # on the CPU RNG
        self.model.to(dev)
        lora_params = [p for p in self.model.parameters() if p.requires_grad]
        self.model.train()

        def s2_loss(idx, hard=False):
            t = trim(tokens[idx])
            logits, h, c = self.model.forward_train(pcs[idx], t)
            bb = BACKBONE_LOSSES[cfg.backbone_loss](self.model, pcs[idx], t, logits)
            # soft targets: the LoRA backbone's own label distribution (detached), the one it will sample from
            targets = logits_to_probs(logits.detach(), label_params) if use_soft and not hard else None
            mhd, accs = heads_loss(self.heads, h, c, t, lm_head, cfg.weight_decay_d, targets, embed, skip(idx, t))
            return cfg.backbone_weight * bb + mhd, {"backbone": float(bb.detach()), "mhd": float(mhd.detach()),
                                                    "head_acc": accs}

        self.log(f"stage 2: LoRA rank {cfg.lora_rank} on {len(lora_params) // 2} decoder linear layers, "
                 f"lambda {cfg.backbone_weight}; before: {eval_record(s2_loss, ev_idx)}")
        h2 = self.run_stage(2, list(self.heads.parameters()) + lora_params, cfg.stage2_epochs, cfg.stage2_lr,
                            cfg.stage2_min_lr, s2_loss, {"heads": self.heads, "model": self.model}, ev_idx)
        self.model.cpu(), self.heads.cpu()
        result.update(stage2=h2, lora=lora_state(self.model.decoder),
                      heads_s2={k: v.detach().clone() for k, v in self.heads.state_dict().items()})
        merge_lora(self.model.decoder)
        return result


def outputs(cfg: HeadsTrainConfig) -> list[tuple[str, str, str]]:
    """(kind, name, ship folder) of what a run registers: heads/<name>-s1, then adapter/<name>-lora, heads/<name>."""
    names = [("heads", f"{cfg.name}-s1")] + ([("adapter", f"{cfg.name}-lora"), ("heads", cfg.name)]
                                            if cfg.stages == 2 else [])
    return [(k, n, str(Path(cfg.ship_dir) / n) if cfg.ship_dir else "") for k, n in names]


def save_outputs(trainer: HeadsTrainer, result: dict, force: bool = False) -> list:
    """Register (and ship: `publish`) heads/<name>-s1, adapter/<name>-lora and heads/<name>; returns the entries."""
    cfg, target = trainer.cfg, trainer.target
    digest = registry.weights_digest(target)  # a retrained backbone refuses these heads (check_pair)
    base = {"builder": "xspecmesh_heads", "kwargs": trainer.heads.cfg.to_dict(), "parent": target.name,
            "parent_digest": digest, "vocab_size": target.meta.get("vocab_size"), "modality": "mesh", "method": "xspecmesh",
            "created_by": "specgen train-heads --kind xspecmesh", "train_config": asdict(cfg)}
    s1 = result["stage1"][-1] if result["stage1"] else {}
    s2 = result["stage2"][-1] if result.get("stage2") else {}
    parts = [(half(result["heads_s1"]), {**base, "stage": 1, "metrics": s1})]
    if "lora" in result:  # outputs(cfg) names the adapter and the stage-2 heads too
        parts.append((half({f"decoder.{k}": v for k, v in result["lora"].items()}),
                      {**{k: base[k] for k in ("parent", "parent_digest", "vocab_size", "modality", "created_by")},
                       "lora_rank": cfg.lora_rank, "lora_alpha": cfg.lora_alpha, "metrics": s2}))
        parts.append((half(result["heads_s2"]), {**base, "stage": 2, "adapter": f"{cfg.name}-lora", "metrics": s2}))
    return [publish(kind, name, ship, state, meta, name, force)
            for (kind, name, ship), (state, meta) in zip(outputs(cfg), parts)]

