"""Text benchmark (HumanEval prompts): every method on the same prompts in one process, interleaved per prompt.

Rows: tokens/s (median over prompts), speedup vs `ar` (median of per-prompt ratios), TPF, tau,
exact match vs `ar`, pass@1 (completions executed in subprocesses). The `hf` row is transformers'
own `generate` on identical weights, so specgen's AR baseline is shown not to be artificially slow.

Methods that decode a distilled model (`MethodSpec.target`, e.g. pcllm -> smollm2-135m-pcllm, or
`targets.<method>=NAME`) are timed against the ORIGINAL model's `ar` (speedup_vs_ar), while their
exact match is taken against the greedy AR of the model they decode (an extra `ar@<model>` row, run
interleaved like every other row). Quality that can move on a 135M model: `nll_base` = the original
model's mean per-token NLL of each row's outputs (teacher-forced), and for `ar@<model>` rows the
exact-match rate / mean matching-prefix length of the distilled model's greedy output vs the original's.

Variant rows: `method:tag` (e.g. `pcllm:n8`) runs `method` with `method_options[method]` updated by
`method_options["method:tag"]` (and `targets["method:tag"]` if given), so one run can compare settings
of one method side by side, e.g. block sizes against the measured cost of wider forwards.

Batch sizes (`batch_sizes: [1, 4, 16]`): batch 1 runs every method interleaved per prompt, as above. A batch
size B > 1 runs each method over all prompts through B slots of the batched loop (continuous batching; the
`hf` row: transformers `generate` on left-padded static batches of B), methods one after another. Its rows
report throughput (tokens over the batch's wall time), per-sequence latency (median, p90; queueing
included), speedup vs `ar` at the same B and vs batch-1 `ar` (when batch 1 ran), exact match vs `ar` at
the same B and at B = 1, and c(B): the measured cost of a B-row product pass relative to one row
(`decoding/cost.py`), which bounds what batching can gain.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from specgen.decoding.cost import cost_of
from specgen.decoding.sampling import SamplingParams
from specgen.errors import UsageError
from specgen.eval import humaneval
from specgen.eval.latency import percentile
from specgen.methods import get_method, model_for, run_batch
from specgen.text.target import TextModel, load_original

EXTERNAL = ("hf", "llamacpp")  # rows not decoded by specgen's loop (llamacpp: eval/llamacpp_row.py, optional)


@dataclass
class TextBenchConfig:
    """Options of `specgen benchmark --suite humaneval` (recipe keys)."""

    suite: str = "humaneval"
    methods: list[str] = field(default_factory=lambda: ["ar", "jacobi", "ngram", "hf"])
    model: str = "smollm2-135m"
    limit: int = 20
    offset: int = 0
    max_new_tokens: int = 128
    seed: int = 0
    device: str = "cpu"
    threads: int = 0  # 0 = torch default
    warmup: bool = True  # one discarded run of every method before timing
    execute: bool = True  # run pass@1 (subprocesses)
    method_options: dict = field(default_factory=dict)  # method (or variant row method:tag) -> {option: value}
    targets: dict = field(default_factory=dict)  # method -> model it decodes (default: its MethodSpec.target)
    nll: bool = True  # the original model's mean per-token NLL of every row's outputs
    dtype: str | None = None  # precision of `model` for every row: float32 | bfloat16 (per row: targets NAME+bf16)
    quantize: str | None = None  # int8 | int4 weights for every row (per row: targets NAME+int8); quality vs float32
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # 1: interleaved per prompt; B > 1: B slots


@dataclass(frozen=True)
class Run:
    """One method on one prompt (batched: `seconds` is the sequence's latency, queueing included)."""

    tokens: list[int]
    seconds: float
    forwards: int
    steps: int
    accepted: int
    draft_seconds: float = 0.0  # time in the drafter (specgen rows)
    verify_tokens: int = 0  # tokens fed to verify forwards, prefill excluded (specgen rows)
    prefill_seconds: float | None = None  # prompt prefill (specgen rows; batched: the batch's, shared equally)


def hf_batch_runs(hf_model, prompts: list[list[int]], batch: int, cfg: "TextBenchConfig",
                  stop_ids: tuple[int, ...]) -> tuple[list[Run], float]:
    """transformers `generate` (greedy) on left-padded static batches of `batch` prompts; (runs, total seconds).

    A static batch ends with its longest row, so every row of it reports the batch's wall time as latency.
    """
    pad = stop_ids[0] if stop_ids else 0
    runs, total = [], 0.0
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])  # [b, width], left padded
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        calls = [0]
        handle = hf_model.register_forward_pre_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = hf_model.generate(ids, attention_mask=mask, max_new_tokens=cfg.max_new_tokens, do_sample=False,
                                    eos_token_id=list(stop_ids) or None, pad_token_id=pad)
        total += time.perf_counter() - t0
        handle.remove()
        for row in out[:, width:].tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in stop_ids), len(row))
            runs.append(Run(row[:cut], total, calls[0], calls[0] - 1, 0))
    return runs, total


def hf_run(hf_model, prompt: list[int], cfg: TextBenchConfig, stop_ids: tuple[int, ...]) -> Run:
    """transformers `generate` (greedy), counting forwards with a pre-forward hook."""
    calls = [0]
    handle = hf_model.register_forward_pre_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    ids = torch.tensor([prompt])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=cfg.max_new_tokens,
                                do_sample=False, eos_token_id=list(stop_ids) or None,
                                pad_token_id=stop_ids[0] if stop_ids else None)
    seconds = time.perf_counter() - t0
    handle.remove()
    new = out[0, len(prompt):].tolist()
    return Run(new, seconds, calls[0], calls[0] - 1, 0)


def row_method(row: str) -> str:
    """The method a row runs: `pcllm:n8` -> `pcllm` (a variant row), `ar@NAME` -> `ar`."""
    return row.split("@")[0].split(":")[0]


def row_options(row: str, cfg: TextBenchConfig) -> dict:
    """A row's method options: the method's own, updated by the variant row's."""
    base = row_method(row)
    return {**cfg.method_options.get(base, {}), **(cfg.method_options.get(row, {}) if row != base else {})}


def specgen_run(model: TextModel, method: str, prompt: list[int], cfg: TextBenchConfig) -> Run:
    runs, _ = specgen_batch(model, method, [prompt], 1, cfg)
    return runs[0]


def specgen_batch(model: TextModel, method: str, prompts: list[list[int]], batch: int, cfg: TextBenchConfig,
                  on_done=None) -> tuple[list[Run], float]:
    """`method` over `prompts` through `batch` slots of the batched loop; (runs in prompt order, wall seconds)."""
    from specgen.text.generate import draft_budget

    spec = get_method(row_method(method))
    options = {"seed": cfg.seed, **row_options(method, cfg)}
    budget = draft_budget(model, options.pop("budget", "fixed"))
    t0 = time.perf_counter()
    res = run_batch(model.target, lambda i: spec.make_drafter(options), prompts, cfg.max_new_tokens, SamplingParams(),
                    model.tokenizer.stop_ids, batch_size=batch, on_done=on_done, budget=budget)
    seconds = time.perf_counter() - t0
    latency = (lambda r: r.stats.extras.get("latency_s", seconds)) if batch > 1 else (lambda r: seconds)
    prefill = res.stats.times.get("prefill", 0.0) / len(prompts)
    return [Run(r.tokens, latency(r), r.stats.target_forwards, r.stats.steps, sum(r.stats.accepted),
                r.stats.times.get("propose", 0.0), r.stats.target_tokens, prefill) for r in res.results], seconds


def decoded_model(method: str, cfg: TextBenchConfig) -> str:
    """The model a row decodes: `targets.<method>`, else the method's distilled target, else cfg.model."""
    if method in EXTERNAL:
        return cfg.model
    if "@" in method:
        return method.split("@", 1)[1]
    base = row_method(method)
    return cfg.targets.get(method) or cfg.targets.get(base) or model_for(get_method(base), cfg.model, TextBenchConfig.model)


@torch.inference_mode()
def base_nll(model: TextModel, prompt: list[int], tokens: list[int]) -> tuple[float, int]:
    """(sum of -log p, count) of `tokens` after `prompt` under `model` (one teacher-forced forward)."""
    if not tokens:
        return 0.0, 0
    ids = torch.tensor([prompt + tokens])
    logits, _ = model.module(ids, torch.arange(ids.shape[1])[None])
    logp = torch.log_softmax(logits[0, len(prompt) - 1 : -1].float(), -1)
    return float(-logp.gather(-1, ids[0, len(prompt):, None]).sum()), len(tokens)


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_methods(cfg: TextBenchConfig) -> None:
    if not cfg.batch_sizes or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1
                                      for b in cfg.batch_sizes):
        raise UsageError(f"batch_sizes must be integers >= 1, got {cfg.batch_sizes}")
    if "ar" not in cfg.methods:
        raise UsageError("the benchmark needs the 'ar' row: speedups and exact match are measured against it")
    for m in cfg.methods:
        if m not in EXTERNAL:
            spec = get_method(row_method(m))
            if not spec.runs_on("text"):
                raise UsageError(f"method {m} is for {spec.modality}; the humaneval suite is text")
            spec.check_options(row_options(m, cfg))


def run_text_benchmark(model: TextModel, cfg: TextBenchConfig, on_prompt=None) -> list[dict]:
    """Run every method on every prompt (interleaved) and summarise one row per method."""
    check_methods(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    problems = humaneval.load_problems(cfg.limit, cfg.offset)
    if not problems:
        raise UsageError(f"no HumanEval problems at offset {cfg.offset}")
    from specgen.text.target import load_text_model

    prompts = [model.tokenizer.encode(humaneval.build_user_message(p)) for p in problems]
    models = {cfg.model: model}
    original = load_original(model, cfg.device)  # quality reference (nll_base, hf row): the float32 weights
    order = list(cfg.methods)
    for m in cfg.methods:  # each distilled model also gets its own greedy AR row (exact-match reference)
        name = decoded_model(m, cfg)
        if name not in models:
            models[name] = load_text_model(name, cfg.device)
            check_same_tokenizer(model, models[name])
            if f"ar@{name}" not in order:  # listed explicitly (e.g. ar@smollm2-135m+bf16): run it once
                order.append(f"ar@{name}")
    hf_model = None
    if "hf" in cfg.methods:
        from specgen.models.hf_export import to_hf

        hf_model = to_hf(original.module)
    llama, skipped = None, []
    if "llamacpp" in order:
        from specgen.eval import llamacpp_row

        reason = llamacpp_row.unavailable()
        if reason:
            order.remove("llamacpp")
            skipped.append({"method": "llamacpp", "skipped": reason})
        else:
            llama = llamacpp_row.LlamaCppRow(cfg.method_options.get("llamacpp", {}), torch.get_num_threads(),
                                             model.module.cfg.max_seq_len, model.module.cfg.vocab_size)
    stop = model.tokenizer.stop_ids

    def one(method: str, prompt: list[int]) -> Run:
        if method == "hf":
            return hf_run(hf_model, prompt, cfg, stop)
        if method == "llamacpp":
            tokens, seconds, forwards = llama.run(prompt, cfg.max_new_tokens, stop)
            return Run(tokens, seconds, forwards, forwards - 1, 0)
        return specgen_run(models[decoded_model(method, cfg)], method, prompt, cfg)

    if cfg.warmup:
        warm = model.tokenizer.encode("Write a Python function that adds two numbers.")
        for m in order:
            one(m, warm)
    rows, reference = [], None
    cost = cost_of(model.module)  # c(B) of batched rows, c(N) of the efficiency of speculative rows
    for batch in cfg.batch_sizes:
        if batch == 1:
            runs: dict[str, list[Run]] = {m: [] for m in order}
            for i, prompt in enumerate(prompts):
                for m in order:
                    runs[m].append(one(m, prompt))
                if on_prompt:
                    on_prompt(i)
            walls = {m: sum(r.seconds for r in rs) for m, rs in runs.items()}
        else:
            runs, walls = {}, {}
            for m in order:
                if m == "hf":
                    runs[m], walls[m] = hf_batch_runs(hf_model, prompts, batch, cfg, stop)
                elif m == "llamacpp":  # one sequence at a time (the row's runner has no batch)
                    runs[m] = [one(m, p) for p in prompts]
                    walls[m] = sum(r.seconds for r in runs[m])
                else:
                    done = (lambda i: on_prompt(i)) if on_prompt and m == order[0] else None
                    runs[m], walls[m] = specgen_batch(models[decoded_model(m, cfg)], m, prompts, batch, cfg, done)
        batch_rows = summarise(original, problems, runs, cfg, prompts, walls, reference)
        for row in batch_rows:
            row["batch_size"] = batch
            row["c_batch"] = round(cost(batch), 3)
            if batch == 1 and row["method"] in runs:
                row.update(efficiency(runs[row["method"]], runs["ar"], row["speedup_vs_ar"], cost))
        rows += batch_rows
        if batch == 1:
            reference = {"runs": runs["ar"], "tokens_per_s": batch_rows[0]["throughput_tokens_per_s"]}
    return rows + skipped  # a skipped row carries its one-line reason ("skipped")


def efficiency(rs: list[Run], ar: list[Run], speedup: float, cost) -> dict:
    """How much of what acceptance allows a speculative row delivers (batch 1): eta = speedup / predicted, where
    predicted = tau / (c(N) + d): N = mean tokens per verify forward, c(N) its measured cost relative to one
    token (`decoding/cost.py`: weight products only), d = drafter time per step in AR steps. {} for rows without
    verify steps or drafts (AR, external rows)."""
    steps = sum(r.steps for r in rs)
    tokens = sum(r.verify_tokens for r in rs)
    if not steps or tokens <= steps:
        return {}
    t_ar = sum(r.seconds for r in ar) / sum(r.forwards for r in ar)  # seconds per AR forward
    tau = (sum(r.accepted for r in rs) + steps) / steps
    n, d = tokens / steps, sum(r.draft_seconds for r in rs) / steps / t_ar
    predicted = tau / (cost(n) + d)
    return {"verify_tokens": round(n, 3), "draft_cost": round(d, 4), "predicted_speedup": round(predicted, 4),
            "efficiency": round(speedup / predicted, 4)}


def check_same_tokenizer(base: TextModel, other: TextModel) -> None:
    from specgen.text.trajectories import tokenizer_hash

    if tokenizer_hash(base.tokenizer) != tokenizer_hash(other.tokenizer):
        raise UsageError(f"{other.entry.ref} does not share the tokenizer of {base.entry.ref}; cannot compare them")


def summarise(model: TextModel, problems, runs: dict[str, list[Run]], cfg: TextBenchConfig,
              prompts: list[list[int]] | None = None, walls: dict[str, float] | None = None,
              reference: dict | None = None) -> list[dict]:
    """One row per method. `walls`: each method's wall seconds over all prompts (throughput); `reference`:
    batch-1 `ar` (its runs and throughput) when these runs are batched."""
    ar = runs["ar"]
    walls = walls or {m: sum(r.seconds for r in rs) for m, rs in runs.items()}
    rows = []
    for m, rs in runs.items():
        tps = [len(r.tokens) / r.seconds for r in rs]
        ratio = [t / (len(a.tokens) / a.seconds) for t, a in zip(tps, ar)]
        tokens, forwards, steps = sum(len(r.tokens) for r in rs), sum(r.forwards for r in rs), sum(r.steps for r in rs)
        decoded = decoded_model(m, cfg)
        own = runs["ar"] if decoded == cfg.model else runs[f"ar@{decoded}"]
        row = {
            "method": m,
            "model": decoded,
            "lossless": (m == "hf") if m in EXTERNAL else get_method(row_method(m)).lossless,  # llamacpp: its GGUF
            "prompts": len(rs),
            "tokens_per_s": statistics.median(tps),
            "aggregate_tokens_per_s": tokens / sum(r.seconds for r in rs),
            "speedup_vs_ar": statistics.median(ratio),
            "tpf": tokens / forwards,
            "tau": (sum(r.accepted for r in rs) + steps) / steps if steps else None,
            "nfe": forwards,
            "exact_match_vs_ar": sum(r.tokens == a.tokens for r, a in zip(rs, ar)) / len(rs),
            "exact_match_vs_own_ar": sum(r.tokens == a.tokens for r, a in zip(rs, own)) / len(rs),
            "new_tokens": tokens,
            "throughput_tokens_per_s": tokens / walls[m],
            # the same without the prompts' prefill (compute-bound on a CPU, so batching cannot amortise it)
            "decode_tokens_per_s": (tokens / (walls[m] - sum(r.prefill_seconds for r in rs))
                                    if all(r.prefill_seconds is not None for r in rs) else None),
            "latency_median_s": percentile([r.seconds for r in rs], 50),
            "latency_p90_s": percentile([r.seconds for r in rs], 90),
        }
        row["throughput_vs_ar"] = row["throughput_tokens_per_s"] / (sum(len(r.tokens) for r in ar) / walls["ar"])
        if reference is not None:
            row["throughput_vs_ar_b1"] = row["throughput_tokens_per_s"] / reference["tokens_per_s"]
            row["exact_match_vs_ar_b1"] = sum(r.tokens == a.tokens for r, a in zip(rs, reference["runs"])) / len(rs)
        if m.startswith("ar@"):
            row["prefix_vs_ar"] = statistics.mean(common_prefix(r.tokens, a.tokens) for r, a in zip(rs, ar))
        if cfg.nll and prompts is not None:
            parts = [base_nll(model, p, r.tokens) for p, r in zip(prompts, rs)]
            row["nll_base"] = sum(x for x, _ in parts) / max(1, sum(c for _, c in parts))
        if cfg.execute:
            completions = [model.tokenizer.decode(r.tokens) for r in rs]
            row["pass_at_1"] = humaneval.pass_at_1(humaneval.check_completions(problems, completions))
        rows.append(row)
    return rows
