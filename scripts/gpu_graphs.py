"""Captured steps on a GPU: graphs on against graphs off and the peers, in one run, one table (issue 46's rows).

Rows (all greedy, batch 1 unless named):
- text, SmolLM2-135M's shape with random weights (the real file does not travel to a rented GPU), bfloat16: specgen AR
  with `--graphs off` and `on`, n-gram with graphs, transformers eager `generate` and `generate` with its static cache
  under `torch.compile(mode="reduce-overhead")`, AR at batch 16; the GPU's share of a captured step's wall time.
- image, the shipped tiny c2i GPT, float32, T 0, CFG 4: AR with graphs off; AR, EAGLE-2, ADT-Tree with graphs on
  (the drafter's whole tree growth is one replay a step, methods/eagle_grow.py), the trees at a GPU's defaults (31
  nodes: CFG's verify one product slice; EAGLE-2's top-k 3; ADT-Tree's deeper adaptation) and at the earlier ones
  (60 nodes, two slices; top-k 4; ADT-Tree's CPU adaptation), and ADT-Tree at 31 nodes with the CPU's adaptation.
- mesh, the shipped tiny mesh GPT + XSpecMesh heads, float32, T 0: AR and lossless XSpecMesh (criterion=rejection;
  on: the heads' step is a replay too): the heads' chain, with vertex lookup, and with a candidate tree.
Every lossless row reports `exact`: the share of outputs equal to the same run's graphs-off AR, token for token; the
image and mesh rows report `drafter_share` (host time in the propose phase over all phases) and `syncs_step` (host
syncs a decode step, counted in a further, untimed run under CUDA's sync debug mode; 0 in a smoke run). Image and mesh
rows are timed on a second run of the same inputs: the first captures every shape they meet (its time and captures
are reported apart: a one-time cost a process pays); so are the captured text rows, which also give the prompts'
eager prefills apart (`prefill_share`, `decode_tok_s`). Each row carries `t_s`, seconds since the script started.

Run: `python scripts/gpu_graphs.py --json runs/gpu-graphs.json` (on a CUDA machine; ~4 minutes on an H100).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import random
import time
import warnings
from unittest import mock

import torch

from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.devices import synchronize
from specgen.eval.hf_rows import HfCompiled, generate_padded, one_token, timed_static_greedy
from specgen.methods import run_batch
from specgen.methods.options import GPU_DRAFT, MultiBlockOptions, NgramOptions, gpu_defaults
from specgen.methods.pcllm import MultiBlockDrafter
from specgen.methods.text import EmptyDrafter, NgramDrafter
from specgen.models import attention, graphs, sliced_linear, static_step
from specgen.models.sliced_linear import SLICE_ROWS, SlicedLinear, row_invariant
from specgen.models.transformer import Transformer, TransformerConfig, additive_mask

SMOLLM2 = TransformerConfig(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536,
                            norm_eps=1e-5, rope_theta=100000.0, max_seq_len=2048, tie_embeddings=True)
ROWS: list[dict] = []
JSON = {"path": "", "device": ""}  # --json: rewritten at each row (a step its time limit cuts short keeps its rows)
DEADLINE = {"s": 0.0}  # `--deadline`: seconds from the start the caller's time limit allows (0: none)
LAST: list[tuple] = []  # (suite, run) left to the end of a run: the transformers peers compile for a minute or more
AFTER_GOALS: list[tuple] = []  # (suite, run) after the goals' table: rows no goal reads whose compile may run long
T0 = time.perf_counter()
# issue 46's mesh goal row: lossless XSpecMesh with vertex lookup as a chain, the eighth lease's best lossless row on
# two machines (gpu.md); the suite times it as a candidate tree too, each head's best 9, 2, 1, 1 where the vertex
# memory does not know (<= 63 nodes: one verify slice with the root; the best TPF of 15 shapes decoded on the CPU),
# whose step a GPU's host work bounds (0.84-1.09x AR there)
MESH_TREE = "9,2,1,1"
MESH_GOAL = "xspecmesh criterion=rejection vertex_lookup"
# the goal's chain with 4 steps a host read (`run_ahead`: each step's verdict and next chain made on the device), timed
# last and against the AR row timed just before it: its key mask stays in the backbone's static buffers
MESH_AHEAD = f"{MESH_GOAL} run_ahead=4"
TREE_AHEAD = "run_ahead=4"  # the image trees' rows with 4 tree steps a host read, timed last in the image suite
# ADT-Tree's deeper adaptation steps, a GPU's defaults from session 63 to the eighth lease (which timed them ~10%
# slower than the defaults on an H200: gpu.md), timed beside the defaults
ADT_DEEPER = {"beta": 0.75, "l_k": 1, "k_max": 8}
DEVICE = "cuda"  # --smoke: a tiny CPU run of every row (static steps uncaptured), to check the script itself


def attach(model, mode: str):
    return graphs.attach(model, mode, capture=None if DEVICE == "cuda" else False)


def timed(fn):
    synchronize(DEVICE)
    t0 = time.perf_counter()
    out = fn()
    synchronize(DEVICE)
    return out, time.perf_counter() - t0


def first_runs(fn, captured: bool = True) -> float:
    """Seconds of a row's first run, which captures every shape the timed run meets, then (`captured`: graphs on) one
    more untimed run: each capture empties the allocator's cache (`torch.cuda.graph`), so a first run's eager ops
    leave few blocks cached, and the eighth lease's first tree rows ran their eager phases (prefill, verify, commit)
    up to ~2x slower than the same work later in the suite (gpu.md)."""
    first_s = timed(fn)[1]
    if captured:
        fn()
    return first_s


def syncs(fn) -> int:
    """Implicit host syncs (device-to-host reads) `fn()` makes: CUDA's sync debug mode warns at each one."""
    if DEVICE != "cuda":
        return 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen)


def share(stats) -> float:
    """The drafter's share of the rows' phase time: host time in `propose` over all phases."""
    times = [s.times for s in stats]
    return sum(t.get("propose", 0) for t in times) / max(sum(sum(t.values()) for t in times), 1e-9)


def phase_ms(stats) -> dict[str, float]:
    """Host ms a decode step in each of the loop's phases, over rows decoded one at a time (the phase that reads a
    step's result holds the wait for the device; the wall time they leave out is the loop's own)."""
    steps = max(sum(s.steps for s in stats), 1)
    return {k: round(1e3 * sum(s.times.get(k, 0.0) for s in stats) / steps, 3)
            for k in sorted({k for s in stats for k in s.times})}


def row(**kw) -> dict:
    kw["t_s"] = round(time.perf_counter() - T0, 1)  # since the script started: what each suite costs a step limit
    ROWS.append(kw)
    print(json.dumps(kw), flush=True)
    if JSON["path"]:
        with open(JSON["path"], "w") as f:
            json.dump({"device": JSON["device"], "rows": ROWS}, f, indent=1)
    return kw


def prompts_of(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(64, 256))] for _ in range(n)]


def text_model() -> tuple[TransformerConfig, Transformer, list[list[int]]]:
    """The text rows' model (SmolLM2's shape, random weights, bf16, laid out as a loader lays it out) and prompts."""
    torch.manual_seed(0)
    cfg = SMOLLM2 if DEVICE == "cuda" else dataclasses.replace(SMOLLM2, n_layers=2, vocab_size=512)
    return cfg, row_invariant(Transformer(cfg).to(DEVICE, torch.bfloat16).eval()), prompts_of(4, cfg.vocab_size)


def text_rows(new: int) -> None:
    cfg, model, prompts = text_model()
    target = ModelTarget(model)
    target.device = DEVICE

    def run(drafter, ps, b=1, n=new, params=SamplingParams()):
        gens = [torch.Generator().manual_seed(i) for i in range(len(ps))]  # a sampled row's draws: seeded per prompt
        return run_batch(target, lambda i: drafter(), ps, n, params, batch_size=b, generators=gens)

    def measured(drafter, ps, b=1, params=SamplingParams()):
        """(result, seconds, first-run facts) of a second run of the same prompts: the first captures every shape
        they meet (widths, buckets), a one-time cost reported apart, and the timed run should capture none."""
        held = g.captures if g else 0
        first_s = first_runs(lambda: run(drafter, ps, b, params=params), g is not None)
        held, first = (g.captures, g.captures - held) if g else (0, 0)
        res, s = timed(lambda: run(drafter, ps, b, params=params))
        return res, s, {"first_run_s": first_s, "first_run_captures": first,
                        "timed_captures": (g.captures - held) if g else 0}

    attach(model, "off")
    g = None
    run(EmptyDrafter, prompts[:1], n=4)
    ar, s_off = timed(lambda: run(EmptyDrafter, prompts))
    base = [r.tokens for r in ar.results]
    big = prompts_of(16, cfg.vocab_size, seed=1)  # batch 16's prompts, 64-256 tokens: one captured chunk each
    base16 = [r.tokens for r in run(EmptyDrafter, big, 16).results]
    tokens = len(prompts) * new
    row(suite="text", row="ar --graphs off", tok_s=tokens / s_off, vs_off=1.0, exact=1.0)
    g = attach(model, "on")
    res, s_on, first = measured(EmptyDrafter, prompts)
    b1 = row(suite="text", row="ar --graphs on", tok_s=tokens / s_on, vs_off=s_off / s_on, exact=exact(res, base),
             **first, **decode_only(res, s_on, tokens), **g.describe())
    gpu = step_gpu_s(model)
    busy("ar", gpu, s_on / tokens)
    ahead = lambda: EmptyDrafter(8)  # noqa: E731  (`ar` run_ahead 8: 8 greedy steps a host read)
    res, s_ra, first = measured(ahead, prompts)
    row(suite="text", row="ar run_ahead 8 --graphs on", tok_s=tokens / s_ra, vs_off=s_off / s_ra, vs_ar=s_on / s_ra,
        exact=exact(res, base), **first)
    busy("ar run_ahead 8", gpu, s_ra / tokens)
    t1 = SamplingParams(1.0)  # sampled: each step's draw a walk in the target's graphs (run_ahead: fed on the device)
    res, s_t1, first = measured(EmptyDrafter, prompts, params=t1)
    row(suite="text", row="ar --graphs on, T 1", tok_s=tokens / s_t1, vs_ar=s_on / s_t1, **first)
    sampled = [r.tokens for r in res.results]
    res, s, first = measured(ahead, prompts, params=t1)
    row(suite="text", row="ar run_ahead 8 --graphs on, T 1", tok_s=tokens / s, vs_ar=s_t1 / s,
        exact=exact(res, sampled), **first)
    ng = lambda: NgramDrafter(NgramOptions(**gpu_defaults(NgramOptions)))  # noqa: E731  (16 tokens, n-grams 3..1)
    res, s, first = measured(ng, prompts)
    row(suite="text", row="ngram --graphs on (random weights)", tok_s=tokens / s, vs_off=s_off / s, vs_ar=s_on / s,
        exact=exact(res, base), tpf=res.stats.tpf, num_draft=GPU_DRAFT, **first)
    # bench-mixed.yaml's pcllm-mr:lookup, on the shape's random weights, with the lookup a GPU pays for (text.md)
    mr = lambda: MultiBlockDrafter(MultiBlockOptions(block_size=4, num_blocks=1, lookup=32))  # noqa: E731
    res, s, first = measured(mr, prompts)
    row(suite="text", row="pcllm-mr n 4 + lookup 32 --graphs on (random weights)", tok_s=tokens / s,
        vs_ar=s_on / s, exact=exact(res, base), tpf=res.stats.tpf, **first)
    res, s16, first = measured(EmptyDrafter, big, 16)
    steps = decode_only(res, s16, 16 * new)  # the goal's ratio is the whole run's; decode_vs_b1 the steps' alone
    row(suite="text", row="ar --graphs on, batch 16", tok_s=16 * new / s16, vs_b1=(16 * new / s16) / (tokens / s_on),
        exact=exact(res, base16), decode_vs_b1=steps["decode_tok_s"] / b1["decode_tok_s"], **first, **steps,
        **g.describe())  # eager_calls: steps no bucket held
    res, s_ra16, first = measured(ahead, big, 16)
    row(suite="text", row="ar run_ahead 8 --graphs on, batch 16", tok_s=16 * new / s_ra16,
        vs_b1=(16 * new / s_ra16) / (tokens / s_ra), **first)
    batch16 = (big, base16, s16)
    LAST.append(("text", lambda: hf_rows(model, prompts, new, base, s_on, batch16)))  # the peers' compiles at the end


def decode_only(res, seconds: float, tokens: int) -> dict:
    """The prompts' prefills (a refill's captured chunks, then each row's first read, which waits for them: the loop
    charges both to the batch's prefill) apart from the decode steps: their share of the wall time, and the tokens a
    second of the steps alone (what a batch's steps cost against one row's)."""
    prefill = res.stats.times.get("prefill", 0.0)
    return {"prefill_share": prefill / seconds, "decode_tok_s": tokens / max(seconds - prefill, 1e-9),
            "ms_per_step": {k: 1e3 * v / max(res.stats.steps, 1) for k, v in sorted(res.stats.times.items())}}


def step_gpu_s(model) -> float | None:
    """GPU seconds of one captured batch-1 AR step: 100 back-to-back replays of each cache-width bucket (CUDA events),
    weighted by the steps the decodes so far (AR's alone) ran in each. A bf16 step's bucket holds padding nodes up to
    a whole product slice (StepGraphs.fill), so buckets are told by their one row, not by their nodes."""
    g = model.graphs
    steps = {b: n for b, n in g.uses.items() if isinstance(b, static_step.Bucket) and b.rows == 1
             and g.graphs[b][1] is not None}
    if DEVICE != "cuda" or not steps:
        return None
    gpu = 0.0
    for b, n in steps.items():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(100):
            g.graphs[b][1].replay()
        end.record()
        synchronize(DEVICE)
        gpu += start.elapsed_time(end) / 100 / 1e3 * n / sum(steps.values())
    return gpu


def busy(what: str, gpu: float | None, token_wall: float) -> None:
    """A captured AR step's GPU time over the wall time a token took in a decode (issue 46: >= 60%)."""
    if gpu is not None:
        row(suite="text", row=f"{what}: GPU time / wall time a token", gpu_ms=1e3 * gpu, wall_ms=1e3 * token_wall,
            busy=gpu / token_wall)


def hf_of(model):
    """transformers' Llama of our Transformer, bf16 on the device (the peers' model)."""
    from specgen.models.hf_export import to_hf

    model.graphs = None  # the captures point at the parameters: copy, never convert, the captured model
    return to_hf(copy.deepcopy(model).float()).to(DEVICE, torch.bfloat16).eval()


def hf_generate(hf, p: list[int], n: int, **kw) -> list[int]:
    ids = torch.tensor([p], device=DEVICE)
    with torch.inference_mode():
        return hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)[0, len(p):].tolist()


def hf_batch(hf, prompts: list[list[int]], n: int) -> list[list[int]]:
    """transformers' batched `generate` of the prompts (left-padded, masked: `generate_padded`), n tokens each."""
    return generate_padded(hf, prompts, n, min_new_tokens=n)[0]


def hf_static(hf, prompts, new: int) -> float:
    """Seconds of transformers' first static-cache `generate` (its CompileConfig compiles the forward: fullgraph,
    "reduce-overhead"); it keeps its static cache while a call fits it, so the longest prompt first compiles once."""
    hf.generation_config.cache_implementation = "static"
    return timed(lambda: hf_generate(hf, max(prompts, key=len), new))[1]


def hf_warm(new: int) -> None:
    """`hf-warm`: the `hf-compiled` row's compile alone, untimed, in a process of its own beside the gpu tests
    (scripts/gpu_check.sh), so the graphs step's compile reads Inductor's on-disk caches (same shapes, same graphs)
    instead of compiling for minutes at the end of its time limit."""
    cfg, model, prompts = text_model()
    hf = hf_of(model)
    row(suite="hf-warm", row="static-cache generate compiled", warmup_s=hf_static(hf, prompts, new))
    big = prompts_of(16, cfg.vocab_size, seed=1)  # then batch 16's shapes, as the text suite's batch-16 peer meets them
    row(suite="hf-warm", row="static-cache generate compiled, batch 16",
        warmup_s=timed(lambda: hf_batch(hf, big, new))[1])


def hf_rows(model, prompts, new: int, base, s_ours: float, batch16: tuple) -> None:
    """The transformers peers on the text rows' prompts at batch 1 (eager, prompt lookup, compiled) and on batch 16's
    (eager; compiled after the goals' table, where `--deadline` leaves time for a compile the warm-up may not have
    cached)."""
    try:
        hf = hf_of(model)
    except Exception as e:  # noqa: BLE001  (a peer that cannot load is a row saying so)
        row(suite="text", row="hf", error=str(e)[:200])
        return
    tokens = len(prompts) * new
    gen = functools.partial(hf_generate, hf)
    gen(prompts[0], 4)
    outs, s = timed(lambda: [gen(p, new) for p in prompts])
    row(suite="text", row="hf eager generate", tok_s=tokens / s, ours_vs=s / s_ours,
        exact=sum(o == b for o, b in zip(outs, base)) / len(base))
    hf_batch16(hf, new, batch16, "hf eager generate, batch 16")
    try:
        outs, s = timed(lambda: [gen(p, new, prompt_lookup_num_tokens=GPU_DRAFT) for p in prompts])
        row(suite="text", row=f"hf prompt lookup ({GPU_DRAFT} tokens; beside ngram)", tok_s=tokens / s,
            ours_vs=s / s_ours, exact=sum(o == b for o, b in zip(outs, base)) / len(base))
    except Exception as e:  # noqa: BLE001
        row(suite="text", row="hf prompt lookup", error=str(e)[:200])
    if DEVICE == "cuda":
        try:
            # transformers' documented fast path (`hf_static`); wrapping the forward by hand as well made the
            # compiled graphs overwrite outputs generate still held (the run at 2c09eb9)
            compile_s = hf_static(hf, prompts, new)
            outs, s = timed(lambda: [gen(p, new) for p in prompts])
            row(suite="text", row="hf-compiled (static cache + torch.compile)", tok_s=tokens / s, ours_vs=s / s_ours,
                exact=sum(o == b for o, b in zip(outs, base)) / len(base), warmup_s=compile_s)
            # no goal reads it, and a compile the warm-up did not cache may outlast the step: after the goals
            AFTER_GOALS.append(("text", lambda: hf_batch16(hf, new, batch16,
                                                           "hf-compiled (static cache + torch.compile), batch 16")))
            return
        except Exception as e:  # noqa: BLE001
            row(suite="text", row="hf-compiled", error=str(e)[:300])
            hf.generation_config.cache_implementation = None
    # the other fast path transformers documents, as the benchmark's `hf-compiled` row runs it (eval/hf_rows.py): one
    # cache size for every prompt (a size of its own would compile each prompt's step again)
    step = torch.compile(one_token, mode="reduce-overhead", fullgraph=True) if DEVICE == "cuda" else one_token
    slots, caches = HfCompiled.slots(max(map(len, prompts)) + new + 1), {}
    try:
        _, compile_s = timed(lambda: [timed_static_greedy(hf, step, p, new, slots=slots, caches=caches)
                                      for p in prompts[:2]])
        outs, s = timed(lambda: [timed_static_greedy(hf, step, p, new, slots=slots, caches=caches)[0]
                                 for p in prompts])
        row(suite="text", row="hf-compiled (StaticCache + compiled step loop)", tok_s=tokens / s, ours_vs=s / s_ours,
            exact=sum(o == b for o, b in zip(outs, base)) / len(base), warmup_s=compile_s)
    except Exception as e:  # noqa: BLE001
        row(suite="text", row="hf-compiled (step loop)", error=str(e)[:300])


def hf_batch16(hf, new: int, batch16: tuple, name: str) -> None:
    """One batch-16 peer row: `generate` of batch 16's prompts, against our batch 16 (`ours_vs`), its first call apart
    (a compile where the cache is static); skipped, with a row saying so, where `--deadline` leaves < 150 s."""
    big, base16, s_ours = batch16
    if DEADLINE["s"] and DEADLINE["s"] - (time.perf_counter() - T0) < 150:
        row(suite="text", row=name, skipped="under 150 s left of --deadline")
        return
    try:
        first_s = timed(lambda: hf_batch(hf, big, new))[1]
        outs, s = timed(lambda: hf_batch(hf, big, new))
        row(suite="text", row=name, tok_s=len(big) * new / s, ours_vs=s / s_ours,
            exact=sum(o == b for o, b in zip(outs, base16)) / len(base16), first_call_s=first_s)
    except Exception as e:  # noqa: BLE001  (a peer that cannot run is a row saying so)
        row(suite="text", row=name, error=f"{type(e).__name__}: {str(e)[:200]}")


def ar_base(s_ar: dict, mode: str, name: str, s: float) -> float:
    """The AR time a row's `vs_ar` divides: the mode's first row's (AR), or for a second-pass row ("..., again") the
    second pass's AR, timed beside it (`s_ar` keeps both; AR's own second pass keeps the first: the suite's drift)."""
    s_ar.setdefault(mode, s)
    if name == "ar, again":
        s_ar["again"] = s
    return s_ar[mode] if name == "ar, again" or not name.endswith(", again") else s_ar["again"]


def exact(res, base) -> float:
    return sum(r.tokens == b for r, b in zip(res.results, base)) / len(base)


def image_rows(num: int) -> None:
    from specgen.generate.image import ImageGenConfig, generate_images as run, load_image_model
    from specgen.request import parse_request

    def generate_images(im, cfg):
        return run(im, parse_request(cfg, "image"))

    im = load_image_model("tiny-image-gpt", device=DEVICE)
    base, s_ar = None, {}
    for mode in ("off", "on"):
        attach(im.model, mode)
        attach(im.drafter_net, mode)  # the EAGLE drafter's catch-ups and whole tree growths too
        rows = (("ar", "ar", {}), ("ar run_ahead 8", "ar", {"run_ahead": 8}), ("eagle2", "eagle2", {}),
                ("adt-tree", "adt-tree", {}),  # the trees at a GPU's defaults (31 nodes), and at the earlier ones
                ("adt-tree 60 nodes", "adt-tree", {"total_tokens": 60}),  # CFG's verify two slices
                ("adt-tree deeper steps", "adt-tree", ADT_DEEPER),  # 31 nodes: session 63's GPU steps (image.md)
                ("eagle2 60 nodes top-k 4", "eagle2", {"total_tokens": 60, "top_k": 4}),
                # two levels more inside the one growth replay (TPF 5.16 -> 5.55 at 31 nodes, image.md): against the
                # default row it times a drafter level, the step model's 0.066 ms (gpu.md)
                ("eagle2 depth 8", "eagle2", {"depth": 8}))
        # AR and the goals' rows again last: how far a row's time moves with its place in the suite (the eighth
        # lease's first three tree rows ran their host phases ~1.7x slower than the last three: gpu.md); the trees'
        # second pass is measured against the AR row beside it (`vs_ar`), a pair at one place (the goals read both)
        rows += (("ar, again", "ar", {}), ("eagle2, again", "eagle2", {}), ("adt-tree, again", "adt-tree", {}),
                 # 4 tree steps a host read (methods/eagle_ahead.py), last: their key mask stays in the target's
                 # static buffers (the same bits for later steps, a few more kernels)
                 (f"eagle2 {TREE_AHEAD}, again", "eagle2", {"run_ahead": 4}),
                 (f"adt-tree {TREE_AHEAD}, again", "adt-tree", {"run_ahead": 4}))
        for label, method, options in rows[: 1 if mode == "off" else None]:  # eager: AR alone, the ratios' base
            cfg = ImageGenConfig(method=method, num=num, temperature=0.0, device=DEVICE, batch_size=1,
                                 method_options=options)
            held = captures(im)  # a first run of the same images captures every shape they meet (ADT-Tree's vary)
            first_s = first_runs(lambda: generate_images(im, cfg), mode == "on")
            held, first = captures(im), captures(im) - held
            (samples, _), s = timed(lambda: generate_images(im, cfg))
            held = captures(im) - held  # captures inside the timed run: their time counts
            toks = [x.tokens for x in samples]
            base = base or toks
            ref = ar_base(s_ar, mode, label, s)
            tpf = sum(len(x.tokens) for x in samples) / max(sum(x.stats.target_forwards for x in samples), 1)
            steps = sum(x.stats.steps for x in samples)
            drafter = {"drafter_" + k: v for k, v in im.drafter_net.graphs.describe().items()} \
                if im.drafter_net.graphs else {}
            row(suite="image", row=f"{label} --graphs {mode}", images_s=num / s, ms_step=1e3 * s / max(steps, 1),
                vs_ar=ref / s,
                vs_ar_off=s_ar["off"] / s, exact=sum(t == b for t, b in zip(toks, base)) / num, tpf=tpf,
                drafter_share=share([x.stats for x in samples]), phase_ms=phase_ms([x.stats for x in samples]),
                syncs_step=syncs(lambda: generate_images(im, cfg)) / max(steps, 1), timed_captures=held,
                first_run_s=first_s, first_run_captures=first,
                **(im.model.graphs.describe() if im.model.graphs else {}), **drafter)


def captures(im) -> int:
    """Captures the image target and its drafter made so far (`StepGraphs.captures`)."""
    return sum(m.graphs.captures for m in (im.model, im.drafter_net) if m is not None and m.graphs is not None)


def mesh_rows(num: int, trees: tuple[str, ...] = ()) -> None:
    """The mesh suite; `trees`: more candidate-tree shapes, timed with graphs on after the goal's (`--mesh-trees`)."""
    from specgen.decoding.sampling import SamplingParams as SP
    from specgen.eval.mesh_bench import benchmark_clouds
    from specgen.generate.mesh import load_mesh_model
    from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions

    loaded = load_mesh_model(heads="xspecmesh-ca-tiny", device=DEVICE)
    dec = loaded.decoder
    ar_dec = MeshDecoder(dec.model, None, dec.eos_id)
    clouds = [pc for _, pc in benchmark_clouds(loaded.target.meta, num, 0, DEVICE)]
    opts = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1)
    # the lossless rule's best candidates on these heads: a revisited vertex's offset, the heads elsewhere (gpu.md),
    # as a chain (issue 46's mesh goal reads it) and as candidate trees (MESH_TREE, `trees`)
    vertex = dataclasses.replace(opts, vertex_lookup=True)
    params = SP()
    budget = 512
    base, s_ar = None, {}
    for mode in ("off", "on"):
        attach(dec.model.decoder, mode)
        attach(dec.heads, mode)  # the heads' step a replay too
        shapes = (MESH_TREE, *trees) if mode == "on" else (MESH_TREE,)  # `trees`: with graphs on only
        more = [(f"{MESH_GOAL} candidate_tree={shape}", dec, dataclasses.replace(vertex, candidate_tree=shape))
                for shape in shapes]
        # AR and the goal's row again last: how far the host's speed drifted during the suite (gpu.md: ratios within
        # ~10% are equal); the goal row's second pass is measured against the AR row beside it
        again = [("ar, again", ar_dec, opts), (f"{MESH_GOAL}, again", dec, vertex),
                 (f"{MESH_AHEAD}, again", dec, dataclasses.replace(vertex, run_ahead=4))] if mode == "on" else []
        for name, d, o in (("ar", ar_dec, opts), ("xspecmesh criterion=rejection", dec, opts),
                           (MESH_GOAL, dec, vertex), *more, *again):
            first_runs(lambda: d.generate_batch(clouds, params, budget, o), mode == "on")
            res, s = timed(lambda: d.generate_batch(clouds, params, budget, o))
            toks = [r.tokens for r in res]
            base = base or toks
            ref = ar_base(s_ar, mode, name, s)
            steps = sum(r.stats.steps for r in res)
            row(suite="mesh", row=f"{name} --graphs {mode}", meshes_s=num / s, vs_ar=ref / s,
                vs_ar_off=s_ar["off"] / s, exact=sum(t == b for t, b in zip(toks, base)) / num,
                tpf=sum(map(len, toks)) / max(steps, 1), drafter_share=share([r.stats for r in res]),
                phase_ms=phase_ms([r.stats for r in res]), ms_step=1e3 * s / max(steps, 1),
                syncs_step=syncs(lambda: d.generate_batch(clouds, params, budget, o)) / max(steps, 1),
                **{"heads_" + k: v for k, v in (dec.heads.graphs.describe() if dec.heads.graphs else {}).items()})


def attention_rows(new: int = 64) -> None:
    """Per attention of a captured bf16 step: AR speed at batch 1 and 16, and whether a verify scores each node
    bitwise as the AR step did (16 greedy AR steps, then the same 16 tokens as one chain): the query-count invariance
    that lossless decoding needs."""
    cfg = SMOLLM2 if DEVICE == "cuda" else dataclasses.replace(SMOLLM2, n_layers=2, vocab_size=512)
    torch.manual_seed(0)
    model = row_invariant(Transformer(cfg).to(DEVICE, torch.bfloat16).eval())
    target = ModelTarget(model)
    target.device = DEVICE
    prompts, big = prompts_of(4, cfg.vocab_size), prompts_of(16, cfg.vocab_size, seed=1)

    # "lists": what a captured step attends with on CUDA (static_step.step_mask: each query over its visible slots in
    # AR's order, the Triton kernel of native/cuda_ops.py); "chunked": the torch chain plan it replaced; "sdpa": an
    # additive mask (fewer kernels, not invariant by construction); "plain products": each product one GEMM of its
    # own row count instead of SlicedLinear's fixed shape
    def sdpa(visible, cfg, dtype):
        return additive_mask(visible)

    def chunked(visible, cfg, dtype):
        r, _, s, t = visible.shape
        return attention.chain_plan(visible, r, s, t, cfg.n_heads, cfg.n_kv_heads, cfg.hd, visible.device)

    variants = {"lists": (static_step.step_mask, SlicedLinear.forward),
                "lists, plain products": (static_step.step_mask, torch.nn.Linear.forward),
                "chunked": (chunked, SlicedLinear.forward),
                "sdpa": (sdpa, SlicedLinear.forward)}
    for attention_name, (mask, product) in variants.items():
        graphs.attach(model, "on", capture=None if DEVICE == "cuda" else False)
        patches = (mock.patch.object(static_step, "step_mask", mask),
                   mock.patch.object(SlicedLinear, "forward", product))
        for patch in patches:
            patch.start()
        run = lambda ps, b: run_batch(target, lambda i: EmptyDrafter(), ps, new, SamplingParams(),  # noqa: E731
                                         batch_size=b)
        run(prompts[:1], 1)
        _, s1 = timed(lambda: run(prompts, 1))
        run(big, 16)
        _, s16 = timed(lambda: run(big, 16))
        with torch.inference_mode():
            p = prompts[0]
            cache = target.new_cache(1, len(p) + 64)
            tok = int(target.prefill(torch.tensor([p], device=DEVICE), cache).logits[0, -1].argmax())
            steps, toks = [], [tok]
            for i in range(16):
                out = target.forward(torch.tensor([[tok]], device=DEVICE), torch.tensor([[len(p) + i]], device=DEVICE),
                                     cache, None)
                cache.commit(0, [0])
                steps.append(out.logits[0, 0])
                tok = int(out.logits[0, 0].argmax())
                toks.append(tok)
            cache = target.new_cache(1, len(p) + 64)
            target.prefill(torch.tensor([p], device=DEVICE), cache)
            chain = target.forward(torch.tensor([toks[:16]], device=DEVICE),
                                   (len(p) + torch.arange(16, device=DEVICE))[None], cache, None).logits[0]
        same = sum(bool(torch.equal(a, b)) for a, b in zip(steps, chain))
        diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(steps, chain))
        row(suite="attention", row=f"bf16 captured steps, attention={attention_name}", tok_s=len(prompts) * new / s1,
            b16_tok_s=len(big) * new / s16, vs_b1=(len(big) / s16) / (len(prompts) / s1),
            bitwise_rows=f"{same}/16", max_abs_diff=diff)
        for patch in patches:
            patch.stop()


def product_rows(rows: tuple[int, ...] = (4, 16, 64, 130)) -> None:
    """Whether a bf16 product scores a row bitwise as it does alone (an AR step's one row against a verify's M rows),
    per SmolLM2 product shape: one `F.linear` of M rows, the same with reduced-precision reductions off, and
    SlicedLinear (GEMMs of SLICE_ROWS rows): the products' query-count invariance, beside the attention's above."""
    torch.manual_seed(0)
    shapes = {"wqkv": (960, 576), "w13": (3072, 576), "w2": (576, 1536), "head": (49152, 576)}
    reduced = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    for name, (n, k) in shapes.items():
        lin = torch.nn.Linear(k, n, bias=False, device=DEVICE, dtype=torch.bfloat16)
        x = torch.randn(max(rows), k, device=DEVICE, dtype=torch.bfloat16)
        for label, cls, allow in (("plain", torch.nn.Linear, True),
                                  ("no reduced-precision reduction", torch.nn.Linear, False),
                                  (f"SlicedLinear ({SLICE_ROWS} rows)", SlicedLinear, True)):
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = allow
            lin.__class__ = cls
            with torch.inference_mode():
                alone = torch.cat([lin(x[j: j + 1]) for j in range(max(rows))])  # [M, N]: each row alone
                same = {f"M={m}": f"{sum(bool(torch.equal(a, b)) for a, b in zip(lin(x[:m]), alone))}/{m}"
                        for m in rows}
            row(suite="attention", row=f"bf16 product {name} {n}x{k}, {label}", **same)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced


# Paper shapes with random weights (what the papers decode; the weights do not change a forward's cost):
# name -> (config, cache rows per sequence (CFG: 2), cached prefix, frontier width of a drafter level)
def scale_shapes() -> dict:
    from specgen.models.llamagen import llamagen_config

    qwen7b = TransformerConfig(vocab_size=152064, dim=3584, n_layers=28, n_heads=28, n_kv_heads=4, ffn_dim=18944,
                               qkv_bias=True, rope_theta=1e6, max_seq_len=4096, tie_embeddings=False)
    bpt = TransformerConfig(vocab_size=4737, dim=1024, n_layers=24, n_heads=16, n_kv_heads=16, ffn_dim=4096,
                            cross_dim=1024, max_seq_len=10240, tie_embeddings=False)
    shapes = {f"LlamaGen-{n[4:]} c2i (CFG)": (llamagen_config(n, vocab=16384, grid=16, num_classes=1000), 2, 128, 10)
              for n in ("GPT-B", "GPT-L", "GPT-XL")}
    shapes["Qwen2.5-Coder-7B shape"] = (qwen7b, 1, 512, 8)
    shapes["BPT decoder shape (cross-attn to 257 latents)"] = (bpt, 1, 2048, 4)
    return shapes


def scale_rows() -> None:
    """c(N) = a captured verify of N chain nodes over one step, and one drafter level (a 1-layer decoder of the
    target's width + its head over the frontier) over one step, at the papers' shapes, bfloat16."""
    for name, (cfg, rows, prefix, frontier) in scale_shapes().items():
        if DEVICE != "cuda":
            cfg = dataclasses.replace(cfg, n_layers=1, vocab_size=min(cfg.vocab_size, 512))
        times = {}
        # label -> (config, chain lengths, what the pass changes): "128-row slices", SlicedLinear with slices of 128
        # rows (one GEMM for CFG's 2 x 64 nodes, where 64-row slices run two): whether they keep c(64) near 1 without
        # a dearer step
        drafter = dataclasses.replace(cfg, n_layers=1)
        passes = {"target": (cfg, (1, 4, 8, 16, 32, 64), None), "drafter": (drafter, (frontier,), None),
                  "128-row slices": (cfg, (1, 64), mock.patch.object(sliced_linear, "SLICE_ROWS", 128))}
        if rows == 1:  # no CFG: a 64-node verify is one 64-row slice already
            del passes["128-row slices"]
        for label, (c, nodes, change) in passes.items():
            if change:
                change.start()
            torch.set_default_dtype(torch.bfloat16)
            try:
                with torch.device(DEVICE):  # its RoPE table is made on the CPU even here: `.to` moves it
                    model = row_invariant(Transformer(c).to(DEVICE).eval())
            finally:
                torch.set_default_dtype(torch.float32)
            attach(model, "on")
            cache = model.new_cache(rows, prefix + 128)
            cache.lengths = [prefix] * rows
            if c.cross_dim:
                cache.cross = [(torch.randn(rows, c.n_heads, 257, c.hd, device=DEVICE, dtype=torch.bfloat16),) * 2
                               for _ in range(c.n_layers)]
            with torch.inference_mode():
                for n in nodes:
                    tok = torch.randint(0, c.vocab_size, (rows, n), device=DEVICE)
                    pos = prefix + torch.arange(n, device=DEVICE).expand(rows, n)
                    for _ in range(3):
                        model(tok, pos, cache, None)
                    reps = 20 if DEVICE == "cuda" else 1
                    _, s = timed(lambda: [model(tok, pos, cache, None) for _ in range(reps)])
                    times[(label, n)] = s / reps
            if change:
                change.stop()
            model = cache = None  # freed before the next pass's model
            torch.cuda.empty_cache() if DEVICE == "cuda" else None
        one = times[("target", 1)]
        row(suite="scale", row=name, step_ms=1e3 * one, **{f"c({n})": times[("target", n)] / one for n in
                                                          (4, 8, 16, 32, 64)},
            drafter_level=times[("drafter", frontier)] / one, frontier=frontier,
            **({} if rows == 1 else dict(slices128_step_ms=1e3 * times[("128-row slices", 1)],
                                         slices128_c64=times[("128-row slices", 64)] / times[("128-row slices", 1)])))


def guarded(name: str, run) -> None:
    """`run()`, its failure a row: one suite's failure must not lose the others' rows."""
    try:
        run()
    except Exception as e:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        row(suite=name, row="failed", error=f"{type(e).__name__}: {str(e)[:300]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--meshes", type=int, default=8)
    ap.add_argument("--only", default="text,image,mesh,scale,attention")
    ap.add_argument("--json", default="")
    ap.add_argument("--mesh-trees", nargs="*", default=[], metavar="WIDTHS",
                    help=f"more candidate trees (e.g. 6,1,1,1) timed with graphs on beside {MESH_TREE}")
    ap.add_argument("--deadline", type=float, default=0.0, help="the caller's time limit in seconds (0: none)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (checks the script, measures nothing)")
    args = ap.parse_args()
    global DEVICE
    if args.smoke:
        DEVICE, args.new, args.images, args.meshes = "cpu", 8, 2, 2
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # float32 stays float32
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke)"
    JSON.update(path=args.json, device=device)
    DEADLINE["s"] = args.deadline
    print(f"device {device}, torch {torch.__version__}, cuda {torch.version.cuda}", flush=True)
    suites = {"text": lambda: text_rows(args.new), "image": lambda: image_rows(args.images),
              "mesh": lambda: mesh_rows(args.meshes, tuple(args.mesh_trees)), "scale": scale_rows,
              "attention": lambda: (attention_rows(), product_rows()), "hf-warm": lambda: hf_warm(args.new)}
    for name in args.only.split(","):
        guarded(name, suites[name])
    table(ROWS)  # before the peers' compiles, which the step's time limit may cut short
    done = len(ROWS)
    for name, run in LAST:  # what the suites left to the end
        guarded(name, run)
    if len(ROWS) > done:
        table(ROWS[done:])
    goals(ROWS)
    done = len(ROWS)
    for name, run in AFTER_GOALS:
        guarded(name, run)
    if len(ROWS) > done:
        table(ROWS[done:])


# issue 46's goals: (suite, the row or its first words, the row's key, at least (>) or at most (<), the goal)
GOALS = (("text", "ar --graphs on", "vs_off", ">", 8.0), ("text", "ar: GPU time", "busy", ">", 0.6),
         ("text", "hf-compiled", "ours_vs", ">", 1.5), ("text", "ar --graphs on, batch 16", "vs_b1", ">", 12.0),
         ("text", "ngram --graphs on", "vs_ar", ">", 1.4), ("text", "pcllm-mr", "vs_ar", ">", 1.5),
         ("image", "adt-tree --graphs on", "vs_ar", ">", 2.0), ("image", "eagle2 --graphs on", "vs_ar", ">", 1.8),
         ("image", "adt-tree --graphs on", "drafter_share", "<", 0.2),
         ("image", "eagle2 --graphs on", "drafter_share", "<", 0.2),
         ("mesh", f"{MESH_GOAL} --graphs on", "vs_ar", ">", 1.5),
         # the same goals in the suites' second pass, each against the AR row timed beside it (the place effect)
         ("image", "adt-tree, again", "vs_ar", ">", 2.0), ("image", "eagle2, again", "vs_ar", ">", 1.8),
         ("mesh", f"{MESH_GOAL}, again", "vs_ar", ">", 1.5), ("mesh", f"{MESH_AHEAD}, again", "vs_ar", ">", 1.5),
         ("image", f"adt-tree {TREE_AHEAD}, again", "vs_ar", ">", 2.0),
         ("image", f"eagle2 {TREE_AHEAD}, again", "vs_ar", ">", 1.8))


def goals(rows: list[dict]) -> None:
    """One line a goal: the measured value and whether it meets it ("-": no such row, e.g. a step cut short)."""
    print("\n| goal | measured | met |\n|---|---:|---|")
    for suite, prefix, key, sense, want in GOALS:
        found = next((r[key] for r in rows if r["suite"] == suite and key in r
                      and (r["row"] == prefix or r["row"].startswith(prefix + " "))), None)
        met = "-" if found is None else "yes" if (found >= want if sense == ">" else found <= want) else "no"
        print(f"| {suite} {prefix}: {key} {'>=' if sense == '>' else '<='} {want} | "
              f"{'-' if found is None else f'{found:.2f}'} | {met} |")


def table(rows: list[dict]) -> None:
    print("\n| suite | row | speed | vs | exact | notes |\n|---|---|---:|---:|---:|---|")
    for r in rows:
        speed = next((f"{r[k]:.2f} {k}" for k in ("tok_s", "images_s", "meshes_s") if k in r), "")
        vs = next((f"{r[k]:.2f} {k}" for k in ("vs_off", "vs_ar", "vs_b1", "ours_vs", "busy", "c(64)") if k in r), "")
        rest = {k: v for k, v in r.items() if k not in ("suite", "row", "tok_s", "images_s", "meshes_s", "exact")}
        print(f"| {r['suite']} | {r['row']} | {speed} | {vs} | {r.get('exact', '')} | {json.dumps(rest)[:160]} |",
              flush=True)


if __name__ == "__main__":
    main()
