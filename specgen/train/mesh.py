"""Train the tiny point-cloud-conditioned mesh GPT on procedural meshes; resumable, writes fp16 safetensors.

    python -m specgen.train.mesh --config recipes/tiny/mesh-gpt.yaml --out runs/mesh-gpt [key=value ...]

Data: `procedural.generate_mesh(seed)` over the train seed range, BPT tokens (`BPTTokenizer`, EOS
appended), and `num_points` area-weighted surface samples with face normals as the condition (a fresh
sample per step, so the model never sees the same cloud twice). Meshes whose sequence is longer than
`max_tokens` are skipped (CPU budget: see the recipe). Batches are drawn from pools of
`pool_batches * batch_size` meshes sorted by length, so rows of a batch have similar lengths.
Every step is a pure function of (config, step), so a resumed run sees the same data.

Resume state (`state.safetensors`: weights + AdamW moments, no pickle) is written every `ckpt_every`
steps; the run directory finally holds `model.safetensors` (fp16) + `config.json` in registry layout,
and `--register NAME` also installs it as target/NAME.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from specgen.train.script import file_logger
from specgen.mesh.pointcloud import sample_surface
from specgen.mesh.procedural import generate_mesh, split_seeds
from specgen.mesh.tokenizers import BPTTokenizer
from specgen.models.mesh import MeshGPT


@dataclass(frozen=True)
class MeshTrainConfig:
    """Everything a mesh GPT run depends on (a YAML recipe sets any subset of these keys)."""

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
    batch_size: int = 8
    pool_batches: int = 8
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 200
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_meshes: int = 32
    eval_every: int = 250
    ckpt_every: int = 50
    log_every: int = 25
    num_threads: int = 1
    max_minutes: float = 0.0  # > 0: stop after this much training CPU time (a budget: may change on resume)

    def model_kwargs(self) -> dict:
        decoder = dict(vocab_size=BPTTokenizer().vocab_size, dim=self.dim, n_layers=self.n_layers,
                       n_heads=self.n_heads, n_kv_heads=self.n_heads, ffn_dim=self.ffn_dim,
                       max_seq_len=self.max_seq_len, cross_dim=self.enc_width, tie_embeddings=True)
        encoder = dict(width=self.enc_width, num_latents=self.num_latents, enc_layers=self.enc_layers,
                       n_heads=self.n_heads, out_dim=self.enc_width)
        return {"decoder": decoder, "encoder": encoder}


def load_recipe(cls, path: str | os.PathLike | None, overrides: list[str] = ()):
    """YAML recipe + `key=value` overrides (values parsed as YAML) -> a frozen config dataclass."""
    import yaml

    d = {}
    if path:
        with open(path) as f:
            d = yaml.safe_load(f) or {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} is not key=value")
        d[key.strip()] = yaml.safe_load(value)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"unknown keys {unknown}; known: {sorted(known)}")
    return cls(**d)


# -- data -----------------------------------------------------------------------------------------
def point_cloud(vertices: np.ndarray, faces: np.ndarray, num_points: int, seed) -> np.ndarray:
    """Condition input [num_points, 6] float32: surface points + face normals."""
    return sample_surface(vertices, faces, num_points, seed).as_array(np.float32)


def mesh_example(seed: int, num_points: int, pc_seed) -> tuple[np.ndarray, np.ndarray]:
    """(point cloud [N, 6], BPT tokens [L] with EOS) of procedural mesh `seed`."""
    m = generate_mesh(seed)
    return point_cloud(m.vertices, m.faces, num_points, pc_seed), BPTTokenizer().encode(m.vertices, m.faces)


def collate(items: list[tuple[np.ndarray, np.ndarray]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Point clouds [B, N, 6] and tokens [B, L] padded with -1."""
    length = max(len(t) for _, t in items)
    tokens = torch.full((len(items), length), -1, dtype=torch.long)
    for i, (_, t) in enumerate(items):
        tokens[i, : len(t)] = torch.as_tensor(t)
    return torch.from_numpy(np.stack([p for p, _ in items])), tokens


class SeedStream:
    """Train seeds in a fixed shuffled order, skipping meshes longer than max_tokens (lengths cached)."""

    def __init__(self, seed: int, max_tokens: int) -> None:
        self.rng_seed, self.max_tokens = seed, max_tokens
        self.lengths: dict[int, int] = {}

    def seed_at(self, i: int) -> int:
        train = split_seeds("train")
        return int(train[int(np.random.default_rng([self.rng_seed, i]).integers(len(train)))])

    def pool(self, index: int, size: int) -> list[int]:
        """`size` usable seeds of pool `index` (a pure function of index), sorted by length."""
        out, i = [], index * size * 4
        while len(out) < size:
            if i > (index + 1) * size * 4 + 100 * size:
                raise ValueError(f"too few procedural meshes within {self.max_tokens} tokens")
            s = self.seed_at(i)
            i += 1
            if s not in self.lengths:
                m = generate_mesh(s)
                self.lengths[s] = len(BPTTokenizer().encode(m.vertices, m.faces))
            if self.lengths[s] <= self.max_tokens:
                out.append(s)
        return sorted(out, key=lambda s: self.lengths[s])


def train_batch(cfg: MeshTrainConfig, stream: SeedStream, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of `step`: one length-sorted chunk of a pool, chunks visited in a seeded order."""
    pool = stream.pool(step // cfg.pool_batches, cfg.batch_size * cfg.pool_batches)
    order = np.random.default_rng([cfg.seed, step // cfg.pool_batches, 7]).permutation(cfg.pool_batches)
    k = int(order[step % cfg.pool_batches])
    seeds = pool[k * cfg.batch_size : (k + 1) * cfg.batch_size]
    return collate([mesh_example(s, cfg.num_points, [s, step]) for s in seeds])


def eval_set(count: int, num_points: int, max_tokens: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Fixed validation examples (first `count` validation seeds within max_tokens)."""
    out = []
    for s in split_seeds("validation"):
        pc, t = mesh_example(int(s), num_points, int(s))
        if len(t) <= max_tokens:
            out.append((pc, t))
        if len(out) == count:
            return out
    return out


def sequence_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits [B, L, V], tokens [B, L] with -1 padding."""
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten(), ignore_index=-1)


# -- persistence ----------------------------------------------------------------------------------
def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_train_state(path: Path, params: list[torch.nn.Parameter], modules: dict[str, torch.nn.Module],
                     opt: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
    """Weights of `modules` + AdamW moments of `params` + string meta, as safetensors (no pickle)."""
    from safetensors.torch import save_file

    tensors = {f"{name}.{k}": v.detach().clone().contiguous()
               for name, m in modules.items() for k, v in m.state_dict().items()}
    for i, p in enumerate(params):
        for k, v in opt.state.get(p, {}).items():
            tensors[f"optim.{i}.{k}"] = torch.as_tensor(v).detach().clone().contiguous()
    atomic_write(path, lambda p: save_file(tensors, p, metadata={k: json.dumps(v) for k, v in meta.items()}))


def load_train_state(path: Path, params: list[torch.nn.Parameter], modules: dict[str, torch.nn.Module],
                     opt: torch.optim.Optimizer, config: dict) -> dict[str, Any] | None:
    """Restore what `save_train_state` wrote; None when there is no state; refuses another config."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    if not path.exists():
        return None
    with safe_open(str(path), "pt") as f:
        meta = {k: json.loads(v) for k, v in f.metadata().items()}
    budget_keys = ("max_minutes", "steps")  # budgets: a resumed run may change them (the caller logs it)
    strip = lambda c: {k: v for k, v in (c or {}).items() if k not in budget_keys}  # noqa: E731
    if strip(meta.get("config")) != strip(json.loads(json.dumps(config))):
        raise ValueError(f"{path} was written by a different training config; use a fresh --out")
    tensors = load_file(str(path))
    for name, m in modules.items():
        m.load_state_dict({k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".")}, strict=True)
    for i, p in enumerate(params):
        st = {k.split(".", 2)[2]: v for k, v in tensors.items() if k.startswith(f"optim.{i}.")}
        if st:
            opt.state[p] = st
    return meta


def fp16_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Shipping weights: floating tensors in fp16, tied aliases dropped (see registry.untie)."""
    from specgen.registry import untie

    state, _ = untie(module.state_dict())
    return {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in state.items()}


def write_entry(folder: Path, state: dict[str, torch.Tensor], meta: dict) -> None:
    """Registry-layout files in `folder`: model.safetensors + config.json (atomic each)."""
    from safetensors.torch import save_file

    atomic_write(folder / "model.safetensors", lambda p: save_file(state, p))
    atomic_write(folder / "config.json", lambda p: Path(p).write_text(json.dumps(meta, indent=2, sort_keys=True)))


def cosine_lr(step: int, total: int, lr: float, min_lr: float, warmup: int = 0) -> float:
    """Linear warmup then cosine decay from lr to min_lr over `total` steps."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, t)))


# -- training -------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model: MeshGPT, examples, batch_size: int = 8) -> dict[str, float]:
    """Validation loss and next-token accuracy (teacher forced)."""
    model.eval()
    total = correct = 0
    loss_sum = 0.0
    for i in range(0, len(examples), batch_size):
        pc, tokens = collate(examples[i : i + batch_size])
        logits, _, _ = model.forward_train(pc, tokens)
        mask = tokens >= 0
        loss_sum += float(F.cross_entropy(logits[mask].float(), tokens[mask], reduction="sum"))
        correct += int((logits.argmax(-1) == tokens)[mask].sum())
        total += int(mask.sum())
    model.train()
    return {"val_loss": loss_sum / total, "val_acc": correct / total}


def train(cfg: MeshTrainConfig, out: Path, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run (or resume) training into `out`; returns the final metrics."""
    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    model = MeshGPT(**cfg.model_kwargs()).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay)
    meta = load_train_state(out / "state.safetensors", params, {"model": model}, opt, asdict(cfg))
    step, elapsed, history = (meta["step"], meta["elapsed"], meta["history"]) if meta else (0, 0.0, [])
    n_params = sum(p.numel() for p in model.parameters())  # the tied LM head is counted once
    log(f"{'resumed at' if meta else 'starting'} step {step}/{cfg.steps}; {n_params / 1e6:.2f}M parameters")
    if meta and (meta["config"]["steps"], meta["config"]["max_minutes"]) != (cfg.steps, cfg.max_minutes):
        log(f"budget changed on resume: steps {meta['config']['steps']} -> {cfg.steps}, "
            f"max_minutes {meta['config']['max_minutes']} -> {cfg.max_minutes} (cosine now ends at step {cfg.steps})")
    stream, val = SeedStream(cfg.seed, cfg.max_tokens), eval_set(cfg.eval_meshes, cfg.num_points, cfg.max_tokens)
    # elapsed = CPU seconds of this (single-threaded) process: pauses (SIGSTOP) and other jobs on a shared
    # machine do not eat the budget; tokens/s in the log is per CPU second.
    t_last, toks, losses = time.process_time(), 0, []
    while step < cfg.steps and not (cfg.max_minutes and elapsed > 60 * cfg.max_minutes):
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, cfg.steps, cfg.lr, cfg.min_lr, cfg.warmup_steps)
        pc, tokens = train_batch(cfg, stream, step)
        logits, _, _ = model.forward_train(pc, tokens)
        loss = sequence_loss(logits, tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        step, toks = step + 1, toks + int((tokens >= 0).sum())
        losses.append(float(loss.detach()))
        now = time.process_time()
        elapsed, t_dt = elapsed + now - t_last, now - t_last
        t_last = now
        if step % cfg.log_every == 0:
            log(f"step {step} loss {np.mean(losses[-cfg.log_every:]):.4f} lr {opt.param_groups[0]['lr']:.2e} "
                f"tokens/s {toks / max(t_dt, 1e-9) if cfg.log_every == 1 else toks / (elapsed or 1):.0f} "
                f"elapsed {elapsed / 60:.1f} min")
        if step % cfg.eval_every == 0 or step == cfg.steps:
            ev = evaluate(model, val)
            history.append({"step": step, "train_loss": float(np.mean(losses[-cfg.log_every:])), **ev})
            log(f"eval step {step}: val_loss {ev['val_loss']:.4f} val_acc {ev['val_acc']:.4f}")
        if step % cfg.ckpt_every == 0:
            save_train_state(out / "state.safetensors", params, {"model": model}, opt,
                             {"step": step, "elapsed": elapsed, "history": history, "config": asdict(cfg)})
    save_train_state(out / "state.safetensors", params, {"model": model}, opt,
                     {"step": step, "elapsed": elapsed, "history": history, "config": asdict(cfg)})
    ev = evaluate(model, val)
    metrics = {"steps": step, "train_minutes": round(elapsed / 60, 2), **{k: round(v, 4) for k, v in ev.items()},
               "history": history}
    write_entry(out, fp16_state(model), entry_meta(cfg, metrics))
    log(f"done: step {step}, val_loss {ev['val_loss']:.4f}, val_acc {ev['val_acc']:.4f}; wrote {out}/model.safetensors")
    return metrics


def entry_meta(cfg: MeshTrainConfig, metrics: dict) -> dict:
    """config.json of the trained backbone (registry layout)."""
    tied = {"decoder.output.weight": "decoder.tok_embeddings.weight"}
    return {"kind": "target", "builder": "mesh_gpt", "kwargs": MeshGPT(**cfg.model_kwargs()).builder_kwargs(),
            "vocab_size": BPTTokenizer().vocab_size, "modality": "mesh", "tokenizer": "bpt",
            "num_points": cfg.num_points, "max_tokens": cfg.max_tokens, "tied": tied,
            "created_by": "python -m specgen.train.mesh", "train_config": asdict(cfg), "metrics": metrics}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specgen.train.mesh", description=__doc__)
    parser.add_argument("--config", required=True, help="YAML recipe, e.g. recipes/tiny/mesh-gpt.yaml")
    parser.add_argument("--out", required=True, help="run directory (resumed if it holds state.safetensors)")
    parser.add_argument("--log", default=None, help="log file (default: OUT/train.log); also echoed to stderr")
    parser.add_argument("--register", default=None, help="also install the result as target/NAME")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of recipe keys")
    args = parser.parse_args(argv)
    cfg = load_recipe(MeshTrainConfig, args.config, args.overrides)
    out = Path(args.out)
    log_path = Path(args.log) if args.log else out / "train.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)

    log = file_logger(log_path)

    metrics = train(cfg, out, log)
    if args.register:
        from specgen import registry
        from safetensors.torch import load_file

        meta = json.loads((out / "config.json").read_text())
        registry.save("target", args.register, load_file(str(out / "model.safetensors")),
                      {k: v for k, v in meta.items() if k not in ("kind", "name")})
    print(json.dumps({k: v for k, v in metrics.items() if k != "history"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
