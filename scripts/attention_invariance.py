"""Does a verification forward compute exactly what AR steps compute on low-precision SmolLM2, and what does the
invariant attention (models/attention.py) cost?

One question, three measurements, 1 thread. (1) After a HumanEval prompt, the next 24 tokens are scored one at a
time (AR steps) and in 4-token forwards (verification); count the positions whose logits differ in any bit, for
each target and each attention: specgen's invariant attention, SDPA in float32, SDPA in the activation dtype.
(2) The attention alone (SmolLM2's 9 query / 3 KV heads of 64, 30 layers), best of 7 interleaved rounds.
(3) AR tokens/s over 64 new tokens on the int8 target with the invariant attention vs SDPA in float32,
interleaved per prompt (end to end, so as noisy as the machine).

Run: `python scripts/attention_invariance.py > docs/logs/attention-invariance.log`
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from specgen.decoding.sampling import SamplingParams
from specgen.data import humaneval
from specgen.methods import run_batch
from specgen.methods.text import EmptyDrafter
from specgen.models import transformer as T
from specgen.text.target import load_text_model

INVARIANT = (T.invariant_attention, T.plan)


def sdpa(dtype):
    def attention(q, k, v, mask):
        d = dtype or q.dtype
        return F.scaled_dot_product_attention(q.to(d), k.to(d), v.to(d), attn_mask=mask,
                                              enable_gqa=q.shape[1] != k.shape[1]).to(q.dtype)
    return attention, (lambda mask, *a: mask)  # SDPA takes the boolean mask itself


ATTENTIONS = {"invariant": INVARIANT, "sdpa float32": sdpa(torch.float32), "sdpa bfloat16": sdpa(None)}


def use(name: str) -> None:
    T.invariant_attention, T.plan = ATTENTIONS[name]


@torch.inference_mode()
def differing_positions(model, ids: list[int], n: int = 24, width: int = 4) -> int:
    x = torch.tensor([ids])
    p = len(ids) - n
    logits = {}
    for w in (1, width):
        cache = model.new_cache(1, len(ids) + 1)
        model(x[:, :p], torch.arange(p)[None], cache)
        cache.commit(0, list(range(p)))
        out = []
        for q in range(p, p + n, w):
            out.append(model(x[:, q : q + w], torch.arange(q, q + w)[None], cache)[0][0])
            cache.commit(0, list(range(w)))
        logits[w] = torch.cat(out)
    return int((logits[1] != logits[width]).any(-1).sum())


def main() -> None:
    torch.set_num_threads(1)
    problems = humaneval.load_problems(3, 0)
    print(f"# torch {torch.__version__}, 1 thread")
    print("\n## positions (of 24) whose logits differ between AR steps and 4-token forwards")
    print("| target | prompt | " + " | ".join(ATTENTIONS) + " |")
    print("|---|---:|" + "---:|" * len(ATTENTIONS))
    for spec in ("smollm2-135m+int8", "smollm2-135m+int4", "smollm2-135m+bf16"):
        tm = load_text_model(spec)
        for i, prob in enumerate(problems):
            ids = tm.tokenizer.encode(humaneval.build_user_message(prob))
            counts = []
            for name in ATTENTIONS:
                use(name)
                counts.append(differing_positions(tm.module, ids))
            use("invariant")
            print(f"| {spec} | {i} | " + " | ".join(map(str, counts)) + " |", flush=True)
    print("\n## attention alone: ms per 30 layers (S queries over T keys, bfloat16 in and out)")
    print("| S | T | invariant | sdpa float32 |")
    print("|---:|---:|---:|---:|")
    for s, t in ((1, 250), (4, 250), (16, 250), (180, 180)):
        q = torch.randn(1, 9, s, 64).bfloat16()
        k, v = torch.randn(1, 3, t, 64).bfloat16(), torch.randn(1, 3, t, 64).bfloat16()
        mask = torch.ones(1, 1, s, t, dtype=torch.bool).tril(t - s)
        shared = INVARIANT[1](mask, 1, s, t, 9, 3, 64)  # made once per forward in the model
        calls = {"invariant": lambda: INVARIANT[0](q, k, v, shared),
                 "sdpa float32": lambda: ATTENTIONS["sdpa float32"][0](q, k, v, mask)}
        best = {name: float("inf") for name in calls}
        for _ in range(7):
            for name, call in calls.items():
                t0 = time.perf_counter()
                for _ in range(30):
                    call()
                best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
        print(f"| {s} | {t} | {best['invariant']:.2f} | {best['sdpa float32']:.2f} |", flush=True)
    print("\n## AR tokens/s, smollm2-135m+int8, 64 new tokens, interleaved (3 prompts x 2 rounds)")
    tm = load_text_model("smollm2-135m+int8")
    speed: dict[str, list[float]] = {"invariant": [], "sdpa float32": []}
    for _ in range(2):
        for prob in problems:
            ids = tm.tokenizer.encode(humaneval.build_user_message(prob))
            for name in speed:
                use(name)
                t = time.perf_counter()
                out = run_batch(tm.target, lambda i: EmptyDrafter(), [ids], 64, SamplingParams(),
                                tm.tokenizer.stop_ids).results[0]
                speed[name].append(len(out.tokens) / (time.perf_counter() - t))
    use("invariant")
    for name, v in speed.items():
        print(f"| {name} | median {sorted(v)[len(v) // 2]:.1f} | " + " ".join(f"{x:.1f}" for x in v) + " |")


if __name__ == "__main__":
    main()
