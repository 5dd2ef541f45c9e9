"""Ceiling of XSpecMesh's wall-clock speedup on this machine: Algorithm 1 fed perfect candidates.

    python scripts/mesh_oracle_speed.py --meshes 12 --depths 1,2,3,4

Greedy decoding (T = 0) makes the AR output of each test point cloud a fixed sequence. The oracle
decoder is XSpecMesh's own loop (same verify, accept, commit and KV cache; `MeshDecoder`) whose
candidates are the next D tokens of that sequence instead of the heads' guesses, so every step
accepts all D and SCR = D + 1 up to the end of the mesh. Its tokens are checked to equal AR's. The
ratio of its tokens/s to AR's, measured in one process with the runs interleaved per mesh, is the
most any drafter can gain here at that D: what remains is the cost of verifying D + 1 tokens in one
forward plus the per-token work (LM head rows, filtering, sampling) that speculation cannot remove.
AR runs on the same LoRA-merged backbone, so both sides do identical arithmetic per token.
"""

from __future__ import annotations

import argparse
import time

import torch

from specgen.decoding.sampling import SamplingParams
from specgen.eval.mesh_bench import benchmark_clouds
from specgen.generate.mesh import token_budget
from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions, load_mesh
from specgen.methods.xspecmesh_pool import Proposal


class OracleDecoder(MeshDecoder):
    """MeshDecoder whose candidates x_{s*+1 .. s*+D} are read from a known sequence."""

    reference: list[int] = []

    def _candidates(self, out, x, heads, d, opts, memory=None) -> Proposal:
        n = len(out) + 1  # committed tokens + x_{s*}
        tokens = self.reference[n : n + d]
        return Proposal(tokens, [1.0] * len(tokens))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", default="xspecmesh-ca-tiny", help="heads whose LoRA-merged backbone is decoded")
    ap.add_argument("--meshes", type=int, default=12, help="test-split point clouds")
    ap.add_argument("--depths", default="1,2,3,4")
    ap.add_argument("--repeats", type=int, default=2, help="timed passes after one warm-up pass")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_mesh(None, args.heads)
    model, heads = loaded.decoder.model, loaded.decoder.heads
    eos = loaded.decoder.eos_id
    ar, oracle = MeshDecoder(model, None, eos), OracleDecoder(model, heads, eos)
    greedy = SamplingParams(0.0)
    depths = [int(d) for d in args.depths.split(",")]
    max_tokens = token_budget(loaded, max(depths))
    pcs = [pc for _, pc in benchmark_clouds(loaded.target.meta, args.meshes)]
    refs = [ar.generate_batch([pc], greedy, max_tokens)[0].tokens for pc in pcs]
    acc = {d: [0, 0.0, 0] for d in [0, *depths]}  # D -> tokens, seconds, steps
    for rep in range(args.repeats + 1):
        for pc, ref in zip(pcs, refs):
            oracle.reference = ref
            for d in acc:
                t0 = time.perf_counter()
                res = (ar.generate_batch([pc], greedy, max_tokens) if d == 0 else oracle.generate_batch(
                    [pc], greedy, max_tokens, XSpecMeshOptions(heads=args.heads, num_heads=d)))[0]
                dt = time.perf_counter() - t0
                if res.tokens != ref:
                    raise SystemExit(f"D={d}: oracle output differs from greedy AR")
                if rep:  # the first pass warms up
                    acc[d][0] += len(res.tokens)
                    acc[d][1] += dt
                    acc[d][2] += res.stats.steps
    base = acc[0][0] / acc[0][1]
    print(f"{args.meshes} test meshes, greedy, {args.threads} thread(s), mean {acc[0][0] / args.repeats / args.meshes:.0f} tokens")
    print("D  SCR    ms/step  speedup vs AR (perfect candidates)")
    for d, (n, t, s) in acc.items():
        print(f"{d}  {n / s:5.3f}  {t / s * 1e3:6.2f}   {n / t / base:5.2f}x")


if __name__ == "__main__":
    main()
