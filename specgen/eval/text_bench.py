"""Text benchmark (HumanEval prompts): every method on the same prompts in one process, interleaved per prompt.

Rows: tokens/s (median over prompts), speedup vs `ar` (median of per-prompt ratios), TPF, tau,
exact match vs `ar`, pass@1 (completions executed in subprocesses). The `hf` row is transformers'
own `generate` on identical weights, so specgen's AR baseline is shown not to be artificially slow.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from specgen.decoding.loop import decode
from specgen.decoding.sampling import SamplingParams
from specgen.errors import UsageError
from specgen.eval import humaneval
from specgen.methods import get_method
from specgen.text.target import TextModel

EXTERNAL = ("hf",)  # rows not decoded by specgen's loop


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
    method_options: dict = field(default_factory=dict)  # method -> {option: value}


@dataclass(frozen=True)
class Run:
    """One method on one prompt."""

    tokens: list[int]
    seconds: float
    forwards: int
    steps: int
    accepted: int


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


def specgen_run(model: TextModel, method: str, prompt: list[int], cfg: TextBenchConfig) -> Run:
    spec = get_method(method)
    options = {"seed": cfg.seed, **cfg.method_options.get(method, {})}
    drafter = spec.make_drafter(options)
    t0 = time.perf_counter()
    res = decode(model.target, drafter, prompt, cfg.max_new_tokens, SamplingParams(), model.tokenizer.stop_ids)
    seconds = time.perf_counter() - t0
    return Run(res.tokens, seconds, res.stats.target_forwards, res.stats.steps, sum(res.stats.accepted))


def check_methods(cfg: TextBenchConfig) -> None:
    if "ar" not in cfg.methods:
        raise UsageError("the benchmark needs the 'ar' row: speedups and exact match are measured against it")
    for m in cfg.methods:
        if m not in EXTERNAL:
            spec = get_method(m)
            if not spec.runs_on("text"):
                raise UsageError(f"method {m} is for {spec.modality}; the humaneval suite is text")
            spec.check_options(cfg.method_options.get(m, {}))


def run_text_benchmark(model: TextModel, cfg: TextBenchConfig, on_prompt=None) -> list[dict]:
    """Run every method on every prompt (interleaved) and summarise one row per method."""
    check_methods(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    problems = humaneval.load_problems(cfg.limit, cfg.offset)
    if not problems:
        raise UsageError(f"no HumanEval problems at offset {cfg.offset}")
    prompts = [model.tokenizer.encode(humaneval.build_user_message(p)) for p in problems]
    hf_model = None
    if "hf" in cfg.methods:
        from specgen.models.hf_export import to_hf

        hf_model = to_hf(model.module)
    stop = model.tokenizer.stop_ids

    def one(method: str, prompt: list[int]) -> Run:
        return hf_run(hf_model, prompt, cfg, stop) if method == "hf" else specgen_run(model, method, prompt, cfg)

    if cfg.warmup:
        warm = model.tokenizer.encode("Write a Python function that adds two numbers.")
        for m in cfg.methods:
            one(m, warm)
    runs: dict[str, list[Run]] = {m: [] for m in cfg.methods}
    for i, prompt in enumerate(prompts):
        for m in cfg.methods:
            runs[m].append(one(m, prompt))
        if on_prompt:
            on_prompt(i)
    return summarise(model, problems, runs, cfg)


def summarise(model: TextModel, problems, runs: dict[str, list[Run]], cfg: TextBenchConfig) -> list[dict]:
    ar = runs["ar"]
    rows = []
    for m, rs in runs.items():
        tps = [len(r.tokens) / r.seconds for r in rs]
        ratio = [t / (len(a.tokens) / a.seconds) for t, a in zip(tps, ar)]
        tokens, forwards, steps = sum(len(r.tokens) for r in rs), sum(r.forwards for r in rs), sum(r.steps for r in rs)
        row = {
            "method": m,
            "lossless": True if m in EXTERNAL else get_method(m).lossless,
            "prompts": len(rs),
            "tokens_per_s": statistics.median(tps),
            "aggregate_tokens_per_s": tokens / sum(r.seconds for r in rs),
            "speedup_vs_ar": statistics.median(ratio),
            "tpf": tokens / forwards,
            "tau": (sum(r.accepted for r in rs) + steps) / steps if steps else None,
            "nfe": forwards,
            "exact_match_vs_ar": sum(r.tokens == a.tokens for r, a in zip(rs, ar)) / len(rs),
            "new_tokens": tokens,
        }
        if cfg.execute:
            completions = [model.tokenizer.decode(r.tokens) for r in rs]
            row["pass_at_1"] = humaneval.pass_at_1(humaneval.check_completions(problems, completions))
        rows.append(row)
    return rows
