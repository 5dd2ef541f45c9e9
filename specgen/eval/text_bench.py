"""Text benchmark (suites humaneval, text): every row on the same prompts in one process, interleaved per prompt."""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from dataclasses import asdict, dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

import torch

from specgen import checkpoints, registry
from specgen.builtins import builtin_named
from specgen.data.humaneval import Problem, build_user_message, load_problems
from specgen.data.prompts import Prompt, PromptSourceError, encode, read_prompt_records
from specgen.decoding.cost import Tokens, cost_of
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.stops import Stops, text_stops
from specgen.devices import DTYPES, now, on_gpu
from specgen.errors import UnknownNameError, UsageError
from specgen.eval import json_shape
from specgen.eval.graph_use import GraphUse
from specgen.eval.hf_rows import HfAssisted, HfCompiled, HfGenerate, HfLookup
from specgen.eval.humaneval import check_completions
from specgen.eval.llamacpp_row import LlamaCppLookup, LlamaCppRow
from specgen.eval.peers import Peer, PeerSetup
from specgen.eval.roofline import copy_bandwidth, streamed_bytes
from specgen.eval.run_dir import Grid
from specgen.eval.sweeps import (Entries, check_own_entry, entries, methods_on, options_table, sweeps_of, sweeps_on,
                                 with_sweep_rows)
from specgen.eval.text_rows import Run, text_rows
from specgen.generate.text import draft_budget
from specgen.limits import check_prompt_fits, context_of
from specgen.methods import METHODS, MethodSpec, get_method, model_for, run_batch
from specgen.methods.options import BUDGET_DEFAULT
from specgen.models.tokenizer import tokenizer_hash
from specgen.precision import split_name
from specgen.shard import Shard
from specgen.text.target import TextModel, load_original, load_text_model, open_text_model

# rows not decoded by specgen's loop: row name (also `NAME:tag` variants) -> its peer (eval/peers.py)
PEERS: dict[str, type[Peer]] = {"hf": HfGenerate, "hf-lookup": HfLookup, "hf-assisted": HfAssisted,
                                "hf-compiled": HfCompiled, "llamacpp": LlamaCppRow, "llamacpp-lookup": LlamaCppLookup}
HUMANEVAL_LIMIT = 20  # the humaneval suite's default number of problems
MIXED_PROMPTS = Path(__file__).resolve().parents[1] / "data" / "mixed_prompts.jsonl"  # the text suite's default


@dataclass
class TextBenchConfig:
    """Options of `specgen benchmark --suite humaneval|text` (recipe keys)."""

    suite: str = "humaneval"
    prompts: str | None = None  # suite text: a prompt file, `-` or a local dataset (default: MIXED_PROMPTS)
    prompt_field: str | None = None  # the record field holding the prompt (default: prompt/text/.../turns)
    category_field: str | None = None  # the record field holding its category (default: `category`)
    methods: list[str] = field(default_factory=lambda: ["ar", "jacobi", "ngram", "hf"])
    model: str = "smollm2-135m"
    limit: int | None = None  # prompts from `offset`; None: HUMANEVAL_LIMIT of humaneval, every prompt of a set
    offset: int = 0
    max_new_tokens: int = 128
    seed: int = 0
    device: str = "cpu"
    graphs: str = "auto"  # auto | on | off: CUDA-graph captured decode steps (auto: on for CUDA; models/graphs.py)
    threads: int = 0  # 0 = torch default
    warmup: bool = True  # one discarded run of every method before timing
    execute: bool = True  # run pass@1 (subprocesses)
    options: dict = field(default_factory=dict)  # method (or variant row method@tag) -> {option: value}
    sweep: dict = field(default_factory=dict)  # row -> {option: [values]}: one row per value (specgen/eval/sweeps.py)
    method_options: dict = field(default_factory=dict)  # the older name of `options`, read as well
    targets: dict = field(default_factory=dict)  # method -> model it decodes (default: its MethodSpec.target)
    nll: bool = True  # the original model's mean per-token NLL of every row's outputs
    dtype: str | None = None  # precision of `model` for every row: float32 | bfloat16 (per row: targets NAME+bf16)
    quantize: str | None = None  # int8 | int4 weights for every row (per row: targets NAME+int8); quality vs float32
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # 1: interleaved per prompt; B > 1: B slots
    stop: list[str] = field(default_factory=list)  # stop strings: every row, peers too, ends as `generate --stop`
    chat: bool = True  # text prompts through the chat template (false: raw, as `generate --no-chat`), every row


def stops_said(cfg: TextBenchConfig) -> str:
    """The stop strings every row ends at, as written (a dry run's row, the table's title): "" for none."""
    return ", ".join(map(repr, cfg.stop))


def prompts_said(cfg: TextBenchConfig) -> str:
    """How the prompts are fed, in words: "" through the chat template (the default)."""
    return "" if cfg.chat else "raw (no chat template)"


def row_method(row: str) -> str:
    """The method a row runs: `pcllm@n8`, `pcllm:n8` -> `pcllm` (variant rows), `ar@NAME` -> `ar`."""
    return row.split("@")[0].split(":")[0]


def is_peer(row: str) -> bool:
    """Is `row` decoded by another library (a PEERS row or a variant of one)?"""
    return row_method(row) in PEERS


def row_model(row: str) -> str | None:
    """The model an `method@NAME` row names (`ar@` rows always; others when NAME, `NAME+int8` allowed, is an
    installed, built-in or folder model: nothing is materialised), or None: a variant row or a plain method."""
    method, at, tag = row.partition("@")
    if method == "ar" or not at:
        return tag if at else None
    base = tag.split("+")[0]
    return tag if registry.installed_meta(base) is not None or builtin_named(base) is not None else None


def row_options(row: str, cfg: TextBenchConfig) -> dict:
    """A row's method options: the method's own, updated by its variant's (`ngram:cache` for `ngram:cache@NAME`),
    then by the row's own entry."""
    base, table = row_method(row), options_table(cfg)
    return {**table.get(base, {}), **table.get(row.split("@")[0], {}), **table.get(row, {})}


def entries_of(cfg: TextBenchConfig) -> Entries:
    """What the `options` entries of cfg may name: its rows and its sweeps', a text method or a peer."""
    return entries(cfg.methods, sweeps_of(cfg.sweep), [*methods_on("text"), *PEERS], "a method")


def picked(cfg: TextBenchConfig) -> TextBenchConfig:
    """cfg as `--methods` picks its rows: only the sweeps of methods among them (a recipe's sweep of another method
    is left out, as its rows are)."""
    methods = {row_method(m) for m in cfg.methods}
    return replace(cfg, sweep=sweeps_on(cfg.sweep, lambda row: row_method(row) in methods))


def with_sweeps(cfg: TextBenchConfig) -> TextBenchConfig:
    """cfg with every `sweep` row added to `methods` (its options in `options`, its base row's `targets` copied)."""
    full, swept = with_sweep_rows(cfg, "text", row_method, sweepable=lambda row: not is_peer(row))
    return replace(full, targets={**{r.name: cfg.targets[r.base] for r in swept if r.base in cfg.targets},
                                  **cfg.targets})


@dataclass(frozen=True)
class Row:
    """A row decoded by specgen's loop: its method looked up and its options parsed once (`check_methods`)."""

    spec: MethodSpec
    options: Any  # spec.options_type
    seed: int | None = None  # the row's own drafter seed (`options.ROW.seed`), else the run's


def specgen_batch(model: TextModel, row: Row, prompts: list[list[int]], batch: int, cfg: TextBenchConfig,
                  stops: Stops) -> tuple[list[Run], float]:
    """`row` over `prompts` through `batch` slots of the batched loop, each ending at `stops`; (runs in prompt order,
    wall seconds)."""
    seed = cfg.seed if row.seed is None else row.seed  # the row's own drafter seed, else the run's
    budget = draft_budget(model, asdict(row.options).get("budget", BUDGET_DEFAULT))
    device = next(model.module.parameters()).device
    t0 = now(device)
    res = run_batch(model.target, lambda i: row.spec.drafter(row.options, seed), prompts, cfg.max_new_tokens,
                    SamplingParams(), stops, batch_size=batch, budget=budget)
    seconds = now(device) - t0
    latency = (lambda r: r.stats.extras.get("latency_s", seconds)) if batch > 1 else (lambda r: seconds)
    prefill = res.stats.times.get("prefill", 0.0) / len(prompts)
    return [Run(r.tokens, latency(r), r.stats.target_forwards, r.stats.steps, sum(r.stats.accepted),
                r.stats.times.get("propose", 0.0), r.stats.target_tokens, prefill) for r in res.results], seconds


def decoded_model(method: str, cfg: TextBenchConfig) -> str:
    """The model a row decodes: the one it names (`ar@NAME`), else `targets.<method>`, else the method's distilled
    target, else cfg.model."""
    if is_peer(method):
        return cfg.model
    base = row_method(method)
    return (row_model(method) or cfg.targets.get(method) or cfg.targets.get(base)
            or model_for(get_method(base), cfg.model, TextBenchConfig.model))


@torch.inference_mode()
def base_nll(model: TextModel, prompt: list[int], tokens: list[int]) -> tuple[float, int]:
    """(sum of -log p, count) of `tokens` after `prompt` under `model` (one teacher-forced forward)."""
    if not tokens:
        return 0.0, 0
    device = next(model.module.parameters()).device
    ids = torch.tensor([prompt + tokens], device=device)
    logits, _ = model.module(ids, torch.arange(ids.shape[1], device=device)[None])
    logp = torch.log_softmax(logits[0, len(prompt) - 1 : -1].float(), -1)
    return float(-logp.gather(-1, ids[0, len(prompt):, None]).sum()), len(tokens)


def check_methods(cfg: TextBenchConfig) -> dict[str, Row]:
    """Refuse a bad row of `cfg` (`with_sweeps` expanded) before any model loads; its specgen rows, methods parsed."""
    rows = {}
    for m in cfg.methods:
        if is_peer(m):
            check_own_entry(m, row_method(m), {"options": cfg.options})
            known = PEERS[row_method(m)].OPTIONS
            unknown = sorted(set(row_options(m, cfg)) - set(known))
            if unknown:
                raise UsageError(f"{m} row: unknown option(s) {', '.join(unknown)}; options: "
                                 f"{', '.join(known) or 'none'}")
            continue
        spec = get_method(row_method(m), [*methods_on("text"), *PEERS])  # a text suite's rows: methods, peers
        if not spec.runs_on("text"):
            raise UsageError(f"method {m} is for {spec.modality}; the {cfg.suite} suite is text")
        options = row_options(m, cfg)
        rows[m] = Row(spec, spec.parse_options(options, gpu=on_gpu(cfg.device)), options.get("seed"))
        if row_model(m) is None:  # `METHOD@MODEL` decodes MODEL
            model = f"{m.partition('@')[2]!r} is not a registry model, and " if "@" in m else ""
            check_own_entry(m, row_method(m), {"options": cfg.options, "targets": cfg.targets}, model)
    return rows


@dataclass(frozen=True)
class Item:
    """One prompt of the run, with its HumanEval problem when its completions are executed (pass@1)."""

    prompt: Prompt
    problem: Problem | None = None


def humaneval_items(cfg: TextBenchConfig) -> list[Item]:
    if cfg.prompts is not None:
        raise UsageError("the humaneval suite reads its own prompts; give --prompts with --suite text")
    return [Item(Prompt(build_user_message(q), "humaneval"), q)
            for q in load_problems(HUMANEVAL_LIMIT if cfg.limit is None else cfg.limit, cfg.offset)]


@functools.cache
def records_of(source: str, field: str | None, category_field: str | None) -> tuple[Prompt, ...]:
    """A prompt source read once per process: stdin (`-`) can be read only once, and a run reads its plan often."""
    return tuple(read_prompt_records(source, field, category_field))


def file_items(cfg: TextBenchConfig) -> list[Item]:
    records = records_of(cfg.prompts or str(MIXED_PROMPTS), cfg.prompt_field, cfg.category_field)
    return [Item(p) for p in records[cfg.offset :][: cfg.limit]]


SOURCES: dict[str, Callable[[TextBenchConfig], list[Item]]] = {"humaneval": humaneval_items, "text": file_items}


def check_prompts_fit(p: Plan, progress=None) -> None:
    """Refuse a prompt that leaves no room for max_new_tokens in the model's context, from its registry entry's
    config and tokenizer files: before any weights load."""
    cfg = p.cfg
    source = open_text_model(cfg.model, "cpu", progress)  # the entry, the base it reads its tokenizer from
    entry = source.entry if context_of(source.entry.meta) else source.base
    for i, item in enumerate(p.items):
        try:
            check_prompt_fits(len(encode(source.tokenizer, item.prompt, cfg.chat)), cfg.max_new_tokens, entry)
        except UsageError as e:
            raise UsageError(f"prompt {cfg.offset + i}: {e}") from None


def check_row_models(p: Plan, progress=None) -> None:
    """Refuse a row whose model (a distilled target, `targets.ROW`) is no registry entry, naming the row and the way
    on, before any weights load (a built-in is materialised here, as the run would a moment later)."""
    for name in dict.fromkeys(p.meta[m]["model"] for m in p.order if p.meta[m]["model"] != p.cfg.model):
        try:
            checkpoints.find(split_name(name)[0], progress)
        except UnknownNameError as e:
            rows = ", ".join(m for m in p.cfg.methods if p.meta[m]["model"] == name) or f"ar@{name}"
            raise UnregisteredRowModel(name, rows, str(e)) from None


class UnregisteredRowModel(UsageError):
    """A row's model that is no registry entry, naming the rows and the way on; `advised` says how a recipe's header
    makes it (the run knows its recipe, this module does not)."""

    def __init__(self, name: str, rows: str, why: str,
                 advice: str = "a recipe's header says how; --dry-run checks every entry") -> None:
        self.name, self.rows, self.why = name, rows, why
        super().__init__(f"{name}, the model of row {rows}, is not in the registry: register it first ({advice}) or "
                         f"give the row another with targets.ROW=NAME ({why})")

    def advised(self, advice: str) -> UnregisteredRowModel:
        return UnregisteredRowModel(self.name, self.rows, self.why, advice)


@dataclass(frozen=True)
class Plan:
    """What a run measures, known from the config alone and built once per process: the config with its sweep rows,
    the specgen rows parsed, every row in order with its model and losslessness, the prompts."""

    cfg: TextBenchConfig  # sweeps expanded (`with_sweeps`)
    rows: dict[str, Row]  # the specgen rows (`check_methods`)
    order: list[str]  # cfg.methods, then an `ar@NAME` row per other model a row decodes (its exact-match reference)
    meta: dict[str, dict]  # row -> {"model", "lossless"}
    items: list[Item]


def plan(cfg: TextBenchConfig, resolved: dict | None = None) -> Plan:
    """The run's rows and prompts without loading a model; a bad row or prompt set is refused. `resolved`: a run
    folder's (`resolved_of`), which a report plans from: the prompt file and the rows' registry models may not be on
    this machine, and its rows need only the prompts' count and categories."""
    cfg = with_sweeps(cfg)
    if resolved is not None:
        check_resolved(resolved)
        rows, prompts = ([part[str(i)] for i in range(len(part))] for part in (resolved["rows"], resolved["prompts"]))
        meta = {m: {"model": model, "lossless": lossless} for m, model, lossless in rows}
        return Plan(cfg, {}, list(meta), meta, [Item(Prompt(digest, category)) for category, digest in prompts])
    rows = check_methods(cfg)
    others = (decoded_model(m, cfg) for m in cfg.methods)
    order = list(dict.fromkeys([*cfg.methods, *(f"ar@{name}" for name in others if name != cfg.model)]))
    meta = {m: {"model": decoded_model(m, cfg),
                "lossless": PEERS[row_method(m)].lossless if is_peer(m) else get_method(row_method(m)).lossless}
            for m in order}
    items = SOURCES[cfg.suite](cfg)  # `limit` of the suite's prompts from `offset`
    if not items:
        raise PromptSourceError(f"no {cfg.suite} prompts at offset {cfg.offset}")
    return Plan(cfg, rows, order, meta, items)


# what `resolved_of` keeps, by position: each row's [name, model, losslessness], each prompt's [category, digest]
RESOLVED = {"rows": dict[str, tuple[str, str, bool]], "prompts": dict[str, tuple[str, str]]}


def check_resolved(resolved: dict) -> None:
    """A run folder's `resolved` as `resolved_of` writes it (an edited run.json is one line, not a KeyError)."""
    why = json_shape.keys_fault(resolved, RESOLVED) or next(
        (f"{k} is not numbered 0 to {len(resolved[k]) - 1}" for k in RESOLVED
         if set(resolved[k]) != {str(i) for i in range(len(resolved[k]))}), None)
    if why is not None:
        raise UsageError(f"the run folder's run.json is not a specgen run file: its resolved plan: {why}")


def resolved_of(p: Plan) -> dict:
    """What a run folder keeps of the plan beyond its config, by position (JSON objects: a change names its place):
    each row's [name, model, losslessness] and each prompt's [category, digest], so a report needs neither the prompt
    file nor the registry, and a resume with an edited prompt file is refused."""
    def digest(prompt: Prompt) -> str:
        return hashlib.sha256(json.dumps(prompt.content, sort_keys=True).encode()).hexdigest()[:16]

    return {"rows": {str(i): [m, p.meta[m]["model"], p.meta[m]["lossless"]] for i, m in enumerate(p.order)},
            "prompts": {str(i): [item.prompt.category, digest(item.prompt)] for i, item in enumerate(p.items)}}


def grid(p: Plan, skipped=()) -> Grid:
    """The run's items: its prompts, with every row of the plan but `skipped` (peer rows that cannot run here)."""
    return Grid(len(p.items), tuple(m for m in p.order if m not in skipped), tuple(p.cfg.batch_sizes), "b1/p{}",
                run=Run)


def with_quality(runs: dict[str, Run], prompt: list[int], problem, original: TextModel | None,
                 cfg: TextBenchConfig, stops: Stops) -> dict[str, Run]:
    """Each run with the original model's NLL of its tokens and, for a HumanEval problem, whether its completion
    (its text cut before a stop string, as `generate` cuts it) passes."""
    nll = {m: base_nll(original, prompt, r.tokens) if cfg.nll else (None, 0) for m, r in runs.items()}
    out = {m: replace(r, nll_sum=nll[m][0], nll_count=nll[m][1]) for m, r in runs.items()}
    if cfg.execute and problem is not None:
        texts = [original.tokenizer.decode(r.tokens) for r in out.values()]
        passed = check_completions([problem] * len(out), [text[: stops.cut(text)] for text in texts])
        out = {m: replace(r, passed=ok) for (m, r), ok in zip(out.items(), passed)}
    return out


def peer_dtype(model: TextModel) -> torch.dtype:
    """The dtype transformers' rows run in: the target's float precision (bfloat16, float16), else float32 (a
    quantized target's base weights: transformers has no int8/int4 kernels of its own on a CPU)."""
    return DTYPES.get(model.precision, torch.float32)


def peers_of(order: list[str], cfg: TextBenchConfig, original: TextModel, stops: Stops,
             dtype: torch.dtype = torch.float32) -> tuple[dict[str, Peer], dict[str, str]]:
    """The peer rows of `order` built (row -> peer), each ending at the specgen rows' `stops`, transformers' in
    `dtype`, and those that cannot run here (row -> the one-line reason)."""
    built, skipped = {}, {}
    for m in (m for m in order if is_peer(m)):
        setup = PeerSetup(m, original, row_options(m, cfg), cfg.max_new_tokens, stops, torch.get_num_threads(),
                          cfg.device, dtype)
        kind = PEERS[row_method(m)]
        if reason := kind.unavailable(setup):
            skipped[m] = reason
        else:
            built[m] = kind(setup)
    return built, skipped


def row_models(model: TextModel, p: Plan) -> dict[str, TextModel]:
    """name -> model of every row: `model`, and each other model a row decodes (a distilled target, `ar@NAME`) at
    the run's `dtype` and `quantize`, unless its name carries a precision of its own (`NAME+int8`)."""
    cfg = p.cfg
    models = {cfg.model: model}
    for name in {p.meta[m]["model"] for m in p.order} - {cfg.model}:
        own = any(split_name(name)[1:])
        models[name] = load_text_model(name, cfg.device, dtype=None if own else cfg.dtype,
                                       quantize=None if own else cfg.quantize, graphs=cfg.graphs)
        if tokenizer_hash(model.tokenizer) != tokenizer_hash(models[name].tokenizer):
            raise UsageError(f"{models[name].entry.ref} does not share the tokenizer of {model.entry.ref}; cannot "
                             "compare them")
    return models


def measure(model: TextModel, p: Plan, sink, shard: Shard = Shard(), on_item=lambda: None,
            machine: Callable[[], str] = str) -> None:
    """Measure this shard's items that `sink` (a RunDir, its shard started) has no record of (`Grid.measure`): at
    batch 1 a prompt with every row interleaved on it, at B > 1 one row over the shard's prompts."""
    cfg, rows, items = p.cfg, p.rows, p.items
    prompts = [encode(model.tokenizer, item.prompt, cfg.chat) for item in items]  # every row's, peers' too
    stops = text_stops(model.tokenizer, cfg.stop)  # every row's (the rows' models share one tokenizer)
    models = row_models(model, p)
    for row in rows.values():  # a row's assets (a static n-gram cache) fit the models' one tokenizer
        if row.spec.model_check is not None:
            row.spec.model_check(row.options, model.tokenizer)
    original = load_original(model, cfg.device)  # quality reference (nll_base, peer rows): the float32 weights
    peers, skipped = peers_of(p.order, cfg, original, stops, peer_dtype(model))
    # a row this shard skipped when its run started stays skipped on resume, where it may run: its records lack it
    earlier = (sink.machines().get(shard.label) or {}).get("skipped") or {}
    skipped = {**{m: why if why.endswith(RESUMED) else why + RESUMED for m, why in earlier.items()}, **skipped}
    work = grid(p, skipped)
    cost = cost_of(Tokens(model.module))  # c(B) of batched rows, c(N) of the efficiency of speculative rows
    streamed = {m: streamed_bytes(peers[m].module if m in peers else models[p.meta[m]["model"]].module)
                for m in work.rows if m not in peers or peers[m].module is not None}  # weights one forward reads
    use = GraphUse({name: tm.module for name, tm in models.items()}, sink, shard)
    use.write({"machine": machine(), "versions": versions(), "cost_rows": list(cost.rows), "cost": list(cost.cost),
               "skipped": skipped, "streamed_bytes": streamed,
               "bandwidth_gbs": copy_bandwidth(device=next(model.module.parameters()).device)})

    def decode(m: str, qs: list[list[int]], b: int) -> tuple[list[Run], float]:
        if m in peers:
            runs, wall = peers[m].batch(qs, b) if b > 1 else ([peers[m].run(qs[0])], 0.0)
        else:  # an `ar@NAME` reference row the plan added decodes as ar
            row = rows.get(m) or Row(METHODS["ar"], METHODS["ar"].parse_options({}))
            runs, wall = specgen_batch(models[p.meta[m]["model"]], row, qs, b, cfg, stops)
        return [replace(r, shard=shard.label) for r in runs], wall

    def timed(m: str, qs: list[list[int]], b: int) -> tuple[list[Run], float]:
        with use.timing(m if b == 1 else f"{m}@b{b}"):
            return decode(m, qs, b)

    def one(i: int) -> dict:
        runs = {m: timed(m, [prompts[i]], 1)[0][0] for m in work.rows}
        return {m: asdict(r) for m, r in with_quality(runs, prompts[i], items[i].problem, original, cfg, stops).items()}

    def batch(b: int, m: str, mine: list[int]) -> tuple[list[dict], float]:
        runs, wall = timed(m, [prompts[i] for i in mine], b)
        return [asdict(with_quality({m: r}, prompts[i], items[i].problem, original, cfg, stops)[m])
                for r, i in zip(runs, mine)], wall

    if cfg.warmup:
        use.warm(work.rows, warm_prompts(prompts), lambda m, q: decode(m, [q], 1),
                 [(work, lambda b, m, mine: decode(m, [prompts[i] for i in mine], b))])
    work.measure(sink, shard, one, batch, use.after_item(on_item))
    use.write()


def warm_prompts(prompts: list[list[int]]) -> list[list[int]]:
    """The prompts a row warms up on (`GraphUse.warm_up`: the first, and on CUDA more while they capture): the run's
    shortest and longest first, whose cache widths span those the timed items reach, then the others in order."""
    every = range(len(prompts))
    ends = [min(every, key=lambda i: len(prompts[i])), max(every, key=lambda i: len(prompts[i]))]
    return [prompts[i] for i in dict.fromkeys([*ends, *every])]


RESUMED = " (when this shard's run started: its records lack the row; a new --run-dir measures it)"


def rows_of(p: Plan, sink) -> list[dict]:
    """The rows of a finished run (every shard merged), without those a shard could not run (`RunDir.skipped_rows`)."""
    work = grid(p, sink.skipped_rows())
    return text_rows(sink.finished([work], "items"), work, p.meta, sink.machines(),
                     [item.prompt.category for item in p.items])


def versions() -> dict[str, str]:
    """Library versions a shard ran with (stored in its machine file)."""
    out = {"python": platform.python_version()}
    for pkg in ("specgen", "torch", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "-"
    return out
