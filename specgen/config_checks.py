"""Range checks of recipe values by field name (one table for every config), run by `load_config` before any work."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from specgen import checkpoints, devices, registry
from specgen.devices import DTYPES
from specgen.errors import UsageError
from specgen.limits import check_budget, usable_cpus

SIGNED = {"seed", "label_seed", "data_seed"}  # any integer
AT_LEAST_ONE = {"batch_size", "grad_accum", "block_size", "label_batch", "gen_batch", "crop_size", "num_crops",
                "eval_crops", "lora_rank", "num_sequences", "eval_sequences", "inner_dim", "channels", "blocks",
                "kernel", "disc_channels", "scale", "log_every", "eval_every", "ckpt_every", "shard_every", "window",
                "steps", "num_threads", "topk_accept", "tree_k", "depths", "samples_per_class",
                "eval_samples_per_class", "stage1_epochs", "stage2_epochs", "batch_sizes", "res_layers"}
POSITIVE = {"lr", "disc_lr", "stage1_lr", "stage2_lr", "lora_alpha", "cfg_scale"}  # > 0
OPEN_UNIT = {"top_p", "label_top_p"}  # (0, 1]
UNIT = {"delta", "deltas", "min_lr_ratio", "lecam_decay"}  # [0, 1]
HALF_OPEN_UNIT = {"beta1", "beta2"}  # [0, 1)
NONEMPTY_LISTS = {"temperatures", "methods", "rows", "batch_sizes"}
DISTINCT_LISTS = {"batch_sizes"}  # each value is a row of its own: a repeat decoded every item again, two equal rows
# mesh configs: max_new_tokens 0 = the model's whole context; their budget is checked against the decoder's context
# less the heads' look-ahead by `mesh.generate.check_budget` (it knows the heads), not against the model's context here
MESH_CONFIGS = {"MeshGenConfig", "MeshBenchConfig"}
NAMES = {"name", "vq_name"}  # registry names this command creates ("" = do not register)
TEMPERATURES = {"temperature", "label_temperature", "temperatures"}
MIN_TEMPERATURE = 1e-3  # 0 is greedy; a positive temperature below this overflows logits / T into inf and NaN
POSITIVE_BY_CLASS = {"DistillConfig": {"temperature"}}  # a KL temperature divides: 0 is not greedy there
# counts whose 0 means nothing to do in these configs (elsewhere 0 means "all"), and max_new_tokens outside
# MESH_CONFIGS: checked before the generic >= 0, so -1 and 0 get the same message
AT_LEAST_ONE_BY_CLASS = {"TextBenchConfig": ("limit",), "MeshBenchConfig": ("limit",), "ImageBenchConfig": ("num",),
                         "MeshGenConfig": ("num",)}
MAX_INT = 2 ** 62  # beyond this torch's int64 arithmetic (seed + i, sizes) overflows
RANGES = [(OPEN_UNIT, lambda v: 0 < v <= 1, "in (0, 1]"), (UNIT, lambda v: 0 <= v <= 1, "in [0, 1]"),
          (HALF_OPEN_UNIT, lambda v: 0 <= v < 1, "in [0, 1)"), (POSITIVE, lambda v: v > 0, "> 0"),
          (AT_LEAST_ONE, lambda v: v >= 1, ">= 1")]  # (fields, the values they take, those values in words)
AT_MOST = {"num": 100_000,  # images/meshes per command
           "cfg_scale": 50}  # guidance: with POSITIVE, (0, 50] as --cfg-scale says, refused before a model loads
# torch threads: at most the CPUs this process can use; more only queue on them (and a benchmark would time that)
THREADS = {"threads", "num_threads"}
# keys naming one of a few values, those values in words: "" (an unset shell variable in quotes) is refused naming
# them, never read as the default, which is the key left out (their own checks name any other wrong value: devices.py,
# specgen/precision.py's QUANTIZE, models/graphs.py's MODES)
CHOICES = {"dtype": ", ".join(DTYPES), "quantize": "int8, int4", "device": "cpu, cuda, cuda:N, auto",
           "graphs": "auto, on, off"}
# text matched against generated text, where a line break or tab is what it often stops at: control characters are
# allowed; the empty string, in every text (each completion would end at its first token), is refused
MATCHED_TEXT = {"stop"}
# configs whose device may be "auto" (cuda when present, else cpu): their commands resolve it (specgen/devices.py)
# before any tensor is made; a config not named here takes cpu, cuda, cuda:N or mps only
AUTO_DEVICE = {"DistillConfig", "TextGenConfig", "ImageGenConfig", "MeshGenConfig", "CollectConfig", "TextBenchConfig",
               "ImageBenchConfig", "MeshBenchConfig"}


class TooManyThreads(UsageError):
    """More torch threads than the CPUs this process can use: refused where a command runs; a dry run, which checks
    a recipe for another node, loads it at this machine's count."""

    def __init__(self, key: str, threads: int, cpus: int) -> None:
        super().__init__(f"{key} {threads} is more than the {cpus} CPUs this process can use; give at most {cpus}")
        self.key, self.threads, self.cpus = key, threads, cpus


def check_config(cfg: Any) -> None:
    """Refuse the first out-of-range value of a config dataclass with a one-line UsageError naming its key."""
    name = type(cfg).__name__
    budget = () if name in MESH_CONFIGS else ("max_new_tokens",)
    for key in AT_LEAST_ONE_BY_CLASS.get(name, ()) + budget:
        if is_number(getattr(cfg, key, None)) and getattr(cfg, key) < 1:
            raise UsageError(f"{key} must be >= 1, got {getattr(cfg, key)}")
    for f in dataclasses.fields(cfg):
        check_value(f.name, getattr(cfg, f.name))
    for key in POSITIVE_BY_CLASS.get(name, ()):
        if not getattr(cfg, key) > 0:
            raise UsageError(f"{key} must be > 0, got {getattr(cfg, key)}")
    if isinstance(getattr(cfg, "device", None), str):
        devices.check_device(cfg.device, allow_auto=name in AUTO_DEVICE)
    budget = getattr(cfg, "max_new_tokens", None)
    model = getattr(cfg, "model", None) or getattr(cfg, "target", None)
    # against the named model's context when it is installed or a built-in declares it (nothing loads or is made)
    if is_number(budget) and budget > 0 and name not in MESH_CONFIGS:
        meta = checkpoints.declared_meta(model) if isinstance(model, str) and model else {}
        check_budget(budget, meta, f"{meta.get('kind', 'target')}/{meta.get('name', model)}")


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_value(key: str, value: Any) -> None:
    """One field: numbers by the tables above, strings free of control characters, a list's values as the field's."""
    if isinstance(value, str) and key in MATCHED_TEXT:
        if not value:
            raise UsageError(f"an empty {key} string is in every text (each completion would end at once); give a "
                             "non-empty one, or none")
    elif isinstance(value, str):
        check_text(key, value)
        if key in CHOICES and not value:
            raise UsageError(f"an empty {key} (an unset shell variable?); use {CHOICES[key]}, or leave it out for "
                             "the default")
        if key in NAMES and value:
            registry.check_name(value, key)
    elif is_number(value):
        check_number(key, value)
    elif isinstance(value, (list, tuple)):
        if key in NONEMPTY_LISTS and not value:
            raise UsageError(f"{key} must not be empty")
        if key in DISTINCT_LISTS and (twice := next((x for x in value if value.count(x) > 1), None)) is not None:
            raise UsageError(f"{key} gives {twice} twice; each value is a row of its own: give it once")
        for item in value:
            check_value(key, item)
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str):
                check_text(key, k)
            if isinstance(v, str):
                check_text(f"{key}.{k}", v)


def check_text(key: str, value: str) -> None:
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise UsageError(f"{key} must not contain control characters, got {value!r}")


def check_number(key: str, v: float) -> None:
    """A number of field `key`."""
    if not math.isfinite(v):
        raise UsageError(f"{key} must be a finite number, got {v}")
    if isinstance(v, int) and abs(v) >= MAX_INT:
        raise UsageError(f"{key} must be less than 2**62 in size, got {v}")
    if key in SIGNED:
        return
    if key in TEMPERATURES and 0 < v < MIN_TEMPERATURE:
        raise UsageError(f"{key} {v} is greedy in effect and overflows the sampler: use 0 (greedy) or "
                         f">= {MIN_TEMPERATURE}")
    for keys, ok, rule in RANGES:
        if key in keys and not ok(v):
            raise UsageError(f"{key} must be {rule}, got {v}")
    if key in AT_MOST and v > AT_MOST[key]:
        raise UsageError(f"{key} must be at most {AT_MOST[key]}, got {v}")
    if key in THREADS and v > (cpus := usable_cpus()):
        raise TooManyThreads(key, int(v), cpus)
    if v < 0:
        raise UsageError(f"{key} must be >= 0, got {v}")
