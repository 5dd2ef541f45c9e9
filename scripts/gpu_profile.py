"""Where a captured decode step's time goes on a GPU: the profiler's kernels, per step, for each case.

Cases (greedy, graphs on, each run once to capture and once under `torch.profiler`):
- text AR at batch 1 and at batch 16: SmolLM2-135M's shape, random weights, bfloat16 (gpu_graphs.py's text rows),
  short prompts so the eager prefills stay a small part;
  pcllm-mr at batch 1 (1.45x AR at the sixth lease on a step that holds AR's kernels: host time or GPU time?);
- image AR, ADT-Tree and EAGLE-2 at batch 1: the shipped tiny c2i GPT and its EAGLE drafter, T 0 (gpu_graphs.py's
  image rows);
- mesh AR and lossless XSpecMesh (vertex lookup, as a chain and as the candidate tree `MESH_TREE`) at batch 1: the
  shipped tiny mesh model and its heads (gpu_graphs.py's mesh rows); then each one's prefill alone (a mesh a "step").

For each: wall ms a decode step (under the profiler, whose host-side tracing inflates it: gpu_graphs.py's rows give
the wall time), GPU ms a step (the kernels' summed time, prefills included), kernels a step, the host's ms a step
blocked on the device (its synchronising CUDA calls: the rest of the wall is host work, during which the device idles
unless work is queued), replays a step and the host's ms launching them, the top kernels by their time (calls a
step, µs a call), and the top Python functions by their own time a step in a third run under cProfile (the host's
work, by function), and the ms a step of the same replays launched back to back with no host work between them
(`replays_alone`: each graph the run replayed, as often; the floor of a step whose host work left the device's
critical path, kernels and their gaps inside a graph). What it answers: which kernels grow from batch 1 to 16
(issue 46's batch-16 goal), how a tree step's time splits between the drafter's growth and the verify, whether a step
is bound by its kernels or by its host work (and there, by launching its replays or by the loop's own work), and what
a step would cost with its host work off the critical path (the case for device-side accept and commit).

Run: `python scripts/gpu_profile.py` on a CUDA machine (~1 minute; `gpu_check.sh`'s `profile` step; `--only image,mesh`
runs those suites); `--device cpu` checks the script (CPU op times, tiny shapes, the captures through the tests'
replay emulation; measures nothing).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import functools
import pstats
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gpu_graphs import MESH_TREE, SMOLLM2, prompts_of  # a script beside this one (this folder is on the path when run)
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.devices import synchronize
from specgen.methods import run_batch
from specgen.methods.options import MultiBlockOptions
from specgen.methods.pcllm import MultiBlockDrafter
from specgen.methods.text import EmptyDrafter
from specgen.models import graphs
from specgen.models.sliced_linear import row_invariant
from specgen.models.transformer import Transformer


def profiled(run, device: str, models) -> tuple[float, int, list, pstats.Stats, float | None, int]:
    """(wall seconds, decode steps, the profiler's per-kernel averages, a third run's Python functions under
    cProfile, `replays_alone`'s ms a step, the prompt chunks the profiled run replayed) of `run()` (returns
    DecodeStats), after a first run that captures every shape it meets; `models`: those whose captured steps the run
    replays. The profiler's kernels hold the prompts' prefills (captured chunks); `replays_alone` the steps' alone."""
    run()
    owners = [m.graphs for m in models if m.graphs is not None]
    before = [Counter(g.uses) for g in owners]
    chunks = lambda: sum(g.prompts.replays for g in owners if g.prompts is not None)  # noqa: E731
    chunks_before = chunks()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    synchronize(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        stats = run()
        synchronize(device)
        wall = time.perf_counter() - t0
    replayed = [(g.graphs[key][1], n) for g, b in zip(owners, before) for key, n in (g.uses - b).items()
                if g.graphs.get(key, (None, None))[1] is not None]  # a key's graph and its replays in the run
    prompt_chunks = chunks() - chunks_before
    python = cProfile.Profile()
    python.runcall(run)
    steps = max(stats.steps, 1)
    return (wall, steps, list(prof.key_averages()), pstats.Stats(python), replays_alone(replayed, steps, device),
            prompt_chunks)


def replays_alone(replayed: list[tuple[object, int]], steps: int, device: str) -> float | None:
    """ms a decode step of a run's replays (graph, times replayed in the run) launched back to back with no host work
    between them, each graph its run's times in turn: a step's kernels and the gaps inside and between its graphs,
    the floor of a step whose host work left the device's critical path. The inputs are the last ones staged (the
    shapes, hence the kernels, are the bucket's). None where nothing was captured."""
    if not replayed:
        return None
    synchronize(device)
    t0 = time.perf_counter()
    with torch.inference_mode():  # as the loop replays them (the CPU emulation's traced ops would track gradients)
        for graph, times in replayed:
            for _ in range(times):
                graph.replay()
    synchronize(device)
    return 1e3 * (time.perf_counter() - t0) / steps


#: the CUDA runtime calls in which the host waits for the device (a read of a result, an explicit synchronize)
BLOCKING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def report(name: str, wall: float, steps: int, events: list, python: pstats.Stats, alone: float | None,
           prompt_chunks: int, device: str, top: int) -> None:
    """One case's lines: the step's wall and kernel time, its `top` kernels, then its `top` Python functions by
    their own time (cProfile's, which its tracing inflates: their order says where a host-bound step goes)."""
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    kernels = [e for e in events if getattr(e, key, 0) > 0 and (device != "cuda" or e.device_type.name == "CUDA")]
    busy = sum(getattr(e, key) for e in kernels) / 1e3 / steps  # ms a step
    calls = sum(e.count for e in kernels) / steps
    host = {e.key: e for e in events if e.device_type.name == "CPU"}
    blocked = sum(host[k].self_cpu_time_total for k in BLOCKING if k in host) / 1e3 / steps
    launch = host.get("cudaGraphLaunch")  # a replay's launch: host time that may grow with the graph's kernels
    replays, launching = (launch.count / steps, launch.self_cpu_time_total / 1e3 / steps) if launch else (0.0, 0.0)
    print(f"\n{name}: {steps} steps, wall {1e3 * wall / steps:.3f} ms a step, kernels {busy:.3f} ms a step "
          f"({calls:.0f} a step), host blocked {blocked:.3f} ms a step, {replays:.1f} replays a step "
          f"(launching them {launching:.3f} ms; {prompt_chunks} prompt chunks in all), "
          f"replays alone {'-' if alone is None else f'{alone:.3f}'} ms a step")
    print(f"  {'kernel':<70} {'calls/step':>10} {'us/call':>8} {'share':>6}")
    for e in sorted(kernels, key=lambda e: -getattr(e, key))[:top]:
        t = getattr(e, key)
        print(f"  {e.key[:70]:<70} {e.count / steps:>10.1f} {t / max(e.count, 1):>8.2f} "
              f"{t / 1e3 / steps / max(busy, 1e-9):>6.2f}")
    own = sorted(python.stats.items(), key=lambda item: -item[1][2])[:top]  # (file, line, name) -> (.., calls, own s)
    print(f"  {'python function (own time)':<70} {'calls/step':>10} {'ms/step':>8}")
    for (file, line, func), (_, calls, own_s, _, _) in own:
        where = f"{Path(file).name}:{line}({func})" if line else func
        print(f"  {where[:70]:<70} {calls / steps:>10.1f} {1e3 * own_s / steps:>8.3f}")


def text_cases(device: str, top: int, new: int) -> None:
    cfg = SMOLLM2 if device == "cuda" else dataclasses.replace(SMOLLM2, n_layers=2, vocab_size=512)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32  # the CPU's bf16 products are slow, and it checks
    model = row_invariant(Transformer(cfg).to(device, dtype).eval())  # only the script: as a loader lays it out
    target = ModelTarget(model)
    target.device = device
    short = [p[:32] for p in prompts_of(16, cfg.vocab_size, seed=1)]  # 32-token prompts: the steps dominate
    mr = lambda: MultiBlockDrafter(MultiBlockOptions(block_size=4, num_blocks=1, lookup=16))  # noqa: E731
    for name, make, b in (("AR", EmptyDrafter, 1), ("AR", EmptyDrafter, 16), ("pcllm-mr n 4 + lookup 16", mr, 1)):
        run = lambda: run_batch(target, lambda i: make(), short[:b], new, SamplingParams(),  # noqa: E731
                                batch_size=b).stats
        graphs.attach(model, "on", capture=captures(device))  # captures anew for each case
        report(f"text {name}, batch {b}", *profiled(run, device, [model]), device, top)


def image_case(device: str, top: int) -> None:
    """Image AR, ADT-Tree and EAGLE-2 at batch 1 on one loaded model: their GPU ms a step side by side say whether a
    tree step is bound by its kernels or by the host (gpu_graphs.py's rows give the wall time)."""
    from specgen.generate.image import ImageGenConfig, generate_images, load_image_model
    from specgen.request import parse_request

    im = load_image_model("tiny-image-gpt", device=device)
    for model in (im.model, im.drafter_net):
        graphs.attach(model, "on", capture=captures(device))
    for method, name, ahead in (("ar", "image AR, batch 1", 1), ("adt-tree", "image ADT-Tree, batch 1", 1),
                                ("eagle2", "image EAGLE-2, batch 1", 1),
                                ("eagle2", "image EAGLE-2 (run_ahead 4), batch 1", 4)):  # 4 tree steps a host read
        cfg = ImageGenConfig(method=method, num=2 if device == "cuda" else 1, temperature=0.0, device=device,
                             batch_size=1, method_options={"run_ahead": ahead} if ahead > 1 else {})

        def run(cfg=cfg):
            samples, _ = generate_images(im, parse_request(cfg, "image"))
            return dataclasses.replace(samples[0].stats, steps=sum(s.stats.steps for s in samples))

        report(name, *profiled(run, device, [im.model, im.drafter_net]), device, top)


def mesh_case(device: str, top: int) -> None:
    """Mesh AR and lossless XSpecMesh with vertex lookup at batch 1, as a chain (gpu_graphs.py's goal row) and as a
    candidate tree: what a verify of up to 64 rows costs against AR's one, the heads' kernels inside it (`ReadAhead`:
    one replay a step where the heads' own made two)."""
    from specgen.eval.mesh_bench import benchmark_clouds
    from specgen.generate.mesh import load_mesh_model
    from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions

    loaded = load_mesh_model(heads="xspecmesh-ca-tiny", device=device)
    dec = loaded.decoder
    for model in (dec.model.decoder, dec.heads):
        graphs.attach(model, "on", capture=captures(device))
    clouds = [pc for _, pc in benchmark_clouds(loaded.target.meta, 2, 0, device)]
    chain = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1, vertex_lookup=True)
    tree = dataclasses.replace(chain, candidate_tree=MESH_TREE)
    for decoder, opts, name in (
            (MeshDecoder(dec.model, None, dec.eos_id), chain, "mesh AR, batch 1"),
            (dec, chain, "mesh XSpecMesh (lossless, vertex lookup), batch 1"),
            (dec, tree, f"mesh XSpecMesh (lossless, vertex lookup, candidate tree {MESH_TREE}), batch 1"),
            # last: its key mask stays in the backbone's static buffers (methods/xspecmesh_ahead.py)
            (dec, dataclasses.replace(chain, run_ahead=4),
             "mesh XSpecMesh (lossless, vertex lookup, run_ahead 4), batch 1")):
        def run(decoder=decoder, opts=opts):
            results = decoder.generate_batch(clouds, SamplingParams(), 128 if device == "cuda" else 8, opts)
            return dataclasses.replace(results[0].stats, steps=sum(r.stats.steps for r in results))

        report(name, *profiled(run, device, [dec.model.decoder, dec.heads]), device, top)
    # a mesh's admission alone (one token a mesh: the point encoder, the conditions' K/V, the start, the first read; the
    # heads' conditions for XSpecMesh): ~8-15 ms a mesh on the eighth lease's H200s by its phase, 14-18% of AR's time
    for decoder, name in ((MeshDecoder(dec.model, None, dec.eos_id), "mesh AR's prefill, a step = a mesh"),
                          (dec, "mesh XSpecMesh's prefill, a step = a mesh")):
        def admit(decoder=decoder):
            results = decoder.generate_batch(clouds, SamplingParams(), 1, chain)
            return dataclasses.replace(results[0].stats, steps=len(results))

        report(name, *profiled(admit, device, [dec.model.decoder, dec.heads]), device, top)


def captures(device: str) -> bool | None:
    """`graphs.attach`'s capture: CUDA graphs on CUDA (None: the device's default); elsewhere True, which `main`
    makes the tests' replay emulation (tests/models/test_graphs.py)."""
    return None if device == "cuda" else True


CASES = {"text": text_cases, "image": image_case, "mesh": mesh_case}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--new", type=int, default=64, help="tokens a text row decodes")
    ap.add_argument("--top", type=int, default=12, help="kernels shown a case")
    ap.add_argument("--only", default=",".join(CASES), help="comma-separated suites: " + ", ".join(CASES))
    args = ap.parse_args()
    only = args.only.split(",")
    if not set(only) <= set(CASES):
        raise SystemExit(f"gpu_profile: --only names {sorted(set(only) - set(CASES))}; the suites are {list(CASES)}")
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"device {gpu}, torch {torch.__version__}")
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 stays float32, as in gpu_graphs.py
    if args.device != "cuda":  # the captures through the tests' replay emulation (the checkout's tests/)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.models.test_graphs import traced

        graphs.StepGraphs.captured = traced
    cases = CASES | {"text": functools.partial(text_cases, new=args.new if args.device == "cuda" else 4)}
    for suite, case in cases.items():
        if suite in only:
            case(args.device, args.top)


if __name__ == "__main__":
    main()
