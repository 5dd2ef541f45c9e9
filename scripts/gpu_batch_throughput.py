"""Batched AR throughput of SmolLM2-135M's shape on a GPU: specgen's batched loop vs transformers' batched `generate`.

What it answers: on a CUDA device, does the batched core (`run_batch`, empty drafter = AR) keep up with
`transformers` at batch 1 / 4 / 16 / 64, and what does a B-row step cost relative to one row (c(B))?

The weights are random (seeded) in SmolLM2-135M-Instruct's shape unless `--gguf` names the real file: the model
file (94 MB) is larger than what travels to a rented GPU here. Throughput of AR does not depend on the weights
when every row decodes exactly `--new` tokens (no stop token), so the comparison is fair either way; exact match
between the two rows is reported but, with random weights and bfloat16 kernels that differ, near-ties make it
less than 1 for reasons that say nothing about either loop.

Run: `python scripts/gpu_batch_throughput.py --device cuda --dtype bfloat16 > docs/logs/gpu/batch-throughput.log`.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from specgen.decoding.cost import PREFIX, Tokens, measure_cost
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.stops import Stops
from specgen.decoding.target import ModelTarget
from specgen.devices import now
from specgen.eval.hf_rows import HfGenerate
from specgen.eval.peers import PeerSetup
from specgen.methods import run_batch
from specgen.methods.text import EmptyDrafter
from specgen.models.transformer import Transformer, TransformerConfig
from specgen.text.target import TextModel

# SmolLM2-135M-Instruct (its GGUF's metadata)
SMOLLM2 = TransformerConfig(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536,
                            norm_eps=1e-5, rope_theta=100000.0, max_seq_len=2048, tie_embeddings=True)


def model_of(args) -> Transformer:
    if args.gguf:
        from specgen.models.gguf_loader import load_gguf

        loaded = load_gguf(Path(args.gguf))
        model = Transformer(loaded.cfg)
        model.load_state_dict(loaded.state, strict=False)
        return model
    torch.manual_seed(0)
    return Transformer(SMOLLM2)


def prompts_of(n: int, lengths: tuple[int, int], vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(vocab) for _ in range(rng.randint(*lengths))] for _ in range(n)]


def forward_seconds(model: Transformer, device: str, rounds: int = 20) -> float:
    """Median wall time of one single-token forward after a PREFIX-token cache (synchronised clock)."""
    cache = model.new_cache(1, PREFIX + 1)
    ids = torch.randint(0, model.cfg.vocab_size, (1, PREFIX + 1), device=device)
    pos = torch.arange(PREFIX + 1, device=device)[None]
    with torch.inference_mode():
        model(ids[:, :PREFIX], pos[:, :PREFIX], cache)
        cache.commit(0, list(range(PREFIX)))
        times = []
        for _ in range(rounds):
            t0 = now(device)
            model(ids[:, PREFIX:], pos[:, PREFIX:], cache)
            times.append(now(device) - t0)
    return sorted(times)[rounds // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--gguf", default="")
    ap.add_argument("--json", default="", help="also write the rows here")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    model = model_of(args).to(device=args.device, dtype=dtype).eval()
    target = ModelTarget(model)
    target.device = args.device
    def hf_rows(new: int) -> HfGenerate:  # transformers' generate on the same weights (no tokenizer: no stop token)
        setup = PeerSetup("hf", TextModel(model, target, None, None), {}, new, Stops(), 0, args.device)
        peer = HfGenerate(setup)
        peer.module = peer.module.to(device=args.device, dtype=dtype).eval()
        return peer

    batches = [int(b) for b in args.batches.split(",")]
    curve = measure_cost(Tokens(model), rows=tuple(sorted({1, *batches})))
    print(f"device {torch.cuda.get_device_name() if 'cuda' in args.device else args.device}, dtype {args.dtype}, "
          f"torch {torch.__version__}, {'weights ' + args.gguf if args.gguf else 'random weights'} (SmolLM2-135M shape)")
    print(f"one forward of 1 new token after {PREFIX} cached: {1e3 * forward_seconds(model, args.device):.2f} ms")
    print("c(B): " + ", ".join(f"c({m})={c:.2f}" for m, c in zip(curve.rows, curve.cost)))
    print(f"{'batch':>5} {'prompts':>7} {'specgen tok/s':>14} {'hf tok/s':>9} {'specgen/hf':>10} {'exact':>6}")
    rows, base = [], None
    for b in batches:
        prompts = prompts_of(max(4, 2 * b), (64, 256), SMOLLM2.vocab_size)
        run_batch(target, lambda i: EmptyDrafter(), prompts[:b], 4, SamplingParams(), batch_size=b)  # warm-up
        t0 = now(args.device)
        res = run_batch(target, lambda i: EmptyDrafter(), prompts, args.new, SamplingParams(), batch_size=b)
        ours_s = now(args.device) - t0
        hf_rows(4).batch(prompts[:b], b)  # warm-up
        runs, hf_s = hf_rows(args.new).batch(prompts, b)
        tokens = len(prompts) * args.new
        exact = sum(r.tokens == h.tokens for r, h in zip(res.results, runs)) / len(prompts)
        row = {"batch": b, "prompts": len(prompts), "specgen_tok_s": tokens / ours_s, "hf_tok_s": tokens / hf_s,
               "exact": exact}
        base = base or row["specgen_tok_s"]
        row["specgen_vs_b1"] = row["specgen_tok_s"] / base
        steps = max(res.stats.steps, 1)
        row["ms_per_step"] = {k: 1e3 * v / steps for k, v in sorted(res.stats.times.items())}
        rows.append(row)
        print(f"{b:>5} {len(prompts):>7} {row['specgen_tok_s']:>14.1f} {row['hf_tok_s']:>9.1f} "
              f"{row['specgen_tok_s'] / row['hf_tok_s']:>10.2f} {exact:>6.2f}   specgen ms per step: "
              + ", ".join(f"{k} {v:.2f}" for k, v in row["ms_per_step"].items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"cost": dict(zip(curve.rows, curve.cost)), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
