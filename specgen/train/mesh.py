"""Train the tiny point-cloud-conditioned mesh GPT on procedural meshes; resumable, writes fp16 safetensors."""

from __future__ import annotations

import copy
import itertools
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from specgen.mesh.pointcloud import point_cloud
from specgen.mesh.procedural import ProceduralSpec, generate_mesh, split_seeds
from specgen.mesh.tokenizers import BPTTokenizer
from specgen.models.mesh import MeshGPT
from specgen.train.checkpoint import check_outputs, fp16_state, publish, write_entry
from specgen.train.mesh_embedding import FactoredTable
from specgen.train.loop import At, Loop, LoopOptions, Optim, Progress, StateFile, TrainTask
from specgen.train.optim import OptimConfig
from specgen.train.script import parse_recipe, print_metrics, registering, run_script, script_parser


@dataclass(frozen=True)
class MeshTrainConfig(OptimConfig):
    """Everything a mesh GPT run depends on (a YAML recipe sets any subset; AdamW/schedule keys: OptimConfig)."""

    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    ffn_dim: int = 512
    max_seq_len: int = 1024
    enc_width: int = 256
    num_latents: int = 64
    enc_layers: int = 1
    num_points: int = 2048
    max_tokens: int = 640  # skip training meshes with longer BPT sequences (EOS included)
    seed: int = 0
    steps: int = 3000
    batch_size: int = 8  # meshes per micro-batch (an optimiser step: grad_accum x processes of them)
    grad_accum: int = 1  # micro-batches per optimiser step
    pool_batches: int = 8
    min_lr: float = 1e-4  # OptimConfig keys with this recipe's defaults
    warmup_steps: int = 200
    eval_meshes: int = 32
    eval_every: int = 250
    ckpt_every: int = 50
    log_every: int = 25
    num_threads: int = 1
    factored_embedding: bool = False  # train the token table as free + coordinate features @ axes (mesh_embedding.py)
    max_parts: int = 4  # procedural distribution (ProceduralSpec): parts per mesh ...
    rotation: str = "uniform"  # ... and rotation law ("uniform" | "axis"); recorded in config.json
    max_minutes: float = 0.0  # > 0: stop after this much training CPU time (a budget: may change on resume)
    ship_dir: str = ""  # also write the fp16 result here in registry layout (a built-in's folder: --register its name)

    def spec(self) -> ProceduralSpec:
        return ProceduralSpec(self.max_parts, self.rotation)

    def model_kwargs(self) -> dict:
        decoder = dict(vocab_size=BPTTokenizer().vocab_size, dim=self.dim, n_layers=self.n_layers,
                       n_heads=self.n_heads, n_kv_heads=self.n_heads, ffn_dim=self.ffn_dim,
                       max_seq_len=self.max_seq_len, cross_dim=self.enc_width, tie_embeddings=True)
        encoder = dict(width=self.enc_width, num_latents=self.num_latents, enc_layers=self.enc_layers,
                       n_heads=self.n_heads, out_dim=self.enc_width)
        return {"decoder": decoder, "encoder": encoder}


def mesh_example(seed: int, num_points: int, pc_seed, spec: ProceduralSpec | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(point cloud [N, 6], BPT tokens [L] with EOS) of procedural mesh `seed`."""
    m = generate_mesh(seed, spec)
    return point_cloud(m.vertices, m.faces, num_points, pc_seed), BPTTokenizer().encode(m.vertices, m.faces)


def collate(items: list[tuple[np.ndarray, np.ndarray]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Point clouds [B, N, 6] and tokens [B, L] padded with -1."""
    tokens = pad_sequence([torch.as_tensor(t, dtype=torch.long) for _, t in items], batch_first=True, padding_value=-1)
    return torch.from_numpy(np.stack([p for p, _ in items])), tokens


class SeedStream:
    """Train seeds in a fixed shuffled order, skipping meshes longer than max_tokens (lengths cached)."""

    def __init__(self, seed: int, max_tokens: int, spec: ProceduralSpec | None = None) -> None:
        self.rng_seed, self.max_tokens, self.spec = seed, max_tokens, spec
        self.lengths: dict[int, int] = {}

    def pool(self, index: int, size: int) -> list[int]:
        """`size` usable seeds of pool `index` (a pure function of index), sorted by length."""
        out, i, train = [], index * size * 4, split_seeds("train")
        while len(out) < size:
            if i > (index + 1) * size * 4 + 100 * size:
                raise ValueError(f"too few procedural meshes within {self.max_tokens} tokens")
            s = int(train[int(np.random.default_rng([self.rng_seed, i]).integers(len(train)))])
            i += 1
            if s not in self.lengths:
                m = generate_mesh(s, self.spec)
                self.lengths[s] = len(BPTTokenizer().encode(m.vertices, m.faces))
            if self.lengths[s] <= self.max_tokens:
                out.append(s)
        return sorted(out, key=lambda s: self.lengths[s])


def eval_set(count: int, num_points: int, max_tokens: int, spec: ProceduralSpec | None = None
             ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Fixed validation examples (first `count` validation seeds within max_tokens)."""
    examples = (mesh_example(int(s), num_points, int(s), spec) for s in split_seeds("validation"))
    return list(itertools.islice(((pc, t) for pc, t in examples if len(t) <= max_tokens), count))


def sequence_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits [B, L, V], tokens [B, L] with -1 padding."""
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten(), ignore_index=-1)


@torch.no_grad()
def evaluate(model: MeshGPT, examples, batch_size: int = 8, table: FactoredTable | None = None) -> dict[str, float]:
    """Validation loss and next-token accuracy (teacher forced)."""
    model.eval()
    weights = None if table is None else table(model.decoder.tok_embeddings.weight)  # [V, dim]
    total = correct = 0
    loss_sum = 0.0
    device = next(model.parameters()).device
    for i in range(0, len(examples), batch_size):
        pc, tokens = (t.to(device) for t in collate(examples[i : i + batch_size]))
        logits, _, _ = model.forward_train(pc, tokens, weights)
        mask = tokens >= 0
        loss_sum += float(F.cross_entropy(logits[mask].float(), tokens[mask], reduction="sum"))
        correct += int((logits.argmax(-1) == tokens)[mask].sum())
        total += int(mask.sum())
    model.train()
    return {"val_loss": loss_sum / total, "val_acc": correct / total}


class MeshTask(TrainTask):
    """Next-token cross-entropy of the mesh GPT (and its factored token table) on procedural meshes; the batch
    of a step is a pure function of (config, step)."""

    def __init__(self, cfg: MeshTrainConfig, model: MeshGPT, table: FactoredTable | None,
                 log: Callable[[str], None]) -> None:
        self.cfg, self.model, self.table, self.log = cfg, model, table, log
        self.modules = {"model": model} | ({"table": table} if table is not None else {})
        opt = cfg.adamw([p for m in self.modules.values() for p in m.parameters() if p.requires_grad])
        self.optims = {"optim": Optim(opt, lambda s: cfg.lr_at(s, cfg.steps), cfg.grad_clip)}
        self.stream = SeedStream(cfg.seed, cfg.max_tokens, cfg.spec())
        self.val = eval_set(cfg.eval_meshes, cfg.num_points, cfg.max_tokens, cfg.spec())

    def batch(self, at: At) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch b = step * shards + shard: one length-sorted chunk of a pool, chunks visited in a seeded order."""
        cfg, b = self.cfg, at.step * at.shards + at.shard
        pool = self.stream.pool(b // cfg.pool_batches, cfg.batch_size * cfg.pool_batches)
        order = np.random.default_rng([cfg.seed, b // cfg.pool_batches, 7]).permutation(cfg.pool_batches)
        k = int(order[b % cfg.pool_batches])
        seeds = pool[k * cfg.batch_size : (k + 1) * cfg.batch_size]
        return collate([mesh_example(s, cfg.num_points, [s, b], self.stream.spec) for s in seeds])

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        pc, tokens = batch
        weights = None if self.table is None else self.table(self.model.decoder.tok_embeddings.weight)  # [V, dim]
        logits, _, _ = self.model.forward_train(pc, tokens, weights)
        loss = sequence_loss(logits, tokens)
        return loss, {"loss": float(loss.detach()), "tokens": float((tokens >= 0).sum())}

    def evaluate(self, progress: Progress) -> dict[str, Any]:
        ev = evaluate(self.model, self.val, table=self.table)
        return {"step": progress.step, "train_loss": progress.recent_mean("loss", self.cfg.log_every), **ev}

    def restore(self, meta: dict[str, Any], progress: Progress) -> None:
        old = meta["config"]
        if (old["steps"], old["max_minutes"]) != (self.cfg.steps, self.cfg.max_minutes):
            self.log(f"budget changed on resume: steps {old['steps']} -> {self.cfg.steps}, max_minutes "
                     f"{old['max_minutes']} -> {self.cfg.max_minutes} (cosine now ends at step {self.cfg.steps})")


def train(cfg: MeshTrainConfig, out: Path, log: Callable[[str], None] = lambda s: None,
          device: str = "cpu", register: str = "", force: bool = False) -> dict[str, Any]:
    """Run (or resume) training into `out` on the shared loop, install it as target/`register` (unless ""); returns
    the final metrics."""
    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    model = MeshGPT(**cfg.model_kwargs()).train()
    table = FactoredTable(BPTTokenizer(), cfg.dim) if cfg.factored_embedding else None
    # max_minutes counts the training process's CPU time over all sessions: pauses (SIGSTOP) and other jobs on a
    # shared machine do not eat the budget
    loop = Loop(LoopOptions.of(cfg, budget="cpu", device=device), log)
    task = MeshTask(cfg, model, table, loop.log)
    n_params = sum(p.numel() for p in model.parameters())  # the tied LM head is counted once
    loop.log(f"{n_params / 1e6:.2f}M parameters")
    # budgets (steps, max_minutes) may change on resume; the cosine follows `steps`
    state = StateFile(out / "state.safetensors", {"config": asdict(cfg)}, loose=("max_minutes", "steps", "ship_dir"))
    progress = loop.run(task, state)
    model.cpu()
    if not loop.is_main:
        return {}
    if table is not None:  # the shipped model is a plain MeshGPT: fold the factored table in (a copy)
        model = copy.deepcopy(model)
        table.cpu().fold(model.decoder.tok_embeddings)
    ev = evaluate(model, task.val)
    metrics = {"steps": progress.step, "train_minutes": round(progress.cpu / 60, 2),
               **{k: round(v, 4) for k, v in ev.items()}, "history": progress.history}
    tied = {"decoder.output.weight": "decoder.tok_embeddings.weight"}
    meta = {"kind": "target", "builder": "mesh_gpt", "kwargs": model.builder_kwargs(),
            "vocab_size": BPTTokenizer().vocab_size, "modality": "mesh", "tokenizer": "bpt",
            "num_points": cfg.num_points, "max_tokens": cfg.max_tokens, "tied": tied,
            "procedural": asdict(cfg.spec()),  # the distribution heads, benchmark and generate draw from
            "created_by": "python -m specgen.train.mesh", "train_config": asdict(cfg), "metrics": metrics}
    state = fp16_state(model, untie=True)
    write_entry(out, state, meta)
    publish("target", register, cfg.ship_dir, state, meta, Path(cfg.ship_dir).name, force)
    log(f"done: step {progress.step}, val_loss {ev['val_loss']:.4f}, val_acc {ev['val_acc']:.4f}; wrote {out}")
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = script_parser("specgen.train.mesh", __doc__, "recipes/tiny/mesh-gpt.yaml", config_required=True,
                           registers=True)
    parser.add_argument("--register", default=None, help="also install the result as target/NAME")
    cfg, args, log = parse_recipe(parser, MeshTrainConfig, argv)
    with registering(args.out):
        check_outputs([("target", args.register or "", cfg.ship_dir)], args.force, "--register NEW")  # before training
        return print_metrics(train(cfg, Path(args.out), log, device=args.device, register=args.register or "",
                                   force=args.force))


if __name__ == "__main__":
    raise SystemExit(run_script(main))
