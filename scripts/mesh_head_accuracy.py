"""Where XSpecMesh heads miss: per-head top-1 accuracy split by the BPT kind of the token they predict.

    python scripts/mesh_head_accuracy.py runs/xspecmesh-ca-small/labels.safetensors --heads xspecmesh-ca-small

Reads the held-out label sequences of a `train-heads` run (the backbone's own samples: the last
`--sequences` rows), runs the backbone (its heads' LoRA adapter merged) teacher-forced over them and
applies each head d to every hidden row, as training does: head d at row i predicts token i + d.
For each kind of target token (block, offset, special block, EOS; `mesh/tokenizers.py`) it
prints the kind's share of positions, the head's accuracy against the label, and the backbone's
mean top probability at that position given the true prefix (what an oracle head would be accepted
with under `p > delta`). A head whose accuracy sits far below the backbone's confidence on a kind
is where SCR is lost.
"""

from __future__ import annotations

import argparse

import torch

from specgen.decoding.sampling import SamplingParams, logits_to_probs
from specgen.eval.mesh_labels import held_out
from specgen.mesh.tokenizers import BPTTokenizer

#: Names of `BPTTokenizer.kinds` codes.
KINDS = {0: "block", 1: "offset", 2: "special", 3: "eos"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("labels", help="labels.safetensors of a train-heads run")
    ap.add_argument("--heads", default="xspecmesh-ca-tiny")
    ap.add_argument("--sequences", type=int, default=32, help="last N label rows (a run's held-out ones)")
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--top-p", type=float, default=0.95)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ho = held_out(args.labels, args.heads, args.sequences)
    model, heads, tokens, hidden = ho.model, ho.heads, ho.tokens, ho.hidden  # tokens [S, L], hidden [S, L, dim]
    params = SamplingParams(args.temperature, args.top_k, args.top_p)
    with torch.inference_mode():
        logits = ho.logits  # [S, L, V]
        top = logits_to_probs(logits.flatten(0, 1), params).amax(-1).view(tokens.shape)  # [S, L]
        kinds = torch.from_numpy(BPTTokenizer().kinds(tokens.numpy().ravel())).view(tokens.shape)  # [S, L], -1 = pad
        kv = heads.context_kv(ho.cond)
        print(f"{args.heads} on {len(tokens)} held-out label sequences ({int((tokens >= 0).sum())} tokens)")
        print("head  target    share  head acc  backbone top-p")
        for d in range(1, heads.num_heads + 1):
            rows = tokens.shape[1] - d
            feats = heads.head_features(d - 1, hidden[:, :rows], kv[d - 1])  # [S, L-d, dim]
            hit = model.decoder.output(feats).argmax(-1) == tokens[:, d:]  # [S, L-d]
            target, kind_of, conf = tokens[:, d:], kinds[:, d:], top[:, d:]
            real = target >= 0
            for code, kind in KINDS.items():
                m = real & (kind_of == code)
                if m.any():
                    print(f"{d:4d}  {kind:8s} {float(m.sum() / real.sum()):5.2f}  {float(hit[m].float().mean()):8.3f}"
                          f"  {float(conf[m].mean()):14.2f}")
            print(f"{d:4d}  all      1.00  {float(hit[real].float().mean()):8.3f}  {float(conf[real].mean()):14.2f}")


if __name__ == "__main__":
    main()
