"""Host syncs per decode step on a CUDA device: how often the loop makes the host wait for the GPU, and where.

Two kinds are counted for each case (a method, a batch size, a temperature), per decode step:
- implicit: every synchronising CUDA operation the step runs (a device-to-host read: `.tolist()`, `.item()`,
  `bool(t)`, a data-dependent shape), made visible by `torch.cuda.set_sync_debug_mode("warn")`; each is charged to
  the innermost `specgen/` source line on the stack, so the table names the lines;
- explicit: waits for the device's queue on purpose (`devices.synchronize`, behind `devices.now`): the decode loop
  makes them at its start and at each row's end; its phase clock reads the host time and never waits. A wait for an
  event mid-queue counts here too (a tree step waits for its growth's end to time the drafter, while the verify
  queued behind it runs on: no idle device).

An accept rule must read something of the verify logits on the host (greedy: the argmax of every row; rejection
sampling: the probabilities along the draft), so the floor for a lossless method is one implicit sync a step (`ar`
run_ahead K, and the trees' and the mesh chain's: one per K greedy steps, which their step is).
A host-to-device copy of a plain host tensor also waits (pageable memory); the loop's go through
`devices.host_tensor` / `to_device` (non-blocking). Run on a CUDA machine: `python scripts/gpu_sync_count.py`
(logs: docs/logs/gpu/).

Also counted: eager ops a step, each a kernel launch or a host tensor op the step runs outside its captured graphs
(a graph's replay runs none through the dispatcher). With `--device cpu` the captured steps run through the CPU
replay emulation of tests/models/test_graphs.py (each step traced once, replays not counted), so the count is what a
GPU step would launch besides its graphs; its syncs read 0 there. There the kernels inside the graphs a step
replays are counted too (`cuda_kernels`: each graph traced with the CUDA path's ops); the first line counts them in a
SmolLM2-shape bf16 AR step. `replays/step` counts the captured steps run (`StepGraphs.run`: a graph launch each on a
GPU, an emulated replay on the CPU; a tree step's drafter work is one, its verify another).
The image trees grow at a GPU's option defaults on any device (31 nodes: `options.gpu_defaults`); the mesh rows are
lossless XSpecMesh's heads, with vertex lookup, and its candidate tree (`gpu_graphs.py`'s mesh goal row). With
`--device cpu` the `host ms/step` column is a step's host work: the time between the loop's refills less the
emulated replays' (`ms_per_step`), what a GPU's host runs while its device idles, and more: the eager ops run on the
CPU there (the greedy read's argmax over the vocabulary, output clones, a commit's moves), which a GPU's host only
launches (docs/LOG.md, session 89: most of a tree step's column).
"""

from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from time import perf_counter as clock  # the host clock of `ms_per_step` (a test moves its own)
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx
from torch.utils._python_dispatch import TorchDispatchMode

import specgen.devices as devices
from specgen.decoding import accept, loop
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.stats import DecodeStats
from specgen.decoding.target import ModelTarget
from specgen.methods import get_method, run_batch, xspecmesh_pool
from specgen.methods.options import MultiBlockOptions, gpu_defaults
from specgen.methods.pcllm import MultiBlockDrafter
from specgen.methods.text import EmptyDrafter, JacobiDrafter, NgramDrafter
from specgen.models import graphs, kernel_choice
from specgen.models.sliced_linear import SlicedLinear
from specgen.models.static_step import StaticInputs, target_step
from specgen.models.transformer import Transformer, TransformerConfig
from specgen.native import cuda_ops
from specgen.request import parse_request

ROOT = str(Path(__file__).resolve().parents[1])
SMALL = TransformerConfig(vocab_size=49152, dim=256, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=768,
                          norm_eps=1e-5, rope_theta=100000.0, max_seq_len=1024, tie_embeddings=True)


@dataclass(frozen=True)
class Count:
    """One case's syncs: decode steps, implicit and explicit syncs, and the implicit ones by source line."""

    steps: int
    implicit: int
    explicit: int
    lines: Counter
    ops: int  # eager ops (launches and host tensor ops) outside graph replays
    kernels: int  # inside the replays (CPU emulation only; 0 on CUDA)
    replays: int = 0  # captured steps run (`StepGraphs.run`: a graph launch each on a GPU)


class SyncCounter:
    """Counts implicit CUDA syncs (sync debug mode warnings) by source line, and explicit `devices.synchronize`."""

    def __enter__(self) -> SyncCounter:
        self.lines, self.explicit = Counter(), 0
        self._sync, self._show = devices.synchronize, warnings.showwarning
        self._filters = warnings.catch_warnings()
        self._filters.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self.on_warning

        def counted(device=None):
            self.explicit += 1
            self._sync(device)

        devices.synchronize = counted  # `devices.now` looks the name up at call time
        self._event_sync = torch.cuda.Event.synchronize

        def event_waited(event):
            self.explicit += 1
            self._event_sync(event)

        torch.cuda.Event.synchronize = event_waited
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def on_warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" not in str(message):
            return self._show(message, category, filename, lineno, file, line)
        ours = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(ROOT + "/specgen/")]
        where = ours[-1] if ours else None
        self.lines[f"{where.filename[len(ROOT) + 1:]}:{where.lineno}" if where else f"{filename}:{lineno}"] += 1

    def __exit__(self, *exc) -> None:
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("default")
        devices.synchronize = self._sync
        torch.cuda.Event.synchronize = self._event_sync
        warnings.showwarning = self._show
        self._filters.__exit__(*exc)


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched outside graph replays (`paused` while the CPU emulation replays one); with
    `by_line` (`--by-op`) each eager op and each replayed graph's kernels by their `specgen/` source line too."""

    paused = False
    kernels = 0  # inside the emulated graphs' replays (`emulate_captures`)
    replay_s = 0.0  # the host time the emulated replays took (their CPU kernels): not a GPU host's work
    by_line: Counter | None = None  # ("eager" | "graph", "file:line op") -> count, when asked for

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not OpCounter.paused:
            self.ops += 1
            if OpCounter.by_line is not None:
                OpCounter.by_line["eager", f"{ours(traceback.extract_stack()[:-1])} {func.__name__}"] += 1
        return func(*args, **(kwargs or {}))


def ours(frames) -> str:
    """The innermost `specgen/` frame of a stack as "file:line" (else "other")."""
    mine = [f for f in frames if f.filename.startswith(ROOT + "/specgen/")]
    return f"{mine[-1].filename[len(ROOT) + 1:]}:{mine[-1].lineno}" if mine else "other"


def emulate_captures() -> None:
    """CPU: captured steps through the tests' replay emulation, its replays not counted as eager ops but as the
    kernels the CUDA path would launch inside each graph (`cuda_kernels`)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the emulation lives in the checkout's tests/
    from tests.models.test_graphs import Traced, traced

    replay = Traced.replay

    def uncounted(self) -> None:
        OpCounter.paused = True
        OpCounter.kernels += self.kernels
        if OpCounter.by_line is not None:
            OpCounter.by_line.update({("graph", line): n for line, n in self.lines.items()})
        t0 = clock()
        try:
            replay(self)
        finally:
            OpCounter.paused = False
            OpCounter.replay_s += clock() - t0

    def counted(steps, step):
        outs, graph = traced(steps, step)  # its warm-up first: lazy initialisations stay real
        graph.lines = Counter()
        graph.kernels = cuda_kernels(step, graph.lines)
        return outs, graph

    Traced.replay = uncounted
    graphs.StepGraphs.captured = counted
    # lossless XSpecMesh's greedy steps as a GPU runs them: the heads' next candidates read with the verdict's picks
    xspecmesh_pool.ONE_READ = xspecmesh_pool.ONE_READ | {"cpu"}
    # a sampled judge's walk as a GPU runs it: every row's walk at once, in the target's graphs
    accept.HOST_WALK = frozenset()


def cuda_kernels(step, lines: Counter | None = None) -> int:
    """The kernels a CUDA graph of `step` holds, counted on any device from a trace through the ops' fake kernels with
    the CUDA path's choices: RoPE with the cache writes and the SwiGLU gate as one op each, the Triton kernels, norms
    and products one launch each, the attention plan two (cuda_ops.attention_plan); `lines` gets them by source line."""
    one_pass = lambda x: cuda_ops.available()  # noqa: E731  as on CUDA (SPECGEN_NATIVE=0: torch's ops)
    with torch.inference_mode(), mock.patch.object(kernel_choice, "one_pass", one_pass), \
            FakeTensorMode(allow_non_fake_inputs=True):
        traced = make_fx(step if lines is None else lambda: Lines(lines).run(step))()
    ops = [str(n.target) for n in traced.graph.nodes if n.op == "call_function"]
    return sum(kernels_of(op) for op in ops)


def kernels_of(op: str) -> int:
    """The launches of one traced op on CUDA ("aten.NAME.overload", a specgen op, getitem): none for a view, an
    allocation or a tuple's item, two for the attention plan, else one. By the op's name, not a part of it
    (`index_select` and `slice_scatter` launch: a rule by substring counted them views)."""
    name = op.split(".")[1] if op.startswith("aten.") else op
    return (1 + ("attention_plan" in op)) * (name not in VIEWS and "getitem" not in op)


class Lines(TorchDispatchMode):
    """Inside a trace: the launches (`kernels_of`) of the nodes each op adds to it, by the op's innermost `specgen/`
    source line, into `lines`."""

    def __init__(self, lines: Counter) -> None:
        super().__init__()
        self.lines = lines

    def run(self, step):
        with self:
            return step()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        graph = get_proxy_mode().tracer.graph
        before = len(graph.nodes)
        out = func(*args, **(kwargs or {}))
        for node in [n for n in list(graph.nodes)[before:] if n.op == "call_function"]:  # what the trace recorded
            if n := kernels_of(str(node.target)):
                self.lines[f"{ours(traceback.extract_stack()[:-1])} {node.target}"] += n
        return out


def capture(*models) -> None:
    """Captured steps as a loader attaches them on CUDA; on the CPU, the emulation's (`emulate_captures`)."""
    for model in models:
        cpu = next(model.parameters()).device.type == "cpu"
        graphs.attach(model, "on" if cpu else "auto", capture=True if cpu else None)


def count(run, by_line: bool = False) -> Count:
    """Run `run()` (returns DecodeStats) once to warm up, then again under the counters."""
    run()
    OpCounter.kernels, OpCounter.by_line = 0, Counter() if by_line else None
    replays, step_run = Counter(), graphs.StepGraphs.run

    def counted_run(self, *args):
        replays["n"] += 1
        return step_run(self, *args)

    with mock.patch.object(graphs.StepGraphs, "run", counted_run), SyncCounter() as c, OpCounter() as o:
        stats = run()
    return Count(stats.steps, sum(c.lines.values()), c.explicit, c.lines, o.ops, OpCounter.kernels, replays["n"])


def ms_per_step(run, device: str, rounds: int = 3) -> tuple[float, float | None]:
    """Medians over `rounds` runs of `run()` (returns DecodeStats): wall ms a decode step (the device waited for at
    both ends) and, on the CPU, a step's host work: the time from one `Batch.refill` to the next (a step: plan,
    verify, settle, commit, emit; no prefill) less what the emulated replays took inside them. What is left is the
    loop's Python and the ops it runs outside its graphs (run here; a GPU's host launches them), which a GPU's host
    runs while the device idles between a step's read and its next replay (a replay's own launch, ~10-30 us there,
    is not in it); None on CUDA."""
    walls, hosts = [], []
    for _ in range(rounds):
        span = {"steps": 0, "s": 0.0, "out": None, "replay": 0.0}
        refill = loop.Batch.refill

        def timed_refill(batch):
            if span["out"] is not None:  # a step ran since the last refill returned
                span["steps"] += 1
                span["s"] += clock() - span["out"] - (OpCounter.replay_s - span["replay"])
            ok = refill(batch)
            span["out"], span["replay"] = clock(), OpCounter.replay_s
            return ok

        with mock.patch.object(loop.Batch, "refill", timed_refill):
            t0 = devices.now(device)
            stats = run()
            walls.append(1e3 * (devices.now(device) - t0) / max(stats.steps, 1))
        hosts.append(1e3 * span["s"] / max(stats.steps, span["steps"], 1))  # a decode step's (run_ahead: K a loop step)
    mid = rounds // 2
    return sorted(walls)[mid], None if "cuda" in device else sorted(hosts)[mid]


def text_cases(device: str) -> dict:
    torch.manual_seed(0)
    model = Transformer(SMALL).to(device).eval()
    capture(model)
    target = ModelTarget(model)
    target.device = device
    g = torch.Generator().manual_seed(0)
    base = torch.randint(0, SMALL.vocab_size, (24,), generator=g).tolist()
    prompts = [base * 3 + base[: 5 + i] for i in range(8)]  # repeats: the n-gram drafter finds matches

    def run(make, b: int, temperature: float):
        params = SamplingParams(temperature)
        gens = [torch.Generator().manual_seed(i) for i in range(b)]
        return lambda: run_batch(target, lambda i: make(), prompts[:b], 48, params, generators=gens).stats

    return {"text ar B1 T0": run(EmptyDrafter, 1, 0.0), "text ar B4 T0": run(EmptyDrafter, 4, 0.0),
            "text ar run_ahead 8 B1 T0": run(lambda: EmptyDrafter(8), 1, 0.0),
            "text ar B1 T1": run(EmptyDrafter, 1, 1.0),
            "text ar run_ahead 8 B1 T1": run(lambda: EmptyDrafter(8), 1, 1.0),
            "text ngram B1 T0": run(NgramDrafter, 1, 0.0),
            "text ngram B4 T1": run(NgramDrafter, 4, 1.0), "text jacobi B1 T0": run(JacobiDrafter, 1, 0.0),
            "text pcllm-mr B1 T0": run(lambda: MultiBlockDrafter(MultiBlockOptions(block_size=4, num_blocks=1,
                                                                                   lookup=16)), 1, 0.0)}


def mesh_cases(device: str) -> dict:
    from specgen.eval.mesh_bench import benchmark_clouds
    from specgen.generate.mesh import load_mesh_model
    from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions
    from gpu_graphs import MESH_TREE  # a script beside this one (this folder is on the path when run)

    loaded = load_mesh_model(heads="xspecmesh-ca-tiny", device=device)
    dec = loaded.decoder
    capture(dec.model.decoder, dec.heads)
    clouds = [pc for _, pc in benchmark_clouds(loaded.target.meta, 1, 0, device)]
    lossless = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1)
    vertex = replace(lossless, vertex_lookup=True)  # gpu_graphs.py's mesh rows: the chain, then issue 46's goal row

    def run(decoder: MeshDecoder, opts: XSpecMeshOptions = lossless):
        def go():
            results = decoder.generate_batch(clouds, SamplingParams(), 128, opts)
            return DecodeStats(steps=sum(r.stats.steps for r in results))

        return go

    return {"mesh ar B1 T0": run(MeshDecoder(dec.model, None, dec.eos_id)), "mesh xspecmesh B1 T0": run(dec),
            "mesh xspecmesh vertex B1 T0": run(dec, vertex),
            "mesh xspecmesh tree B1 T0": run(dec, replace(vertex, candidate_tree=MESH_TREE)),
            # last: its steps' key mask stays in the backbone's static buffers, which later captures would read
            "mesh xspecmesh vertex run_ahead 4 B1 T0": run(dec, replace(vertex, run_ahead=4))}


def image_cases(device: str) -> dict:
    from specgen.generate.image import ImageGenConfig, generate_images, load_image_model

    im = load_image_model("tiny-image-gpt", device=device)
    capture(im.model, im.drafter_net)

    def run(method: str, b: int, temperature: float, ahead: int = 1):  # the trees a GPU grows: its option defaults
        cfg = ImageGenConfig(method=method, num=b, temperature=temperature, batch_size=b, device=device,
                             method_options=gpu_defaults(get_method(method).options_type) | {"run_ahead": ahead})

        def go():
            samples, _ = generate_images(im, parse_request(cfg, "image"))
            return DecodeStats(steps=max(s.stats.steps for s in samples))  # rows start together: the longest

        return go

    return {"image ar B1 T0": run("ar", 1, 0.0), "image adt-tree B1 T0": run("adt-tree", 1, 0.0),
            "image adt-tree B4 T0": run("adt-tree", 4, 0.0), "image eagle2 B1 T0": run("eagle2", 1, 0.0),
            "image eagle2 B1 T1": run("eagle2", 1, 1.0),  # T 0: issue 46's goal rows; T 1: sampling's reads
            "image adt-tree run_ahead 4 B1 T0": run("adt-tree", 1, 0.0, 4),  # a host read each 4 tree steps
            "image eagle2 run_ahead 4 B1 T0": run("eagle2", 1, 0.0, 4),
            "image eagle2 run_ahead 4 B1 T1": run("eagle2", 1, 1.0, 4)}  # sampled: the walk inside `advance`


VIEWS = frozenset({"view", "_unsafe_view", "view_as", "slice", "transpose", "expand", "expand_as", "unsqueeze",
                   "squeeze", "select", "t", "permute", "split", "split_with_sizes", "alias", "unbind", "reshape",
                   "_reshape_alias", "detach", "detach_", "empty", "empty_like", "new_empty", "empty_strided",
                   "as_strided"})  # aten ops that launch no kernel: a view or an allocation


def graph_kernels(device: str, cfg: TransformerConfig | None = None) -> tuple[int, int]:
    """(kernels, layers) of one captured bf16 AR step of the SmolLM2 shape at 200 filled slots (`cuda_kernels`), on the
    CPU with the GPU's product layout (SlicedLinear) and the kernels `SPECGEN_NATIVE` chooses."""
    from gpu_graphs import SMOLLM2  # a script beside this one (this folder is on the path when run)

    cfg = cfg or SMOLLM2
    model = Transformer(cfg).to(device, torch.bfloat16).eval()
    for lin in model.modules():
        if type(lin) is torch.nn.Linear:
            lin.__class__ = SlicedLinear
    steps = graphs.attach(model, "on", capture=False)
    steps.new_cache(1, 300)
    b = steps.bucket(1, 1, 200)  # the bucket an AR step at 200 slots replays (padded to a whole product slice)
    x = StaticInputs.for_bucket(b, device)
    x.meta[0, 0] = 200
    return cuda_kernels(lambda: target_step(model, x, steps.k, steps.v, None, b.width)), cfg.n_layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--top", type=int, default=4, help="source lines shown per case")
    ap.add_argument("--by-op", metavar="CASE", help="only this case, its eager ops and graph kernels a step by source "
                    "line and op (--device cpu)")
    args = ap.parse_args()
    gpu = torch.cuda.get_device_name(args.device) if "cuda" in args.device else args.device
    if "cuda" not in args.device:
        emulate_captures()
        gpu += " (captured steps emulated)"
    print(f"device {gpu}, torch {torch.__version__}")
    kernels, layers = graph_kernels(args.device)
    print(f"kernels inside a captured bf16 AR step, SmolLM2 shape: {kernels} ({kernels / layers:.1f} a layer)")
    if not args.by_op:
        print(f"{'case':<28} {'steps':>5} {'implicit/step':>13} {'explicit/step':>13} {'ops/step':>8} "
              f"{'replays/step':>12} {'graph kernels/step':>18} {'ms/step':>8} {'host ms/step':>12}  "
              "top implicit lines (per step)")
    for cases in (text_cases, image_cases, mesh_cases):  # a suite's rows printed before the next one loads
        for name, run in cases(args.device).items():
            if args.by_op not in (None, name):
                continue
            c = count(run, args.by_op is not None)
            if args.by_op:
                return by_op(OpCounter.by_line, max(c.steps, 1))
            steps = max(c.steps, 1)
            ms, host_ms = ms_per_step(run, args.device)
            host = "-" if host_ms is None else f"{host_ms:.2f}"
            top = ", ".join(f"{line} {n / steps:.2f}" for line, n in c.lines.most_common(args.top))
            kernels = f"{c.kernels / steps:.0f}" if c.kernels else "-"
            print(f"{name:<28} {c.steps:>5} {c.implicit / steps:>13.2f} {c.explicit / steps:>13.2f} "
                  f"{c.ops / steps:>8.0f} {c.replays / steps:>12.2f} {kernels:>18} {ms:>8.2f} {host:>12}  {top}",
                  flush=True)
    if args.by_op:
        raise SystemExit(f"--by-op {args.by_op!r}: no such case (the table's first column names them)")


def by_op(lines: Counter, steps: int) -> None:
    """One case's eager ops and graph kernels a step, each by source line and op, most first."""
    for kind in ("eager", "graph"):
        mine = Counter({line: n for (k, line), n in lines.items() if k == kind})
        print(f"{kind}: {sum(mine.values()) / steps:.1f} a step")
        for line, n in mine.most_common():
            print(f"  {n / steps:7.2f}  {line}")


if __name__ == "__main__":
    main()
