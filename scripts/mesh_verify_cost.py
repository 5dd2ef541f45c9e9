"""What verifying S tokens in one mesh-GPT forward costs on this machine, relative to one token.

    python scripts/mesh_verify_cost.py --models mesh-gpt-tiny,512x8x1024,768x12x2048

A model is a registry name or DIMxLAYERSxFFN: the tiny backbone's architecture (encoder, vocabulary,
cross-attention) at that width and depth with random weights, since only the cost is measured. Each
forward runs over a KV cache holding 60 committed tokens (a mid-mesh step), in the decode layout the
decoders use (`models/layout.py`), one thread by default; the median of `--repeats` calls is reported.
XSpecMesh with D heads verifies D + 1 tokens per step: a ratio near 1 means a step costs about one AR
step (a GPU, or a model whose weights dominate), a ratio of 1.6 means speculation must accept 0.6
tokens per step just to break even.
"""

from __future__ import annotations

import argparse
import time

import torch

from specgen import checkpoints
from specgen.models.layout import decode_layout
from specgen.models.mesh import MeshGPT


def build(spec: str, template: MeshGPT) -> MeshGPT:
    """A registered mesh GPT, or the template's architecture at DIMxLAYERSxFFN with random weights."""
    if "x" not in spec:
        return checkpoints.load_module(checkpoints.find(spec)).float().eval()
    dim, layers, ffn = (int(v) for v in spec.split("x"))
    kw = template.builder_kwargs()
    return MeshGPT({**kw["decoder"], "dim": dim, "n_layers": layers, "ffn_dim": ffn, "n_heads": dim // 64},
                   kw["encoder"]).eval()


@torch.inference_mode()
def forward_ms(model: MeshGPT, rows: list[int], repeats: int) -> list[float]:
    """Median ms of the decoder's blocks (no LM head) over S tokens, for each S in rows, after 60 committed tokens."""
    cache = model.new_cache(1, 128)
    model.prefill(cache, model.condition(torch.randn(1, 2048, 6))[1])  # any cloud: only the cost is measured
    dec = model.decoder

    def step_hidden(tokens: torch.Tensor, start: int) -> torch.Tensor:
        pos = torch.arange(start, start + tokens.shape[1])[None]
        return dec.hidden_states(dec.tok_embeddings(tokens), pos, cache)

    step_hidden(torch.randint(0, 512, (1, 60)), 1)
    cache.commit(0, list(range(60)))
    out = []
    for s in rows:
        times = []
        for _ in range(repeats):
            tokens = torch.randint(0, 512, (1, s))
            t0 = time.perf_counter()
            step_hidden(tokens, 61)  # uncommitted: every call verifies at the same position
            times.append(time.perf_counter() - t0)
        out.append(sorted(times)[len(times) // 2] * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mesh-gpt-tiny,512x8x1024,768x12x2048")
    ap.add_argument("--rows", default="1,2,3,5", help="tokens per forward (D + 1)")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = [int(r) for r in args.rows.split(",")]
    template = checkpoints.load_module(checkpoints.find("mesh-gpt-tiny")).float().eval()
    print(f"{args.threads} thread(s); median of {args.repeats} forwards after 60 committed tokens")
    print(f"{'model':>16}  {'params':>7}  " + "  ".join(f"{f'{s} tok ms (x)':>15}" for s in rows))
    for spec in args.models.split(","):
        model = build(spec, template)
        decode_layout(model)
        ms = forward_ms(model, rows, args.repeats)
        n = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"{spec:>16}  {n:6.1f}M  " + "  ".join(f"{m:7.2f} ({m / ms[0]:4.2f})" for m in ms))


if __name__ == "__main__":
    main()
