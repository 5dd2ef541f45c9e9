"""Prefill and per-token decode time of SmolLM2-135M: specgen's int4 AR against llama.cpp on the shipped Q4_1 GGUF
(1 thread, the same prompt ids, greedy, best of 3). Splits the end-to-end tokens/s of the benchmark into the two
phases. Run: `python scripts/int4_step_vs_llamacpp.py > docs/logs/int4-step-vs-llamacpp.log` (needs
llama-cpp-python). Cited by docs/results/precision.md (the cheaper low-precision step)."""

from __future__ import annotations

import time

import torch

from specgen.decoding.sampling import SamplingParams
from specgen.eval.llamacpp_row import default_gguf
from specgen.methods import run_batch
from specgen.methods.text import EmptyDrafter
from specgen.text.target import load_text_model

NEW = 128


def specgen_times(prompt: list[int]) -> tuple[float, float]:
    """(prefill ms, decode ms per token) of int4 AR: a 1-token run is the prefill, the rest is decoding."""
    tm = load_text_model("smollm2-135m", "cpu", quantize="int4")

    def run(n: int) -> float:
        t = time.perf_counter()
        run_batch(tm.target, lambda i: EmptyDrafter(), [prompt], n, SamplingParams(), ())
        return time.perf_counter() - t

    run(8)  # warm-up
    prefill = min(run(1) for _ in range(3))
    total = min(run(NEW) for _ in range(3))
    return prefill * 1e3, (total - prefill) / (NEW - 1) * 1e3


def llamacpp_times(prompt: list[int]) -> tuple[float, float]:
    from llama_cpp import Llama

    llm = Llama(str(default_gguf()), n_threads=1, n_threads_batch=1, n_ctx=1024, verbose=False, seed=0)
    best = (float("inf"), float("inf"))
    for _ in range(3):
        llm.reset()
        t = time.perf_counter()
        llm.eval(prompt)
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(NEW - 1):
            llm.eval([llm.sample(temp=0.0)])
        best = min(best, (prefill * 1e3, (time.perf_counter() - t) / (NEW - 1) * 1e3))
    return best


def main() -> None:
    torch.set_num_threads(1)
    tok = load_text_model("smollm2-135m", "cpu").tokenizer
    prompt = tok.encode("def fib(n):\n    '''Return the n-th Fibonacci number.'''\n" * 6)
    print(f"prompt {len(prompt)} tokens, {NEW} new, 1 thread, best of 3")
    for name, fn in (("specgen int4 AR", specgen_times), ("llama.cpp Q4_1", llamacpp_times)):
        prefill, step = fn(prompt)
        print(f"{name:16s} prefill {prefill:7.1f} ms   decode {step:6.2f} ms/token   "
              f"end to end {NEW / ((prefill + step * (NEW - 1)) / 1e3):6.1f} tokens/s")


if __name__ == "__main__":
    main()
