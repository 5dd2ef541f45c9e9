"""Upper bound on XSpecMesh's SCR for a backbone: how far would perfect heads get under the threshold rule?

    python scripts/mesh_oracle_scr.py runs/xspecmesh-ca/labels.safetensors --model mesh-gpt-tiny

Reads the held-out label sequences of a `train-heads` run (the backbone's own samples: the last
`--sequences` rows) and scores them with the backbone under the label sampling filter (T 0.5, top-k 50,
top-p 0.95 unless told otherwise). An oracle head proposes the backbone's most likely token at every
position, so a candidate passes `p > delta` exactly where the backbone's top probability exceeds delta.
Replaying Algorithm 1 over each sequence with D such candidates per step gives the oracle SCR; the
measured SCR of real heads sits below it by how often their candidate is not that token.
"""

from __future__ import annotations

import argparse

import torch

from specgen import checkpoints
from specgen.decoding.sampling import SamplingParams, logits_to_probs
from specgen.eval.mesh_labels import held_out_labels


def oracle_scr(confident: list[bool], depth: int) -> tuple[int, int]:
    """(tokens, steps) of Algorithm 1 on one sequence when candidate j passes iff confident[j]."""
    steps, i, n = 0, 0, len(confident)
    while i < n:
        a = 0
        while a < depth and i + 1 + a < n and confident[i + 1 + a]:
            a += 1
        i, steps = i + 1 + a, steps + 1
    return n, steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("labels", help="labels.safetensors of a train-heads run")
    ap.add_argument("--model", default="mesh-gpt-tiny")
    ap.add_argument("--sequences", type=int, default=64, help="last N label rows (a run's last eval_sequences rows are its held-out ones)")
    ap.add_argument("--deltas", default="0.1,0.5,0.9")
    ap.add_argument("--depths", default="2,3,4")
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--top-p", type=float, default=0.95)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = checkpoints.load_module(checkpoints.find(args.model)).float().eval()
    pcs, tokens = held_out_labels(args.labels, args.sequences)  # tokens [S, L], -1 = padding
    with torch.no_grad():
        logits, _, _ = model.forward_train(pcs, tokens)  # [S, L, V]: row i predicts tokens[:, i]
    probs = logits_to_probs(logits, SamplingParams(args.temperature, args.top_k, args.top_p))
    real = tokens >= 0
    top = probs.max(-1).values  # [S, L]
    sampled = probs.gather(-1, tokens.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # [S, L]
    print(f"{args.model}: {int(real.sum())} label positions in {len(tokens)} sequences; "
          f"mean p(sampled token) {float(sampled[real].mean()):.3f}")
    for delta in (float(d) for d in args.deltas.split(",")):
        share = float((top > delta)[real].float().mean())
        row = []
        for depth in (int(d) for d in args.depths.split(",")):
            tok = steps = 0
            for s in range(len(tokens)):
                n = int(real[s].sum())
                a, b = oracle_scr((top[s, :n] > delta).tolist(), depth)
                tok, steps = tok + a, steps + b
            row.append(f"D={depth} {tok / steps:.2f}")
        print(f"delta {delta:g}: top probability > delta at {share:.1%} of positions; oracle SCR " + ", ".join(row))


if __name__ == "__main__":
    main()
