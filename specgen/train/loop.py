"""The one training loop of every trainer: resume, log/eval/checkpoint cadence, gradient accumulation, accelerate."""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import SafetensorError
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from specgen.devices import resolve_device
from specgen.errors import CheckpointError, UsageError
from specgen.tensor_files import load_tensors, save_tensors
from specgen.train.checkpoint import StaleStateError

#: The tensor of the global torch RNG state in a train state.
RNG_KEY = "loop.torch_rng"
#: --dtype / recipe spellings -> accelerate's mixed_precision
MIXED_PRECISION = {"no": "no", "float32": "no", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16"}


def check_choices(cfg: Any, choices: Mapping[str, Collection[str]]) -> None:
    """A one-line UsageError for the first field of `cfg` named in `choices` whose value is not one of its choices."""
    for key, known in choices.items():
        if getattr(cfg, key) not in known:
            raise UsageError(f"{key} must be one of {', '.join(known)}, got {getattr(cfg, key)!r}")


@dataclass(frozen=True)
class LoopOptions:
    """How long, how often, where: the loop's part of a recipe."""

    steps: int  # length of the schedule (the last step logs, evaluates and checkpoints)
    stop_after: int = 0  # > 0: stop at this step of the `steps`-long schedule (a snapshot; rerun to go on)
    grad_accum: int = 1  # micro-batches per optimiser step (per process)
    log_every: int = 0  # 0: only the last step
    eval_every: int = 0  # 0: only the last step
    ckpt_every: int = 0  # 0: only with evaluations (ckpt_at_eval) and when the loop stops
    ckpt_at_eval: bool = True  # also write the state with every evaluation
    eval_first: bool = False  # log an evaluation before the first step of a fresh run
    max_minutes: float = 0.0  # > 0: stop (checkpointed) after the step at which the budget clock passes this
    budget: str = "session"  # session: wall time of this invocation | cpu: process CPU time summed over sessions
    device: str = "cpu"  # cpu | cuda | cuda:N | auto (specgen.devices)
    mixed_precision: str = "no"  # no | bf16 | fp16 (accelerate's autocast; fp16 adds loss scaling)

    @classmethod
    def of(cls, recipe: Any, **options: Any) -> LoopOptions:
        """The loop's keys a recipe dataclass has (steps, grad_accum, log_every, ...), `options` taking precedence."""
        names = {f.name for f in fields(cls)}
        return cls(**{**{f.name: getattr(recipe, f.name) for f in fields(recipe) if f.name in names}, **options})


@dataclass(frozen=True)
class Optim:
    """One optimiser the loop steps: its learning rate at (0-based) step s is `lr(s)`; `grad_clip` 0 = no clipping."""

    optimizer: torch.optim.Optimizer
    lr: Callable[[int], float]
    grad_clip: float = 0.0

    def params(self) -> list[torch.nn.Parameter]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]


@dataclass(frozen=True)
class At:
    """Which micro-batch: of optimiser step `step`, micro-batch `micro` of `accum`, on process `rank` of `world`;
    a trainer drawing one batch per step draws `shards` of them and keeps slice `shard` (alone: shard 0 of 1)."""

    step: int
    micro: int = 0
    accum: int = 1
    rank: int = 0
    world: int = 1

    @property
    def shard(self) -> int:
        return self.micro * self.world + self.rank

    @property
    def shards(self) -> int:
        return self.accum * self.world

    def draw(self, seed: int, steps: int, rows: int, size: int) -> tuple[torch.Tensor, torch.Generator]:
        """`size` random row indices [size] of `rows` (this shard's part of the step's draw) and a generator for its
        augmentation; shard 0 goes on with the rows' generator (as one process always did), the others get their own."""
        g = torch.Generator().manual_seed(seed * 1_000_003 + self.step)
        idx = torch.randint(0, rows, (size * self.shards,), generator=g)[self.shard * size : (self.shard + 1) * size]
        if self.shard:
            g = torch.Generator().manual_seed(seed * 1_000_003 + self.step + 7_919 * self.shard * steps)
        return idx, g


@dataclass
class Progress:
    """Where a run stands (restored on resume): what `evaluate` and the trainer's summary read."""

    step: int = 0
    history: list[dict] = field(default_factory=list)
    elapsed: float = 0.0  # wall seconds of training over all sessions (checkpoint writes excluded)
    cpu: float = 0.0  # process CPU seconds over all sessions
    window: list[dict] = field(default_factory=list)  # logged floats of the steps since the last log line
    last_log: dict[str, float] = field(default_factory=dict)  # means of the last log line
    recent: list[dict] = field(default_factory=list)  # logged floats of every step of this session
    resumed: bool = False
    stopped_early: bool = False  # the time budget ran out
    session_start: float = field(default_factory=time.perf_counter)

    def summary(self, measured: dict[str, Any]) -> dict[str, Any]:
        """A run's final metrics: `measured` (on the fp16 weights that ship), its steps, training time and history."""
        return {**measured, "steps": self.step, "train_seconds": round(self.elapsed, 1), "history": self.history,
                "weights": "fp16"}

    def recent_mean(self, key: str, last: int) -> float:
        """Mean of `key` over the last `last` steps of this session (nan without any)."""
        vals = [r[key] for r in self.recent[-last:] if key in r]
        return sum(vals) / len(vals) if vals else float("nan")


#: The fields of `Progress` a train state keeps.
SAVED = ("step", "history", "elapsed", "cpu", "window")
#: The meta key of the loss scaler's state (fp16 runs: scale and growth tracker, numbers).
SCALER = "loss_scaler"
#: budget clock name -> minutes it has run
BUDGETS: dict[str, Callable[[Progress], float]] = {"session": lambda p: (time.perf_counter() - p.session_start) / 60,
                                                   "cpu": lambda p: p.cpu / 60}


class TrainTask(ABC):
    """A trainer's model, data and loss: a subclass gives `batch` and `loss`; the other hooks default to nothing."""

    modules: dict[str, torch.nn.Module]  # saved in the state (in this order), moved to the loop's device
    optims: dict[str, Optim]  # stepped in this order

    @abstractmethod
    def batch(self, at: At) -> Any:
        """The micro-batch `at` (tensors on the CPU are moved to the device by the loop)."""

    @abstractmethod
    def loss(self, batch: Any) -> tuple[torch.Tensor | dict[str, torch.Tensor], dict[str, float]]:
        """(loss, or {optimiser name: loss} for the optimisers to step this step; floats to log). Which optimisers
        get a loss may depend on the step, never on the data: every process must average the same gradients."""

    def evaluate(self, progress: Progress) -> dict | None:
        """A history record after `progress.step` steps (None: nothing to record)."""
        return None

    def after_step(self, progress: Progress) -> dict[str, float] | None:
        """Called after every optimiser step (progress.step already counts it); may return more floats to log."""
        return None

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        """Further tensors of the state, restored in place on resume (e.g. code-usage counters)."""
        return {}

    def meta(self) -> dict[str, Any]:
        """JSON the state records besides the loop's and the checkpoint's `expect`; `restore` gets it back on resume."""
        return {}

    def restore(self, meta: dict[str, Any], progress: Progress) -> None:
        """Take back what `meta` wrote (called after the weights, optimiser moments and `progress` are loaded)."""


@dataclass(frozen=True)
class StateFile:
    """The train state as one safetensors file: `<module>.<key>` (with `trainable` only the parameters that train),
    `<optim>.<i>.<key>` (parameter i in param-group order), extra tensors, the torch RNG; the JSON meta (`expect`, the
    loop's, the task's) as one metadata string. `expect` must equal the saved meta to resume, but for `loose` keys of
    its dicts (docs/training.md)."""

    path: Path
    expect: Mapping[str, Any] = field(default_factory=dict)
    loose: tuple[str, ...] = ()
    trainable: bool = False

    def save(self, task: TrainTask, meta: dict[str, Any]) -> None:
        tensors = {f"{name}.{k}": v for name, m in task.modules.items() for k, v in self._state(m).items()}
        tensors |= {f"{name}.{i}.{k}": torch.as_tensor(v) for name, opt in task.optims.items()
                    for i, p in enumerate(opt.params()) for k, v in opt.optimizer.state.get(p, {}).items()}
        tensors.update({**task.extra_tensors(), RNG_KEY: torch.get_rng_state()})
        save_tensors(Path(self.path), {k: v.detach().clone() for k, v in tensors.items()},
                     {"meta": json.dumps({**self.expect, **meta})})

    def _state(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        if self.trainable:
            return {n: p for n, p in module.named_parameters() if p.requires_grad}
        return module.state_dict()

    def load(self, task: TrainTask) -> dict[str, Any] | None:
        """Restore the state into `task` (in place) and return its meta; None when there is no file."""
        path = Path(self.path)
        if not path.is_file():
            return None
        try:
            tensors, raw = load_tensors(path)
            meta = json.loads(raw.get("meta", "null"))
        except (OSError, ValueError, SafetensorError) as e:
            raise CheckpointError(f"corrupt training state {path}: {e}") from None
        if not isinstance(meta, dict) or RNG_KEY not in tensors:  # states before the shared loop: no resume
            raise StaleStateError(f"{path} was made by an older specgen; use a fresh --out")
        meta["torch_rng"] = tensors.pop(RNG_KEY)

        def strip(v: Any) -> Any:  # a dict value (config) without its loose keys
            return {k: x for k, x in v.items() if k not in self.loose} if isinstance(v, dict) else v

        want = json.loads(json.dumps(dict(self.expect)))
        stale = [k for k, v in want.items() if strip(meta.get(k)) != strip(v)]
        if stale:
            raise StaleStateError(f"{path} was written by a different {' and '.join(stale)}; use a fresh --out")
        for name, m in task.modules.items():
            state = {k[len(name) + 1:]: v for k, v in tensors.items() if k.startswith(name + ".")}
            missing = [k for k in self._state(m) if k not in state] if self.trainable else []
            if missing:
                raise CheckpointError(f"{path} does not fit this run (no {missing[0]}); use another --out")
            m.load_state_dict(state, strict=not self.trainable)
        for name, opt in task.optims.items():  # torch's load puts the moments on their parameters' devices
            state = {i: {k[len(f"{name}.{i}."):]: v for k, v in tensors.items() if k.startswith(f"{name}.{i}.")}
                     for i in range(len(opt.params()))}
            groups = opt.optimizer.state_dict()["param_groups"]
            opt.optimizer.load_state_dict({"state": {i: st for i, st in state.items() if st}, "param_groups": groups})
        for k, v in task.extra_tensors().items():
            v.copy_(tensors[k])
        return meta


class Loop:
    """Runs `TrainTask`s under one accelerate Accelerator (under `accelerate launch` / `torchrun`: one process each)."""

    def __init__(self, options: LoopOptions, log: Callable[[str], None] = lambda s: None) -> None:
        from accelerate import Accelerator  # deferred: start-up (recipe checks import every trainer)
        from accelerate.state import AcceleratorState  # deferred: as above

        dev = resolve_device(options.device)
        if dev.type == "cuda" and dev.index is not None:
            torch.cuda.set_device(dev)
        settings = {"cpu": dev.type == "cpu", "mixed_precision": MIXED_PRECISION[options.mixed_precision]}
        try:
            self.acc = Accelerator(**settings)
        except ValueError as e:  # one process training twice with other settings (tests, notebooks)
            if "already been initialized" not in str(e):
                raise
            AcceleratorState._reset_state()  # accelerate's settings only; the process group (PartialState) stays
            self.acc = Accelerator(**settings)
        self.options, self._log = options, log
        self.device: torch.device = self.acc.device
        self.rank: int = self.acc.process_index
        self.world: int = self.acc.num_processes
        self.is_main: bool = self.acc.is_main_process

    def log(self, msg: str) -> None:
        if self.is_main:
            self._log(msg)

    def _broadcast(self, modules: Mapping[str, torch.nn.Module]) -> None:
        """Rank 0's weights and buffers everywhere (DDP's start)."""
        if self.world == 1:
            return
        for m in modules.values():
            for t in list(m.parameters()) + list(m.buffers()):
                dist.broadcast(t.data, 0)

    def _average_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Mean of every parameter's gradient over the processes (a missing gradient counts as zeros)."""
        if self.world == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat /= self.world
        for p, g in zip(params, _unflatten_dense_tensors(flat, grads)):
            p.grad = g

    def wait(self) -> None:
        """All processes here (a no-op in one process)."""
        if self.world > 1:
            self.acc.wait_for_everyone()

    def run(self, task: TrainTask, checkpoint: StateFile | None = None) -> Progress:
        """Train `task` to `options.steps` (or `stop_after`, or the time budget), resuming from `checkpoint`."""
        from accelerate.utils import send_to_device  # deferred: start-up (as in Loop.__init__)

        o = self.options
        p = Progress()
        for m in task.modules.values():
            m.to(self.device)
        meta = checkpoint.load(task) if checkpoint is not None else None
        if meta is not None:
            p.resumed = True
            for k in SAVED:
                setattr(p, k, meta[k])
            torch.set_rng_state(meta.pop("torch_rng"))
            if self.acc.scaler is not None and SCALER in meta:  # fp16: the loss scale the run had reached
                self.acc.scaler.load_state_dict(meta.pop(SCALER))
            task.restore(meta, p)
        self._broadcast(task.modules)
        stop = min(o.stop_after or o.steps, o.steps)
        self.log(f"{'resumed at' if p.resumed else 'starting'} step {p.step}/{o.steps}; {self.world} process(es) "
                 f"on {self.device}")
        if o.eval_first and not p.resumed and self.is_main:
            ev = task.evaluate(p)
            if ev is not None:
                self.log(f"eval step {p.step} (untrained): {json.dumps(ev)}")
        scaler = self.acc.scaler
        saved_at = p.step
        t_last, c_last = time.perf_counter(), time.process_time()
        while p.step < stop:
            step = p.step
            for opt in task.optims.values():
                for group in opt.optimizer.param_groups:
                    group["lr"] = opt.lr(step)
                opt.optimizer.zero_grad(set_to_none=True)
            logs: dict[str, float] = {}
            stepped: set[str] = set()
            for micro in range(o.grad_accum):
                batch = task.batch(At(step, micro, o.grad_accum, self.rank, self.world))
                if self.device.type != "cpu":  # the batch's (nested) tensors on the device
                    batch = send_to_device(batch, self.device)
                with self.acc.autocast():
                    losses, parts = task.loss(batch)
                if isinstance(losses, torch.Tensor):
                    losses = {next(iter(task.optims)): losses}
                for name, loss in losses.items():
                    self.acc.backward(loss / o.grad_accum)
                    stepped.add(name)
                for k, v in parts.items():
                    logs[k] = logs.get(k, 0.0) + v / o.grad_accum
            for opt in (opt for name, opt in task.optims.items() if name in stepped):  # in the task's order
                params = opt.params()
                self._average_grads(params)
                if scaler is not None:
                    scaler.unscale_(opt.optimizer)
                if opt.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(params, opt.grad_clip)
                if scaler is not None:
                    scaler.step(opt.optimizer)
                else:
                    opt.optimizer.step()
            if scaler is not None:
                scaler.update()
            p.step += 1
            logs.update(task.after_step(p) or {})
            p.window.append(logs)
            p.recent.append(logs)
            now, cnow = time.perf_counter(), time.process_time()
            p.elapsed, p.cpu = p.elapsed + now - t_last, p.cpu + cnow - c_last
            t_last, c_last = now, cnow
            s = p.step
            if (o.log_every and s % o.log_every == 0) or s == o.steps:
                p.last_log = _means(p.window)
                lr = next(iter(task.optims.values())).lr(s - 1) if task.optims else 0.0
                self.log(f"step {s}/{o.steps} lr {lr:.2e} " + " ".join(f"{k} {v:.4f}" for k, v in p.last_log.items())
                         + f" elapsed {p.elapsed / 60:.1f}m cpu {p.cpu / 60:.1f}m")
                p.window = []
            evaluated = bool(o.eval_every and s % o.eval_every == 0) or s == o.steps
            ev = task.evaluate(p) if evaluated and self.is_main else None
            if ev is not None:
                p.history.append(ev)
                self.log(f"eval step {s}: {json.dumps(ev)}")
            if checkpoint is not None and ((o.ckpt_every and s % o.ckpt_every == 0) or (evaluated and o.ckpt_at_eval)
                                           or s == o.steps):
                self._save(task, checkpoint, p)
                saved_at = s
                t_last, c_last = time.perf_counter(), time.process_time()
            if o.max_minutes > 0 and s < stop and BUDGETS[o.budget](p) > o.max_minutes:  # every session steps once
                p.stopped_early = True
                self.log(f"max_minutes={o.max_minutes} reached at step {s}: checkpointed; run again to continue")
                break
        if checkpoint is not None and saved_at != p.step:
            self._save(task, checkpoint, p)
        self.wait()
        return p

    def _save(self, task: TrainTask, checkpoint: StateFile, p: Progress) -> None:
        self.wait()
        if self.is_main:
            scaler = {SCALER: self.acc.scaler.state_dict()} if self.acc.scaler is not None else {}
            checkpoint.save(task, {**{k: getattr(p, k) for k in SAVED}, **scaler, **task.meta()})
        self.wait()


def _means(window: list[dict[str, float]]) -> dict[str, float]:
    """Per key, the mean over the steps that logged it (keys in first-seen order)."""
    vals = {k: [w[k] for w in window if k in w] for k in dict.fromkeys(k for w in window for k in w)}
    return {k: sum(v) / len(v) for k, v in vals.items()}
