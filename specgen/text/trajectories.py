"""Jacobi trajectory collection (CLLM / pcLLM step 1): greedy Jacobi over blocks of n tokens, every state kept."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from specgen import checkpoints, registry
from specgen.data.prompts import read_prompts
from specgen.data.stdlib_prompts import assert_no_humaneval_overlap, stdlib_fingerprint, stdlib_prompts
from specgen.decoding.sampling import SamplingParams
from specgen.errors import IncompatibleError, RuntimeFailure, UsageError
from specgen.limits import check_prompt_fits, context_of
from specgen.methods import run_batch
from specgen.models.tokenizer import tokenizer_hash
from specgen.paths import atomic_write, atomic_write_text, written_elsewhere
from specgen.precision import resolve, split_name
from specgen.shard import Shard, launcher_shard
from specgen.text.jacobi_blocks import JacobiBlocks
from specgen.text.target import open_text_model

META = "trajectories.json"
SHARDS = "shards"
MERGED = "merged"
IDS = pa.list_(pa.int32())
SCHEMA = pa.schema([("data_id", pa.int64()), ("block", pa.int32()), ("prompt_ids", IDS), ("trajectory", pa.list_(IDS)),
                    ("fixed_point", IDS), ("iterations", pa.int32())])


@dataclass
class CollectConfig:
    """Options of `specgen collect-trajectories` (recipe keys)."""

    model: str = "smollm2-135m"
    prompts: str = "stdlib"  # "stdlib" (built-in set) or a text / JSONL file / datasets folder / parquet
    prompt_field: str | None = None
    limit: int = 0  # 0 = all prompts of the source
    offset: int = 0
    block_size: int = 16
    max_new_tokens: int = 128
    chat: bool = True
    seed: int = 0
    device: str = "cpu"  # cpu | cuda | cuda:N | auto
    dtype: str = "float32"  # float32 | bfloat16 | float16: the target's weights, activations and KV cache
    threads: int = 0
    shard_every: int = 8  # prompts per shard file (the unit of resumption)
    batch_size: int = 1  # prompts decoded together (within a shard's prompts; changes no record)


def collect_dtype(model: str, dtype: str | None) -> str:
    """The dtype to collect at: `dtype` where one was given, else the model name's (`+bf16`), else float32. A quantized
    target (`+int8` / `+int4`, or a stored quantized copy named directly) is refused: distill trains a float model on
    that model's own trajectories (and refuses a quantized one)."""
    base, _, quantize = split_name(model)
    copy = (registry.installed_meta(base) or {}).get("quantized") or {}
    if quantize or copy:
        raise UsageError(f"--model {model} is quantized ({quantize or copy.get('mode')}): distill trains a float model "
                         f"on its own trajectories; collect them from {copy.get('base', base)}")
    return resolve(model, dtype, None)[1]


def decoded_tokens(max_new_tokens: int, block_size: int) -> int:
    """What collecting decodes for a budget: whole blocks up to it, then the next block's root."""
    return -(-max_new_tokens // block_size) * block_size + 1


def check_blocks_fit(longest: int, cfg: CollectConfig, entry) -> None:
    """Refuse, before the weights load, a prompt whose whole blocks run past the context although the budget fits
    (check_prompt_fits): the blocks round the budget up, so a text that ran to it would fail mid-run."""
    context, need = context_of(entry.meta), decoded_tokens(cfg.max_new_tokens, cfg.block_size)
    if context is not None and longest and longest + need >= context:
        fits = max((context - 1 - longest - 1) // cfg.block_size * cfg.block_size, 0)
        raise UsageError(f"a prompt of {longest} tokens + {need} decoded tokens (--max-new-tokens {cfg.max_new_tokens}"
                         f" in whole blocks of {cfg.block_size}, then the next root) does not fit {entry.ref}'s context"
                         f" of {context} tokens; " + (f"lower --max-new-tokens to at most {fits}" if fits else
                                                      "shorten the prompt"))


def jacobi_trajectories_batch(target, prompts: list[list[int]], block_size: int, max_new_tokens: int,
                              stop_ids: tuple[int, ...], seeds: list[int], batch_size: int = 1) -> list[list[dict]]:
    """Block Jacobi decoding (`text/jacobi_blocks.py`) of every prompt, `batch_size` at a time: whole blocks until
    `max_new_tokens` or a block with a stop token."""
    drafters = [JacobiBlocks(block_size, seed, stop_ids) for seed in seeds]
    run_batch(target, lambda i: drafters[i], prompts, decoded_tokens(max_new_tokens, block_size), SamplingParams(),
              (), batch_size=batch_size, max_draft=block_size)
    return [d.blocks for d in drafters]


def read_meta(folder: Path) -> dict:
    path = Path(folder) / META
    if not path.is_file():
        raise UsageError(f"{folder} holds no trajectories ({META} missing); collect them with "
                         f"`specgen collect-trajectories --out {folder}`")
    try:
        meta = json.loads(path.read_text())
    except ValueError as e:  # not JSON, or not UTF-8 text
        raise RuntimeFailure(f"unreadable {path}: {e}") from None
    if not isinstance(meta, dict):
        raise RuntimeFailure(f"unreadable {path}: not a JSON object")
    return meta


def stdin_source(source: object) -> object:
    """A prompt source as compared, stdin as "-": folders collected before stdin was recorded so held "<cwd>/-" (a
    file named `-` compares alike; the prompts' fingerprint still tells them apart)."""
    return "-" if isinstance(source, str) and source.endswith("/-") else source


def check_meta(old: dict, new: dict) -> None:
    """Refuse to mix trajectories of different targets, tokenizers, block sizes or prompt sources."""
    old, new = ({**m, "prompt_source": stdin_source(m.get("prompt_source"))} for m in (old, new))
    for key in ("target", "tokenizer_hash", "block_size", "max_new_tokens", "prompt_source", "prompt_fingerprint",
                "chat"):
        if old.get(key) != new.get(key):
            raise IncompatibleError(f"this folder was collected with {key}={old.get(key)!r}, not {new.get(key)!r}; "
                                    "use another --out")
    if not registry.same_weights(old.get("target_digest"), new.get("target_digest")):
        raise IncompatibleError(f"this folder was collected from other weights of {old['target']} (saved again "
                                "since); use another --out")


def shard_files(folder: Path) -> list[Path]:
    return sorted((Path(folder) / SHARDS).glob("rank*-*.parquet"))


def done_ids(folder: Path) -> set[int]:
    """Prompts whose records are already in a shard: shards are written atomically and hold whole prompts, so an
    interrupted run never duplicates records (docs/training.md)."""
    ids: set[int] = set()
    for f in shard_files(folder):
        try:
            ids.update(pq.read_table(f, columns=["data_id"]).column("data_id").to_pylist())
        except Exception as e:
            raise RuntimeFailure(f"corrupt shard {f}: {e}") from None
    return ids


def load_records(folder: Path) -> list[dict]:
    """All block records of a folder (the merged file if present and every shard), de-duplicated and sorted."""
    folder = Path(folder)
    merged = folder / MERGED / "train.parquet"
    files = ([merged] if merged.is_file() else []) + shard_files(folder)  # shards collected since a merge: not in it
    if not files:
        raise UsageError(f"{folder} holds no trajectory shards (its collection stopped before the first one); "
                         f"rerun `specgen collect-trajectories --out {folder}` with its settings to go on")
    rows: dict[tuple[int, int], dict] = {}
    for f in files:
        try:
            for r in pq.read_table(f).to_pylist():
                rows.setdefault((r["data_id"], r["block"]), r)
        except Exception as e:
            raise RuntimeFailure(f"corrupt trajectory file {f}: {e}") from None
    return [rows[k] for k in sorted(rows)]


def merge_shards(folder: Path) -> Path:
    """Write merged/train.parquet from every rank's shards: de-duplicated, sorted; running it twice changes nothing."""
    folder = Path(folder)
    if not shard_files(folder):
        raise UsageError(f"{folder} holds no trajectory shards to merge")
    merged = folder / MERGED / "train.parquet"
    merged.unlink(missing_ok=True)  # rebuilt from the shards (the source of truth)
    rows = load_records(folder)
    return atomic_write(merged, lambda tmp: pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), tmp))


def load_prompt_texts(cfg: CollectConfig) -> tuple[list[str], str, str]:
    """(prompts, source name, fingerprint) with the HumanEval guard applied."""
    if cfg.prompts == "stdlib":
        texts, source, fp = stdlib_prompts(), "stdlib", stdlib_fingerprint()
    else:
        texts = read_prompts(cfg.prompts, field=cfg.prompt_field)
        # stdin is "-" as --prompts names it (a path resolved from the working folder would differ at a resume)
        source = "-" if cfg.prompts == "-" else str(Path(cfg.prompts).expanduser().resolve())
        fp = hashlib.sha256("\n\0".join(texts).encode("utf-8")).hexdigest()[:12]
    texts = texts[cfg.offset:][: cfg.limit or None]  # limit 0: all
    if not texts:
        raise UsageError(f"no prompts left in {'<stdin>' if source == '-' else source} after offset {cfg.offset}")
    assert_no_humaneval_overlap(texts)  # HumanEval is never used for training
    return texts, source, fp


@dataclass
class CollectSummary:
    folder: str
    rank: int
    world_size: int
    prompts: int  # prompts of this rank collected in this run
    skipped: int  # already present (resumed)
    blocks: int
    mean_iterations_per_block: float
    seconds: float


def collect(cfg: CollectConfig, out: Path, on_prompt: Callable[[int, int, float], None] | None = None,
            progress=None) -> CollectSummary:
    """Collect trajectories for this rank's share of the prompts into `out` (resumable)."""
    if cfg.block_size < 2:
        raise UsageError(f"block_size must be >= 2, got {cfg.block_size}")
    shard = launcher_shard() or Shard()  # this rank's share under torchrun / accelerate
    if not 0 <= shard.index < shard.count:
        raise UsageError(f"bad RANK={shard.index} / WORLD_SIZE={shard.count}")
    rank = shard.index
    texts, source, fingerprint = load_prompt_texts(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    mine = [i for i in range(len(texts)) if (cfg.offset + i) % shard.count == shard.index]
    with checkpoints.input_named("model", cfg.model, "text target"):
        src = open_text_model(cfg.model, cfg.device, progress, dtype=cfg.dtype)
    ids = {i: src.tokenizer.encode(texts[i], chat=cfg.chat) for i in mine}
    for i, prompt_ids in ids.items():  # as generate refuses them: before the weights load and any shard is written
        try:
            check_prompt_fits(len(prompt_ids), cfg.max_new_tokens, src.base)
        except UsageError as e:  # which of many: its data_id
            raise UsageError(f"prompt {cfg.offset + i}: {e}") from None
    check_blocks_fit(max(map(len, ids.values()), default=0), cfg, src.base)
    tm = src.load(progress)
    meta = {"target": tm.entry.ref, "target_digest": registry.weights_digest(tm.entry, read=False),
            "tokenizer_hash": tokenizer_hash(tm.tokenizer), "block_size": cfg.block_size,
            "max_new_tokens": cfg.max_new_tokens, "prompt_source": source, "prompt_fingerprint": fingerprint,
            "chat": cfg.chat, "vocab_size": tm.target.vocab_size, "offset": cfg.offset, "seed": cfg.seed,
            "config": asdict(cfg)}
    out = Path(out)
    if (out / META).is_file():
        check_meta(read_meta(out), meta)
    elif out.exists() and any(not written_elsewhere(p, META) for p in out.iterdir()):  # (ranks all write META)
        raise UsageError(f"{out} exists and is not a trajectory folder; use an empty or new --out")
    else:
        atomic_write_text(out / META, json.dumps(meta, indent=2, sort_keys=True))
    have = done_ids(out)
    todo = [i for i in mine if cfg.offset + i not in have]
    t0, blocks, iters, pending = time.perf_counter(), 0, 0, []
    chunk = len(list((out / SHARDS).glob(f"rank{rank:02d}-*.parquet"))) if (out / SHARDS).is_dir() else 0

    for start in range(0, len(todo), cfg.shard_every):  # one shard's prompts at a time, decoded in batches
        chunk_ids = todo[start : start + cfg.shard_every]
        recs = jacobi_trajectories_batch(tm.target, [ids[i] for i in chunk_ids], cfg.block_size, cfg.max_new_tokens,
                                         tm.tokenizer.stop_ids, [cfg.seed * 1_000_003 + cfg.offset + i
                                                                 for i in chunk_ids], cfg.batch_size)
        for i, prompt_recs in zip(chunk_ids, recs):
            pending += [{"data_id": cfg.offset + i, "block": b, "prompt_ids": ids[i], **r}
                        for b, r in enumerate(prompt_recs)]
            blocks, iters = blocks + len(prompt_recs), iters + sum(r["iterations"] for r in prompt_recs)
            if on_prompt:
                on_prompt(blocks, iters, time.perf_counter() - t0)
        if pending:
            table = pa.Table.from_pylist(pending, schema=SCHEMA)
            atomic_write(out / SHARDS / f"rank{rank:02d}-{chunk:05d}.parquet", lambda tmp: pq.write_table(table, tmp))
            chunk, pending = chunk + 1, []
    return CollectSummary(str(out), rank, shard.count, len(todo), len(mine) - len(todo), blocks,
                          iters / blocks if blocks else 0.0, time.perf_counter() - t0)
