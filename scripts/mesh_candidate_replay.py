"""Which candidate source would XSpecMesh accept most? Algorithm 1 replayed over held-out label sequences.

    python scripts/mesh_candidate_replay.py runs/xspecmesh-ca-small/labels.safetensors --heads xspecmesh-ca-small

The label sequences are the backbone's own samples (the last `--sequences` rows of a `train-heads` run's
labels). One teacher-forced pass gives every hidden row, the heads' argmax at every row and the
backbone's top probability under the sampling filter. The replay walks each sequence like the decoding
loop: at position i (x_i already sampled) it asks a candidate source for D tokens and accepts them while
a candidate equals the label and the backbone's top probability there exceeds delta, then resumes at the
first rejected position. This approximates the real rule (a candidate the backbone likes but which is
not the label would be accepted and change the sequence; the benchmark measures that), cheaply and with
every source seeing the same sequences:

  heads   the heads' argmaxes (PTS K_s = 1)
  ngram   n-gram lookup (n = 1) over the sequence so far, heads filling the rest (`lookup: 1`)
  vertex  offsets of known blocks from the sequence so far, heads elsewhere (`vertex_lookup: true`)
"""

from __future__ import annotations

import argparse
from typing import Callable

import torch

from specgen.decoding.sampling import SamplingParams, logits_to_probs
from specgen.eval.mesh_labels import held_out
from specgen.mesh.vertex_lookup import VertexMemory
from specgen.methods.text import lookup

Source = Callable[[list[int], int, list[int], int], list[int]]  # (sequence, i, head tokens at row i, D) -> candidates


def heads_only(seq: list[int], i: int, heads: list[int], d: int) -> list[int]:
    return heads[:d]


def ngram(seq: list[int], i: int, heads: list[int], d: int) -> list[int]:
    found = lookup(seq[: i + 1], d, 1, 1)
    return found + heads[len(found) : d]


def vertex(seq: list[int], i: int, heads: list[int], d: int) -> list[int]:
    memory = VertexMemory()
    memory.read(seq[: i + 1])
    return memory.propose(seq[i], lambda: heads, d)


SOURCES: dict[str, Source] = {"heads": heads_only, "ngram": ngram, "vertex": vertex}


def replay(seq: list[int], heads: list[list[int]], confident: list[bool], source: Source, d: int) -> int:
    """Decoding steps Algorithm 1 takes over seq when candidate j passes iff it is the label and confident."""
    steps, i = 0, 0
    while i < len(seq):
        cands = source(seq, i, heads[i], d)
        a = 0
        while a < len(cands) and i + 1 + a < len(seq) and cands[a] == seq[i + 1 + a] and confident[i + 1 + a]:
            a += 1
        i, steps = i + 1 + a, steps + 1
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("labels", help="labels.safetensors of a train-heads run")
    ap.add_argument("--heads", default="xspecmesh-ca-tiny")
    ap.add_argument("--sequences", type=int, default=32, help="last N label rows (a run's held-out ones)")
    ap.add_argument("--depths", default="1,2,4")
    ap.add_argument("--delta", type=float, default=0.5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ho = held_out(args.labels, args.heads, args.sequences)
    model, heads, tokens, hidden = ho.model, ho.heads, ho.tokens, ho.hidden  # tokens [S, L], hidden [S, L, dim]
    with torch.inference_mode():
        probs = logits_to_probs(ho.logits.flatten(0, 1), SamplingParams(0.5, 50, 0.95))  # [S*L, V]
        confident = (probs.amax(-1) > args.delta).view(tokens.shape)  # [S, L]
        kv = heads.context_kv(ho.cond)
        guesses = torch.stack([model.decoder.output(heads.head_features(k, hidden, kv[k])).argmax(-1)
                               for k in range(heads.num_heads)], -1)  # [S, L, D]: head k+1 at row i -> token i+k+1
    seqs = [row[row >= 0].tolist() for row in tokens]
    total = sum(len(s) for s in seqs)
    print(f"{args.heads} on {len(seqs)} held-out label sequences ({total} tokens), delta {args.delta}")
    for d in (int(x) for x in args.depths.split(",")):
        scr = {name: total / sum(replay(s, guesses[n].tolist(), confident[n].tolist(), src, d) for n, s in enumerate(seqs))
               for name, src in SOURCES.items()}
        print(f"D={d}  " + "  ".join(f"{name} SCR {v:.3f}" for name, v in scr.items()))


if __name__ == "__main__":
    main()
