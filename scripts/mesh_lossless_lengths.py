"""Does lossless XSpecMesh sample the backbone's meshes? Mesh lengths over many seeds, against AR, on real models.

    python scripts/mesh_lossless_lengths.py --heads xspecmesh-ca-tiny --clouds 3 --samples 150

The unit test (`tests/mesh/test_mesh_xspecmesh_lossless.py`) checks the exact joint of the first tokens on a
random model. This checks a whole-mesh statistic on trained models: for each of `--clouds` test point
clouds, `--samples` meshes from AR on the backbone the heads load (their LoRA merged) and from XSpecMesh
with argmax + vertex-lookup candidates under each rule; it prints mean and standard deviation of the
token count and a two-sample Kolmogorov-Smirnov p-value against AR. Rejection sampling should be
indistinguishable from AR (large p); the paper's p > delta rule need not be. One mesh's length varies a
lot between seeds (the shapes differ), which is why a 32-mesh benchmark's `mean_tokens` is only a
rough comparison between rows.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from scipy.stats import ks_2samp

from specgen.decoding.sampling import SamplingParams
from specgen.eval.mesh_bench import benchmark_clouds
from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions, load_mesh

RULES = {"rejection": {"criterion": "rejection"}, "p>0.5": {"criterion": "threshold", "delta": 0.5}}


def lengths(decoder: MeshDecoder, pc: torch.Tensor, params: SamplingParams, opts: XSpecMeshOptions | None,
            samples: int, budget: int) -> list[int]:
    """Token counts of `samples` meshes decoded with seeds 0 .. samples - 1 (draft stream: its own seeds)."""
    return [len(decoder.generate_batch([pc], params, budget, opts, [torch.Generator().manual_seed(s)],
                                       [torch.Generator().manual_seed(10**6 + s)])[0].tokens) for s in range(samples)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="backbone (default: the heads' parent)")
    ap.add_argument("--heads", default="xspecmesh-ca-tiny")
    ap.add_argument("--clouds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=150)
    ap.add_argument("--budget", type=int, default=500)
    args = ap.parse_args()
    torch.set_num_threads(1)
    loaded = load_mesh(args.model, args.heads)
    ar = MeshDecoder(loaded.decoder.model, None, loaded.decoder.eos_id)  # the same merged weights, no heads
    params = SamplingParams(0.5, 50, 0.95)
    print(f"{loaded.target.ref} + {args.heads}: {args.samples} meshes per cloud and row, T 0.5 top-k 50 top-p 0.95")
    for i, (_, pc) in enumerate(benchmark_clouds(loaded.target.meta, args.clouds)):
        base = lengths(ar, pc, params, None, args.samples, args.budget)
        line = [f"cloud {i}: AR {np.mean(base):.1f} +- {np.std(base):.1f}"]
        for name, rule in RULES.items():
            opts = XSpecMeshOptions(heads=args.heads, sampling="tree", top_k_tree=1, vertex_lookup=True, **rule)
            got = lengths(loaded.decoder, pc, params, opts, args.samples, args.budget)
            line.append(f"{name} {np.mean(got):.1f} +- {np.std(got):.1f} (KS p {ks_2samp(base, got).pvalue:.3f})")
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
