"""Consistency distillation of a text target on its Jacobi trajectories: pcLLM or CLLM (docs/methods/pcllm.md)."""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from specgen import checkpoints, registry
from specgen.devices import resolve_device, resolve_dtype
from specgen.errors import IncompatibleError, UsageError
from specgen.models.lora import merge_lora_state, merge_scale as checked_merge_scale
from specgen.models.tokenizer import copy_tokenizer
from specgen.paths import atomic_dir
from specgen.text.target import open_text_model
from specgen.text.trajectories import load_records, read_meta, tokenizer_hash
from specgen.train import packing
from specgen.train.checkpoint import StaleStateError
from specgen.train.lora import apply_lora, lora_state, merge_lora
from specgen.train.loop import (MIXED_PRECISION, At, Loop, LoopOptions, Optim, Progress, StateFile, TrainTask,
                                check_choices)
from specgen.train.optim import cosine_lr
from specgen.train.script import run_script


@dataclass
class DistillConfig:
    """Options of `specgen distill` (recipe keys)."""

    model: str = "smollm2-135m"  # the model being distilled (= the trajectories' target)
    trajectories: str = ""  # folder written by `specgen collect-trajectories`
    name: str = "smollm2-135m-distilled"  # registered as target/<name> (merged) and adapter/<name>-lora (LoRA)
    objective: str = "pcllm"  # pcllm | cllm
    block_size: int = 16  # must equal the trajectories' block size
    schedule: str = "progressive"  # progressive | reverse | random
    window: int = 16  # noise-schedule window w (also the `window` mask's window)
    mask: str = "noisy"  # noisy (default, paper's NC) | clean | window
    ar_weight: float = 10.0  # w in L = L_pc + w L_AR
    temperature: float = 1.0
    max_blocks: int = 0  # > 0: pack this many consecutive blocks (random aligned start; earlier ones = clean prefix)
    finetune: str = "lora"  # lora | full
    lora_rank: int = 16
    lora_alpha: float = 32.0
    lora_targets: list[str] = field(default_factory=lambda: ["wqkv", "wo", "w1", "w2", "w3"])
    init_adapter: str = ""  # start from this adapter (e.g. an earlier round); must belong to `model`
    steps: int = 200  # optimizer steps
    grad_accum: int = 1
    lr: float = 2e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    ckpt_every: int = 25
    log_every: int = 5
    seed: int = 0
    threads: int = 0
    device: str = "cpu"  # cpu, or "auto" (accelerate's choice: cuda when present)
    mixed_precision: str = "no"  # no | bf16 | fp16, or --dtype's float32 | bfloat16 | float16 (accelerate)
    max_minutes: float = 0.0  # > 0: stop (checkpointed, registered) after this wall time
    register: bool = True


#: Settings a resumed run may change (budget, logging, registration); any other change is refused.
RESUME_LOOSE = ("steps", "max_minutes", "log_every", "ckpt_every", "register", "name", "threads")


def check_config(cfg: DistillConfig) -> None:
    """One-line usage errors for settings no run could use, before anything loads."""
    if cfg.register:  # register=false writes no entry: its name (name= too) is only the summary's label
        if not cfg.name:
            raise UsageError("name= is empty: distill registers target/NAME and adapter/NAME-lora; give a name, "
                             "or register=false to register nothing")
        registry.check_name(cfg.name + "-lora", "name (+ -lora: target/NAME, adapter/NAME-lora)")
    if cfg.mixed_precision not in MIXED_PRECISION:
        raise UsageError(f"--dtype / mixed_precision must be one of {', '.join(MIXED_PRECISION)}, "
                         f"got {cfg.mixed_precision!r}")
    if MIXED_PRECISION[cfg.mixed_precision] == "fp16":  # float16 on a CPU without float16 kernels: one line
        resolve_dtype("float16", resolve_device(cfg.device))
    check_choices(cfg, {"objective": OBJECTIVES, "schedule": packing.SCHEDULES, "mask": packing.MASKS,
                        "finetune": ("lora", "full")})
    if not cfg.trajectories:
        raise UsageError("trajectories=FOLDER is required (written by `specgen collect-trajectories`)")


def outputs(cfg: DistillConfig) -> list[tuple[str, str, str]]:
    """(kind, name, ship folder) of the entries a run registers."""
    lora = [("adapter", f"{cfg.name}-lora", "")] if cfg.finetune == "lora" else []
    return lora + [("target", cfg.name, "")] if cfg.register else []


def kl_rows(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per-row KL(softmax(teacher/T) || softmax(student/T)); teacher is detached here. [R]."""
    t = F.log_softmax(teacher.detach().float() / temperature, -1)
    s = F.log_softmax(student.float() / temperature, -1)
    return (t.exp() * (t - s)).sum(-1)


def pcllm_losses(model, blocks: list[dict], cfg: DistillConfig, rng: random.Random, device,
                 stop_ids: tuple[int, ...]) -> dict:
    """One forward over a packed sample of `blocks` (with `max_blocks`, a random aligned window): loss, pc, ar."""
    start = rng.randrange(0, len(blocks), cfg.max_blocks) if cfg.max_blocks else 0
    sample = packing.build_sample(blocks, cfg.schedule, cfg.window, rng, cfg.max_blocks, stop_ids, start)
    mask = packing.noise_aware_mask(sample.segments, cfg.mask, cfg.window)
    logits, _ = model(sample.tokens[None].to(device), sample.positions[None].to(device), None, mask[None].to(device))
    logits = logits[0]
    ar = F.cross_entropy(logits[sample.ar_src.to(device)].float(), sample.ar_tgt.to(device))
    if len(sample.student):
        kl = kl_rows(logits[sample.student.to(device)], logits[sample.teacher.to(device)], cfg.temperature)
        pc = kl.sum() * cfg.temperature**2 / sample.num_blocks
    else:
        pc = logits.sum() * 0.0
    return {"loss": pc + cfg.ar_weight * ar, "pc": pc, "ar": ar}


def cllm_losses(model, blocks: list[dict], cfg: DistillConfig, rng: random.Random, device,
                stop_ids: tuple[int, ...]) -> dict:
    """CLLM global consistency + AR loss: teacher on the clean sequence, student on one noisy state."""
    blocks = blocks[: cfg.max_blocks or None]
    prompt = list(blocks[0]["prompt_ids"])
    fixed = [list(b["fixed_point"]) for b in blocks]
    i = rng.randrange(len(blocks))
    traj = blocks[i]["trajectory"]
    y = list(traj[rng.randrange(max(len(traj) - 1, 1))])
    answer = [t for b in fixed for t in b]
    clean = torch.tensor([prompt + answer], device=device)
    pos = torch.arange(clean.shape[1], device=device)[None]
    logits_c, _ = model(clean, pos, None, None)
    p, n = len(prompt), cfg.block_size
    eos = next((k for k, t in enumerate(answer) if t in stop_ids), len(answer))
    last = min(eos, len(answer) - 1)
    ar = F.cross_entropy(logits_c[0, p - 1 : p + last].float(), clean[0, p : p + last + 1])
    ctx = prompt + answer[: i * n]
    noisy = torch.tensor([ctx + y], device=device)
    logits_s, _ = model(noisy, torch.arange(noisy.shape[1], device=device)[None], None, None)
    d = packing.first_mismatch(y, fixed[i])
    hi = min(n, eos - i * n)  # offsets whose predicted token is not past the stop token
    if d < hi:
        base = len(ctx)
        kl = kl_rows(logits_s[0, base + d : base + hi], logits_c[0, base + d : base + hi], cfg.temperature)
        pc = kl.sum() * cfg.temperature**2
    else:
        pc = logits_s.sum() * 0.0
    return {"loss": pc + cfg.ar_weight * ar, "pc": pc, "ar": ar}


#: objective -> its losses on one prompt's blocks
OBJECTIVES = {"pcllm": pcllm_losses, "cllm": cllm_losses}


class DistillTask(TrainTask):
    """pcLLM or CLLM losses on the trajectories: micro-batch `at` trains on a prompt of a seeded per-epoch order with
    a random.Random seeded by (seed, prompt, step), so a resumed or multi-process run sees what one process does."""

    def __init__(self, cfg: DistillConfig, model, params: list, groups: list[list[dict]],
                 stop_ids: tuple[int, ...]) -> None:
        self.cfg, self.model, self.groups, self.stop_ids = cfg, model, groups, stop_ids
        self.data = data_digest(groups)
        opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
        self.modules = {"model": model}
        self.optims = {"optim": Optim(opt, lambda s: cosine_lr(s, cfg.steps, cfg.lr, cfg.lr * cfg.min_lr_ratio,
                                                               cfg.warmup_steps), cfg.grad_clip)}

    def batch(self, at: At):
        cfg, groups = self.cfg, self.groups
        epoch, pos = divmod(at.step * at.shards + at.shard, len(groups))  # a seeded permutation of prompts per epoch
        idx = int(torch.randperm(len(groups), generator=torch.Generator().manual_seed(cfg.seed * 100_003 + epoch))[pos])
        return groups[idx], random.Random(cfg.seed * 1_000_003 + idx * 7919 + at.step)

    def loss(self, batch):
        blocks, rng = batch
        losses = OBJECTIVES[self.cfg.objective](self.model, blocks, self.cfg, rng, next(self.model.parameters()).device,
                                                self.stop_ids)
        return losses["loss"], {k: float(losses[k].detach()) for k in ("loss", "pc", "ar")}

    def meta(self) -> dict[str, Any]:
        return {"data": self.data}

    def restore(self, meta: dict[str, Any], progress: Progress) -> None:
        # a batch is a function of the step and the records: on other records (the trajectory folder collected
        # further, or re-collected, since) the resumed steps would train on other prompts than the first ones did,
        # ending with weights that neither data would give; a state recording no digest (older specgen) is trusted
        if meta.get("data", self.data) != self.data:
            raise StaleStateError(f"{self.cfg.trajectories} holds other trajectories than the run in the state was "
                                  "trained on (collected further or again since); use a fresh --out")

    def evaluate(self, progress: Progress) -> dict[str, Any]:
        """The history record of a log line: its mean losses and learning rate."""
        return {"step": progress.step, **{k: round(v, 5) for k, v in progress.last_log.items()},
                "lr": self.optims["optim"].lr(progress.step - 1), "elapsed_s": round(progress.elapsed, 1)}


def data_digest(groups: list[list[dict]]) -> str:
    """sha256 (16 hex) of the records training reads, in their grouped order."""
    return hashlib.sha256(json.dumps(groups, sort_keys=True, default=str).encode()).hexdigest()[:16]


def group_records(records: list[dict]) -> list[list[dict]]:
    """Block records grouped per prompt (sorted by block), prompts in data_id order."""
    ordered = sorted(records, key=lambda r: (int(r["data_id"]), r["block"]))
    return [list(g) for _, g in itertools.groupby(ordered, key=lambda r: int(r["data_id"]))]


def distill(cfg: DistillConfig, out: Path, log: Callable[[str], None] = lambda s: None, progress=None,
            force: bool = False) -> dict | None:
    """Train (resuming from OUT/state.safetensors: the trained weights only), register the result; returns a summary
    (rank 0's; None in the other processes of a data-parallel run)."""
    meta = read_meta(Path(cfg.trajectories))
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    with checkpoints.input_named("model", cfg.model, "text target"):
        source = open_text_model(cfg.model, "cpu", progress)
    if source.entry.kind != "target":  # its outputs would be a target without tokenizer and an adapter's adapter
        raise UsageError(f"{source.entry.ref} is no target; to train that adapter on, use model={source.base.ref} "
                         f"init_adapter={source.entry.name}")
    if source.quantize:  # no Linear layer to adapt or train: the weights are packed
        raise UsageError(f"{source.entry.ref} is quantized ({source.quantize}); distill its float model, "
                         f"model={source.base.ref}")
    if source.dtype != "float32":  # NAME+bf16: the weights would be rounded, trained and merged as such, unsaid
        raise UsageError(f"model={cfg.model} loads {source.base.ref} in {source.dtype}, which would round the weights "
                         f"distill trains and merges; use model={source.base.ref} --dtype {source.dtype} (autocast)")
    tm = source.load(progress, decode=False)
    tok_hash = tokenizer_hash(tm.tokenizer)
    init = None
    if cfg.init_adapter:  # a later progressive round: continue an adapter of this model
        with checkpoints.input_named("init_adapter", cfg.init_adapter, "adapter"):
            init = checkpoints.find(cfg.init_adapter)
        if init.kind != "adapter":  # check_pair would call it a drafter of no target (or of another one)
            raise UsageError(f"init_adapter={cfg.init_adapter}: {init.ref} is not a LoRA adapter; give "
                             f"adapter/<name> (from `specgen distill`)")
        registry.check_pair(init, tm.entry)
    # trajectories of this target and tokenizer, or of this model merged with the adapter being continued (a later
    # progressive round collects from the previous round's merged model), at this block size
    derived = (init.meta.get("merged_target", ""),) if init is not None else ()
    if meta.get("tokenizer_hash") != tok_hash or meta.get("target") not in (tm.entry.ref, *derived):
        raise IncompatibleError(f"trajectories in {cfg.trajectories} come from {meta.get('target')} (tokenizer "
                                f"{meta.get('tokenizer_hash')}), but the model to distil is {tm.entry.ref} (tokenizer "
                                f"{tok_hash})")
    named = tm.entry if meta["target"] == tm.entry.ref else registry.installed_entry(meta["target"])
    now = None if named is None else registry.weights_digest(named, read=False)
    if not registry.same_weights(meta.get("target_digest"), now):  # the entry they name still holds those weights
        raise IncompatibleError(f"the trajectories in {cfg.trajectories} were collected from other weights of "
                                f"{meta['target']} (saved again since); collect them again from it into a new --out")
    if meta.get("block_size") != cfg.block_size:
        raise IncompatibleError(f"block_size={cfg.block_size} but the trajectories in {cfg.trajectories} use "
                                f"block size {meta.get('block_size')}")
    groups = group_records(load_records(Path(cfg.trajectories)))
    if not groups:
        raise UsageError(f"{cfg.trajectories} holds no records")
    stop_ids = tm.tokenizer.stop_ids
    model = tm.module.float().train()
    torch.manual_seed(cfg.seed)
    if init is not None and cfg.finetune == "full":
        try:
            merge_lora_state(model, registry.read_state(init), init.meta["lora_rank"], init.meta["lora_alpha"])
        except (ValueError, KeyError) as e:  # its layers do not fit, or hold NaN: one line naming the adapter
            raise IncompatibleError(f"{init.ref} cannot merge into {tm.entry.ref}: {e}") from None
    if cfg.finetune == "lora":
        model.requires_grad_(False)
        apply_lora(model, tuple(cfg.lora_targets), cfg.lora_rank, cfg.lora_alpha)
        if init is not None:  # same rank/targets: the adapter keeps training, still relative to `model`
            if (init.meta.get("lora_rank"), init.meta.get("lora_alpha")) != (cfg.lora_rank, cfg.lora_alpha):
                raise IncompatibleError(f"{init.ref} has rank {init.meta.get('lora_rank')} / alpha "
                                        f"{init.meta.get('lora_alpha')}, not {cfg.lora_rank} / {cfg.lora_alpha}")
            state = registry.read_state(init)
            if poisoned := registry.nonfinite(state):  # training would go on from NaN losses
                raise IncompatibleError(f"{init.ref} holds NaN or infinite values in {poisoned}")
            bad = model.load_state_dict(state, strict=False).unexpected_keys
            if bad:
                raise IncompatibleError(f"{init.ref} adapts {bad[0]}, which this run's lora_targets do not wrap")
    params = [p for p in model.parameters() if p.requires_grad]
    loop = Loop(LoopOptions.of(cfg, eval_every=cfg.log_every, ckpt_at_eval=False), log)
    task = DistillTask(cfg, model, params, groups, stop_ids)
    loop.log(f"{cfg.objective} on {tm.entry.ref}: {len(groups)} prompts, {sum(len(g) for g in groups)} blocks, "
             f"{sum(p.numel() for p in params):,} trainable parameters ({cfg.finetune})")
    done = loop.run(task, StateFile(Path(out) / "state.safetensors", {"config": asdict(cfg)}, RESUME_LOOSE,
                                    trainable=True))
    summary = {"name": cfg.name, "objective": cfg.objective, "steps": done.step, "target": tm.entry.ref,
               "history": done.history, "finished": not done.stopped_early, "entries": []}
    if loop.is_main and cfg.register:
        summary["entries"] = register(model.cpu(), tm, cfg, meta, tok_hash, done.history, done.step, force)
    loop.wait()
    return summary if loop.is_main else None


def register(model, tm, cfg: DistillConfig, traj_meta: dict, tok_hash: str, history: list[dict], step: int,
             force: bool = False) -> list[str]:
    """adapter/<name>-lora (LoRA only) and target/<name> (weights with the adapter merged), tokenizer copied."""
    common = {"objective": cfg.objective, "block_size": cfg.block_size, "tokenizer_hash": tok_hash,
              "vocab_size": tm.target.vocab_size, "trajectories": {k: traj_meta.get(k) for k in
              ("target", "target_digest", "tokenizer_hash", "block_size", "max_new_tokens", "prompt_source",
               "prompt_fingerprint")},
              "config": asdict(cfg), "metrics": {"history": history[-5:], "steps": step},
              "created_by": "specgen distill"}
    refs = []
    if cfg.finetune == "lora":
        state = lora_state(model)
        if cfg.init_adapter:
            common["init_adapter"] = cfg.init_adapter
        e = registry.save("adapter", f"{cfg.name}-lora", state, {**common, "parent": tm.entry.ref,
                                                        "parent_digest": registry.weights_digest(tm.entry, read=False),
                                                        "merged_target": f"target/{cfg.name}", "lora_rank": cfg.lora_rank,
                                                        "lora_alpha": cfg.lora_alpha,
                                                        "lora_targets": list(cfg.lora_targets)}, force=force)
        refs.append(e.ref)
        merge_lora(model)
    full = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    e = registry.save("target", cfg.name, full, {
        **common, "builder": "transformer", "kwargs": model.cfg.to_dict(), "modality": "text", "tokenizer": True,
        "distilled_from": tm.entry.ref}, extra=lambda d: copy_tokenizer(tm.entry.path, d), force=force)
    refs.append(e.ref)
    return refs


#: The files of an exported adapter (text/merge.py reads them).
ASSET_FILES = ("adapter.safetensors", "adapter.json")


def export_adapter(name: str, folder: Path, merge_scale: float | None = None) -> Path:
    """Write adapter `name` as a shippable asset: adapter.safetensors (fp16) + adapter.json, with the `merge_scale`
    the built-in merges it with (text/merge.py)."""
    entry = checkpoints.find(name)
    if entry.kind != "adapter":
        raise UsageError(f"{entry.ref} is not an adapter")
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} is a file, not a folder")
    other = sorted(p.name for p in folder.iterdir() if p.name not in ASSET_FILES) if folder.is_dir() else []
    if other:  # the export replaces the whole folder: only an earlier export's files may go
        raise UsageError(f"{folder} holds other files ({', '.join(other[:3])}), which the export would delete; "
                         f"name a new or empty folder, or an earlier export")

    def fill(tmp: Path) -> None:
        state = {k: v.to(torch.float16).contiguous() for k, v in registry.read_state(entry).items()}
        registry.save_safetensors(state, tmp / "adapter.safetensors", name=folder / "adapter.safetensors")
        keep = ("parent", "lora_rank", "lora_alpha", "lora_targets", "tokenizer_hash", "vocab_size", "objective",
                "block_size", "trajectories", "metrics", "config", "init_adapter")
        meta = {k: entry.meta[k] for k in keep if k in entry.meta}
        if merge_scale is not None:
            meta["merge_scale"] = checked_merge_scale({}, merge_scale)
        (tmp / "adapter.json").write_text(json.dumps({**meta, "exported_from": entry.ref, "dtype": "float16"},
                                                     indent=2, sort_keys=True))
        for f in tmp.iterdir():  # shipped files: world-readable like the rest of the package
            f.chmod(0o644)
        tmp.chmod(0o755)

    return atomic_dir(folder, fill)


if __name__ == "__main__":  # python -m specgen.train.distill export ADAPTER FOLDER [MERGE_SCALE]
    parser = argparse.ArgumentParser(prog="python -m specgen.train.distill", description=export_adapter.__doc__)
    parser.add_argument("command", choices=["export"])
    parser.add_argument("adapter")
    parser.add_argument("folder", type=Path)
    parser.add_argument("merge_scale", nargs="?", type=float)
    args = parser.parse_args()
    raise SystemExit(run_script(lambda: print(export_adapter(args.adapter, args.folder, args.merge_scale)) or 0))
