"""Where does an int4 AR step of SmolLM2-135M spend its time (1 thread)? Tokens/s of AR on the int4 target, then the
torch profiler's per-op table over 32 steps. Run: `python scripts/int4_ar_profile.py > docs/logs/int4-ar-profile.log`.
Cited by docs/results/precision.md (the roofline re-run)."""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

from specgen.decoding.sampling import SamplingParams
from specgen.methods import run_batch
from specgen.methods.text import EmptyDrafter
from specgen.text.target import load_text_model


def main() -> None:
    torch.set_num_threads(1)
    tm = load_text_model("smollm2-135m", "cpu", quantize="int4")
    prompt = tm.tokenizer.encode("Write a Python function that checks whether a number is prime.")

    def decode(n: int) -> float:
        t = time.perf_counter()
        run_batch(tm.target, lambda i: EmptyDrafter(), [prompt], n, SamplingParams(), ())
        return n / (time.perf_counter() - t)

    decode(8)  # warm-up
    print("int4 AR tokens/s, 64 tokens, 3 runs:", [round(decode(64), 1) for _ in range(3)])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        decode(32)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
