"""CUDA checks (marker `gpu`: skipped by tests/conftest.py where torch.cuda.is_available() is False).

They run on a GPU node: `pytest -m gpu tests/test_gpu.py`. Greedy comparisons across devices or methods are only
meaningful where no step is a near-tie; every test first checks on the CPU that each greedy step's top-1 logit
leads the runner-up by MARGIN (float32 rounding differences between kernels are ~1e-6), so a failure below is a
real disagreement, not a tie broken differently.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.methods.options import JacobiOptions, NgramOptions
from specgen.methods.text import EmptyDrafter, JacobiDrafter, NgramDrafter
from tests.conftest import decode
from tests.conftest import (EXAONE4, GEMMA, GEMMA1, GEMMA2, LOSSLESS_IMAGE, LOSSLESS_TEXT, MOE, OLMO2, QWEN2_MOE,
                            SLIDING, method_drafter, tiny_model, unwindowed)

pytestmark = pytest.mark.gpu

PROMPT = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]  # repeats, so n-gram drafts get accepted
NEW = 48
MARGIN = 1e-3


@pytest.fixture(autouse=True)
def exact_float32_matmuls():
    """TF32 would round float32 matmuls to 10-bit mantissas on the GPU: keep float32 float32 here."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def target_on(model: torch.nn.Module, device: str, dtype: torch.dtype = torch.float32) -> ModelTarget:
    target = ModelTarget(model.to(device=device, dtype=dtype).eval())
    target.device = device  # the decode loop makes its token tensors there
    return target


def greedy(target: ModelTarget, drafter=None, new: int = NEW):
    return decode(target, drafter or EmptyDrafter(), PROMPT, new, SamplingParams())


def min_margin(model: torch.nn.Module, tokens: list[int]) -> float:
    """Smallest top-1 minus top-2 logit over the greedy steps that produced `tokens` (CPU, float32)."""
    target = target_on(model, "cpu")
    seq = torch.tensor([PROMPT + tokens[:-1]])
    with torch.inference_mode():
        hidden = target.prefill(seq, target.new_cache(1, seq.shape[1] + 1)).features  # final normed hidden states
        logits = model.output(hidden)[0, len(PROMPT) - 1:].float()
    assert logits.argmax(-1).tolist() == tokens  # the margins are those of the steps that chose `tokens`
    top = logits.topk(2, dim=-1).values
    return float((top[:, 0] - top[:, 1]).min())


def cpu_reference(seed: int) -> tuple[torch.nn.Module, list[int]]:
    model = tiny_model(seed)
    tokens = greedy(target_on(model, "cpu")).tokens
    assert len(tokens) == NEW
    assert min_margin(model, tokens) > MARGIN, "near-tie in the reference: pick another seed"
    return model, tokens


@pytest.mark.parametrize("seed", [0, 1])
def test_ar_greedy_on_cuda_equals_cpu(seed):
    model, cpu_tokens = cpu_reference(seed)
    res = greedy(target_on(model, "cuda"))
    assert res.tokens == cpu_tokens


@pytest.mark.parametrize("make", [lambda: NgramDrafter(NgramOptions(num_draft=4, max_ngram=3, min_ngram=1)),
                                  lambda: JacobiDrafter(JacobiOptions(4), seed=0)], ids=["ngram", "jacobi"])
def test_lossless_method_on_cuda_equals_ar_on_cuda(make):
    model, cpu_tokens = cpu_reference(0)
    target = target_on(model, "cuda")
    ar = greedy(target)
    spec = greedy(target, make())
    assert spec.tokens == ar.tokens == cpu_tokens
    assert spec.stats.target_forwards <= ar.stats.target_forwards  # drafts were verified, never more forwards


def test_bf16_on_cuda_runs():
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    model = tiny_model(0)
    target = target_on(model, "cuda", torch.bfloat16)
    cache = target.new_cache(1, 8)
    assert cache.k.dtype == torch.bfloat16 and cache.k.device.type == "cuda"
    res = greedy(target)
    assert len(res.tokens) == NEW and all(0 <= t < model.cfg.vocab_size for t in res.tokens)
    seq = torch.tensor([PROMPT], device="cuda")
    logits = target.prefill(seq, target.new_cache(1, len(PROMPT) + 1)).logits
    assert logits.device.type == "cuda" and torch.isfinite(logits.float()).all()
    spec = greedy(target, NgramDrafter(NgramOptions(num_draft=4, max_ngram=3, min_ngram=1)))
    assert len(spec.tokens) == NEW  # a lossless method runs in bfloat16 on the GPU too


def test_lora_merge_onto_a_cuda_model_equals_the_cpu_merge():
    """A saved adapter is read on the host; the model it merges into may already be on the GPU (mesh benchmark)."""
    from specgen.models.lora import merge_lora_state

    gen = torch.Generator().manual_seed(0)
    dim = tiny_model(0).cfg.dim
    state = {"layers.0.attention.wo.lora_A": torch.randn(4, dim, generator=gen),
             "layers.0.attention.wo.lora_B": torch.randn(dim, 4, generator=gen)}
    cpu, gpu = tiny_model(0), tiny_model(0).to("cuda")
    assert merge_lora_state(cpu, state, rank=4, alpha=8.0) == merge_lora_state(gpu, state, rank=4, alpha=8.0) == 1
    torch.testing.assert_close(gpu.layers[0].attention.wo.weight.cpu(), cpu.layers[0].attention.wo.weight)


@pytest.mark.parametrize("suite,args", [
    ("images", ["--config", "recipes/tiny/bench-images-batch.yaml", "--batch-size", "1,2", "num=2"]),
    ("meshes", ["--config", "recipes/tiny/bench-meshes-batch.yaml", "--batch-size", "1,2", "--limit", "2"]),
], ids=["images", "meshes"])
def test_benchmark_suites_run_on_cuda(suite, args, tmp_path):
    """The shipped tiny image and mesh models through `specgen benchmark --device cuda` (quality columns included):
    every tensor the suite makes meets the model on its device; lossless image rows (T = 0) equal AR there too."""
    import json

    from typer.testing import CliRunner

    from cli.main import app

    out = tmp_path / "rows.jsonl"
    extra = [f"out_dir={tmp_path / 'img'}"] if suite == "images" else []
    r = CliRunner().invoke(app, ["benchmark", "--device", "cuda", "--threads", "0", "--out", str(out), *args, *extra])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) >= 6  # three rows (the recipe's) at each of two batch sizes
    if suite == "images":
        assert all(row["exact_match_vs_ar"] == 1.0 for row in rows)


def test_ragged_batch_on_cuda_equals_each_prompt_alone():
    """Three prompts of unequal lengths decoded together on the GPU (per-row masks, positions and cache lengths;
    the flat ragged KV write) give each prompt's own greedy output, for AR and a lossless drafter."""
    from specgen.methods import run_batch

    model, _ = cpu_reference(0)
    prompts = [PROMPT, PROMPT[:7], PROMPT + [6, 7, 8, 9]]
    cpu = target_on(model, "cpu")
    alone = [decode(cpu, EmptyDrafter(), p, NEW, SamplingParams()).tokens for p in prompts]
    for p, tokens in zip(prompts, alone):
        seq = torch.tensor([p + tokens[:-1]])
        with torch.inference_mode():
            logits = model.output(cpu.prefill(seq, cpu.new_cache(1, seq.shape[1] + 1)).features)[0, len(p) - 1:]
        top = logits.float().topk(2, dim=-1).values
        assert float((top[:, 0] - top[:, 1]).min()) > MARGIN, "near-tie in the reference: pick other prompts"
    gpu = target_on(model, "cuda")
    for make in (EmptyDrafter, lambda: NgramDrafter(NgramOptions(num_draft=4, max_ngram=3, min_ngram=1))):
        res = run_batch(gpu, lambda i: make(), prompts, NEW, SamplingParams())
        assert [r.tokens for r in res.results] == alone


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("defaults", ["cpu", "gpu"])
@pytest.mark.parametrize("method", LOSSLESS_TEXT)
def test_captured_steps_decode_what_eager_ar_decodes(method, defaults, batch):
    """--graphs on (CUDA-graph replays over the static cache) against --graphs off, on the GPU: every lossless text
    method of the method table equals AR, at its CPU's and a GPU's option defaults (n-gram there: a trie of its 4
    latest matches' continuations), at batch 1 and 3, and the forwards really were replays."""
    from specgen.methods import run_batch
    from specgen.models import graphs

    model, _ = cpu_reference(0)
    prompts = [PROMPT, PROMPT[:7], PROMPT + [6, 7, 8, 9]][:batch]
    gpu = target_on(model, "cuda")
    eager = run_batch(gpu, lambda i: EmptyDrafter(), prompts, NEW, SamplingParams())
    steps = graphs.attach(model, "on")
    try:
        make = lambda i: method_drafter(method, 0, defaults == "gpu")  # noqa: E731
        res = run_batch(gpu, make, prompts, NEW, SamplingParams())
        again = run_batch(gpu, make, prompts, NEW, SamplingParams())  # replays of the captures
    finally:
        graphs.attach(model, "off")
    assert [r.tokens for r in res.results] == [r.tokens for r in again.results] == [r.tokens for r in eager.results]
    assert steps.replays > 0 and steps.eager_calls == 0 and steps.graph_bytes > 0


@pytest.mark.parametrize("method,options", [("ar", {}), ("ar", {"run_ahead": 4}), ("ngram", {}), ("pcllm-mr", {})],
                         ids=["ar", "ar-run-ahead-4", "ngram", "pcllm-mr"])
def test_a_sampled_judges_captured_walk_draws_what_its_eager_walk_draws(method, options):
    """T 1 with top-k and top-p, batch 3: --graphs on (each step's walk one replay of a capture in the target's,
    `accept.walked_rows`; AR's run_ahead draws each step's token so) against --graphs off (the walk's ops eager on the
    GPU): the same tokens from the same seeded uniforms, and every walk was captured (a capture refuses a host read)."""
    from specgen.methods import run_batch
    from specgen.models import graphs

    model, _ = cpu_reference(0)
    prompts, params = [PROMPT, PROMPT[:7], PROMPT + [6, 7, 8, 9]], SamplingParams(1.0, top_k=20, top_p=0.9)
    gpu = target_on(model, "cuda")

    def sampled():
        gens = [torch.Generator().manual_seed(11 + i) for i in range(3)]
        got = run_batch(gpu, lambda i: method_drafter(method, 0, True, **options), prompts, NEW, params,
                        generators=gens)
        return [r.tokens for r in got.results]

    eager = sampled()
    steps = graphs.attach(model, "on")
    try:
        captured, again = sampled(), sampled()
    finally:
        graphs.attach(model, "off")
    assert captured == again == eager
    walks = [graph for key, (_, graph, _) in steps.graphs.items() if isinstance(key, tuple) and key[0] == "walk"]
    assert walks and all(graph is not None for graph in walks)


# targets whose blocks differ from Llama's, each with `tiny_model`'s overrides and the new tokens it decodes
TARGETS = {
    # SmolLM3's NoPE layers (layer 1 here) through the Triton rope with a still rotation
    "nope": (dict(nope_layers=(1,)), NEW),
    # Gemma 3's block: scaled embedding, GeGLU without the fused SwiGLU gate, sandwich and q/k norms without the
    # fused residual norms, a local layer's own RoPE table
    "gemma": (GEMMA, NEW),
    # Gemma 1's: scaled embedding and GeGLU in Llama's block, whose residual adds run in the fused norms
    "gemma1": (GEMMA1, NEW),
    # Gemma 2's: Gemma 3's block without q/k norms, scores capped in the list kernel, layer 0 sliding past its window
    "gemma2": (GEMMA2, 40),
    # OLMo 2's: no pre-norms (no fused residual norms), sandwich norms, q and k normed over their whole projections
    # before the Triton rope
    "olmo2": (OLMO2, NEW),
    # Mixtral's routed experts: eager forwards route each expert's rows (host reads), captured steps run every expert
    # over every row and gather each row's k (models/moe.py: the same bits under row-invariant products)
    "moe": (MOE, NEW),
    # Qwen2-MoE's: q/k/v biases on the sliced products (Qwen2's and Qwen2.5-Coder's dense blocks have them too), a
    # shared expert gated per row by a sigmoid beside the routed ones
    "qwen2-moe": (QWEN2_MOE, NEW),
    # EXAONE 4's: OLMo 2's norms with per-head q/k norms, layer 0 sliding past its window, layer 1 without RoPE
    "exaone4": (EXAONE4, 40),
    # (Granite's, OLMo 3's and OLMoE's blocks run no kernel these do not: Gemma 1's scaled embedding in Llama's
    # block and a division in the captured head; OLMo 2's block with a sliding layer of its own RoPE base; OLMo 2's
    # whole-span q/k norms before routed experts. Their CPU twins are in tests/models/test_graphs.py. The gpu-tests
    # step has 140 s for all of them)
    # local layers sliding over a window of 5-6 positions, decoded well past it: the captured steps build their
    # windowed lists in the graph (the Triton attention_plan of the windowed visibility, no host read)
    **{f"sliding-{kind}": (over, 40) for kind, over in SLIDING.items()},
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("method", LOSSLESS_TEXT)
def test_captured_steps_of_other_blocks_decode_what_eager_ar_decodes(method, target):
    """Captured steps of each TARGETS block equal eager AR; control (sliding targets): without the window eager AR
    decodes other tokens."""
    from specgen.methods import run_batch
    from specgen.models import graphs

    over, new = TARGETS[target]
    model = tiny_model(0, **over)
    gpu = target_on(model, "cuda")
    eager = run_batch(gpu, lambda i: EmptyDrafter(), [PROMPT, PROMPT[:7]], new, SamplingParams())
    steps = graphs.attach(model, "on")
    try:
        res = run_batch(gpu, lambda i: method_drafter(method, 0, True), [PROMPT, PROMPT[:7]], new, SamplingParams())
    finally:
        graphs.attach(model, "off")
    assert [r.tokens for r in res.results] == [r.tokens for r in eager.results] and steps.replays > 0
    if over.get("window"):
        full = tiny_model(0, **unwindowed(over))
        other = run_batch(target_on(full, "cuda"), lambda i: EmptyDrafter(), [PROMPT, PROMPT[:7]], new,
                          SamplingParams())
        assert [r.tokens for r in other.results] != [r.tokens for r in eager.results]


def test_captured_steps_across_width_buckets_and_a_failed_capture_decode_what_eager_ar_decodes(monkeypatch):
    """Steps read only their width bucket's slots (16, 32, 64 here: the decode crosses each) with the bits of eager AR;
    a step that reads the host cannot be captured (its warm-up raises; or, reading only while captured, its capture
    fails), under auto its module runs the static steps uncaptured, and a failed capture leaves no trace: the caller's
    stream is current (torch.cuda.graph leaves its capture stream current when its capture_end raises), the allocator
    empties its cache (in older torch a capture left underway fails an assert there) and a new module captures."""
    from specgen.methods import run_batch
    from specgen.models import graphs

    monkeypatch.setattr(graphs, "MIN_WIDTH", 16)
    model, _ = cpu_reference(0)
    prompts = [PROMPT, PROMPT[:7]]
    gpu = target_on(model, "cuda")

    def run():
        return [r.tokens for r in run_batch(gpu, lambda i: EmptyDrafter(), prompts, NEW, SamplingParams()).results]

    eager = run()
    steps = graphs.attach(model, "on")
    step = graphs.KINDS[type(model)].step
    try:
        assert run() == eager
        assert {b.width for b in steps.uses} == {16, 32, 64} and steps.eager_calls == 0
        for always in (True, False):

            def reads_the_host(model, x, *args, always=always):
                if always or torch.cuda.is_current_stream_capturing():
                    int(x.meta[0, 0])  # a sync: not allowed while a stream is captured
                return step(model, x, *args)

            monkeypatch.setitem(graphs.KINDS, type(model), graphs.StepKind(reads_the_host))
            steps = graphs.attach(model, "auto")
            with pytest.warns(UserWarning, match="cannot be captured"):
                assert run() == eager
            assert not steps.capture
            assert torch.cuda.current_stream() == torch.cuda.default_stream()
            torch.cuda.empty_cache()
        monkeypatch.setitem(graphs.KINDS, type(model), graphs.StepKind(step))
        steps = graphs.attach(model, "on")
        assert run() == eager
        assert steps.replays > 0 and steps.eager_calls == 0 and all(g is not None for _, g, _ in steps.graphs.values())
    finally:
        graphs.attach(model, "off")


def test_captured_image_trees_decode_what_eager_ar_decodes():
    """The shipped tiny image GPT on CUDA, float32, T 0, a GPU's option defaults: every lossless image method of the
    method table (EAGLE-2's and ADT-Tree's verifies and growths replayed from graphs) equals graphs-off AR."""
    from specgen.generate.image import ImageGenConfig, generate_images, load_image_model
    from specgen.models import graphs
    from specgen.request import parse_request

    def images(method):
        return generate_images(im, parse_request(ImageGenConfig(method=method, num=2, temperature=0.0,
                                                                device="cuda"), "image"))[0]

    im = load_image_model("tiny-image-gpt", device="cuda", graphs="off")
    ar = images("ar")
    graphs.attach(im.model, "on")
    graphs.attach(im.drafter_net, "on")
    for method in LOSSLESS_IMAGE:
        got = images(method)
        assert [s.tokens for s in got] == [s.tokens for s in ar], method
    assert im.model.graphs.replays > 0
    # whole tree growths were captured: a capture fails on any host sync, so each graph is a growth without one
    grows = [graph for key, (_, graph, _) in im.drafter_net.graphs.graphs.items() if isinstance(key, tuple)]
    assert grows and all(graph is not None for graph in grows)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_image_trees_run_ahead_decode_what_eager_ar_decodes(dtype):
    """EAGLE-2 and ADT-Tree with 4 tree steps a host read (`run_ahead`: each step's catch-up, growth, verdict and next
    pairs on the device, its rejected nodes hidden by the key mask until the read) on CUDA, a GPU's option defaults:
    graphs-off AR's images at batch 1 and 2, every drafter step and `advance` captured (no host sync inside); at T 1,
    EAGLE-2's per-step trees' images."""
    from specgen.generate.image import ImageGenConfig, generate_images, load_image_model
    from specgen.methods import get_method
    from specgen.methods.options import gpu_defaults
    from specgen.models import graphs
    from specgen.request import parse_request

    def images(method, batch, temperature=0.0, **options):
        cfg = ImageGenConfig(method=method, num=3, temperature=temperature, device="cuda", batch_size=batch,
                             method_options=gpu_defaults(get_method(method).options_type) | options)
        return [s.tokens for s in generate_images(im, parse_request(cfg, "image"))[0]]

    im = load_image_model("tiny-image-gpt", device="cuda", graphs="off", dtype=dtype)
    ar = images("ar", 1)
    graphs.attach(im.model, "on")
    graphs.attach(im.drafter_net, "on")
    for method in ("eagle2", "adt-tree"):
        for batch in (1, 2):
            assert images(method, batch, run_ahead=4) == ar, (method, batch)
    # sampled: EAGLE-2's per-step trees' images from the same seeds (each step's walk inside `advance`'s replay)
    assert images("eagle2", 2, 1.0, run_ahead=4) == images("eagle2", 2, 1.0)
    for g in (im.model.graphs, im.drafter_net.graphs):
        steps = [graph for key, (_, graph, _) in g.graphs.items() if isinstance(key, tuple) and key[0] == "tree-ahead"]
        assert steps and all(graph is not None for graph in steps)


def test_captured_xspecmesh_heads_decode_what_eager_ar_decodes():
    """The shipped tiny mesh GPT + heads on CUDA, float32, T 0: lossless XSpecMesh with the backbone's steps and the
    heads' step replayed from graphs equals graphs-off AR, its heads' chain and `gpu_graphs.py`'s goal row (vertex
    lookup, a candidate tree of up to 63 nodes), and the heads' step was captured (no host sync), as were the verify
    steps that run the heads ahead inside their replay (`ReadAhead`)."""
    from specgen.decoding.sampling import SamplingParams as SP
    from specgen.eval.mesh_bench import benchmark_clouds
    from specgen.generate.mesh import load_mesh_model
    from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions
    from specgen.methods.xspecmesh_pool import ReadAhead
    from specgen.models import graphs

    loaded = load_mesh_model(heads="xspecmesh-ca-tiny", device="cuda", graphs="off")
    dec = loaded.decoder
    clouds = [pc for _, pc in benchmark_clouds(loaded.target.meta, 3, 0, "cuda")]
    chain = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1)
    ar = [r.tokens for r in MeshDecoder(dec.model, None, dec.eos_id).generate_batch(clouds, SP(), 128, chain)]
    graphs.attach(dec.model.decoder, "on")
    graphs.attach(dec.heads, "on")
    for opts in (chain, dataclasses.replace(chain, vertex_lookup=True, candidate_tree="9,2,1,1")):
        got = [r.tokens for r in dec.generate_batch(clouds, SP(), 128, opts, batch_size=2)]
        assert got == ar, opts
    assert dec.heads.graphs.replays > 0 and all(graph is not None for _, graph, _ in dec.heads.graphs.graphs.values())
    ahead = [graph for key, (_, graph, _) in dec.model.decoder.graphs.graphs.items()
             if isinstance(key, tuple) and isinstance(key[1], ReadAhead)]
    assert ahead and all(graph is not None for graph in ahead)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_xspecmesh_run_ahead_decodes_what_ar_decodes_graphs_on_and_off(dtype):
    """Lossless greedy XSpecMesh with 4 chain steps a host read (`run_ahead`: each step's verdict and next chain on the
    device, its rejected nodes hidden by the key mask until the read commits) on CUDA: AR's tokens with graphs off and
    on, at batch 1 and 2, and with graphs on every step and its `advance` a replay (no host sync inside)."""
    from specgen.decoding.sampling import SamplingParams as SP
    from specgen.eval.mesh_bench import benchmark_clouds
    from specgen.generate.mesh import load_mesh_model
    from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions
    from specgen.models import graphs

    loaded = load_mesh_model(heads="xspecmesh-ca-tiny", device="cuda", graphs="off", dtype=dtype)
    dec = loaded.decoder
    clouds = [pc for _, pc in benchmark_clouds(loaded.target.meta, 3, 0, "cuda")]
    opts = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1, vertex_lookup=True, run_ahead=4)
    ar = [r.tokens for r in MeshDecoder(dec.model, None, dec.eos_id).generate_batch(clouds, SP(), 128, opts)]
    for mode in ("off", "on"):
        graphs.attach(dec.model.decoder, mode)
        graphs.attach(dec.heads, mode)
        for batch in (1, 2):
            got = [r.tokens for r in dec.generate_batch(clouds, SP(), 128, opts, batch_size=batch)]
            assert got == ar, (mode, batch)
    g = dec.model.decoder.graphs
    steps = [graph for key, (_, graph, _) in g.graphs.items() if isinstance(key, tuple) and key[0] == "chain-ahead"]
    assert g.eager_calls == 0 and steps and all(graph is not None for graph in steps)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_captured_mesh_prefill_has_the_eager_prefills_bits(dtype):
    """The shipped tiny mesh GPT on CUDA: each cloud's prefill as one replay (`MeshTarget.replayed_prefill`: the
    encoder in prompt mode, the conditions' K/V, the start as a decode step) against graphs off, in a batch's two rows:
    logits, hidden, condition, each row's slot 0 and conditions' K/V bitwise; the second cloud a replay."""
    from specgen.eval.mesh_bench import benchmark_clouds
    from specgen.generate.mesh import load_mesh_model
    from specgen.mesh.target import MeshTarget

    got = []
    for mode in ("off", "on"):
        loaded = load_mesh_model(device="cuda", dtype=dtype, graphs=mode)
        model = loaded.decoder.model
        clouds = [pc for _, pc in benchmark_clouds(loaded.target.meta, 2, 0, "cuda")]
        target = MeshTarget(model, clouds)
        cache, outs = target.new_cache(2, 64), []
        with torch.inference_mode():
            for i in range(2):
                view = cache.rows(i, i + 1)
                out = target.prefill(torch.tensor([[i]]), view)
                cache.absorb(view, i)
                outs += [out.logits, out.features, target.conditions[i]]
        got.append(outs + [cache.k[:, :, :, :1], cache.v[:, :, :, :1], *cache.cross[0], *cache.cross[-1]])
    assert model.decoder.graphs.prompts.recorded == 1 and model.decoder.graphs.prompts.replays == 2
    assert all(torch.equal(a, b) for a, b in zip(*got))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_captured_class_prefill_has_the_eager_prefills_bits(dtype):
    """The shipped tiny image GPT on CUDA under guidance: each image's class position as one replay
    (`CFGTarget.prefill`: `static_step.first_node`) against graphs off, in a batch's second sequence too: the combined
    logits, hidden and each branch row's slot 0 bitwise; the second image a replay."""
    from specgen.generate.image import load_image_model
    from specgen.image.target import CFGTarget

    got = []
    for mode in ("off", "on"):
        model = load_image_model("tiny-image-gpt", device="cuda", dtype=dtype, graphs=mode).model
        target = CFGTarget(model, 4.0)
        cache, outs = target.new_cache(2, 64), []
        with torch.inference_mode():
            for i, label in enumerate([3, 7]):
                view = cache.rows(2 * i, 2 * i + 2)
                out = target.prefill(torch.tensor([[label]]), view)
                cache.absorb(view, 2 * i)
                outs += [out.logits, out.features]
        got.append(outs + [cache.k[:, :, :, :1], cache.v[:, :, :, :1]])
    assert model.graphs.prompts.recorded == 1 and model.graphs.prompts.replays == 2
    assert all(torch.equal(a, b) for a, b in zip(*got))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_captured_t2i_steps_decode_what_eager_decodes(dtype):
    """A t2i target's caption padding hidden inside its captured steps (`StaticInputs.key_mask`): AR and EAGLE-2 over
    three captions of 2, 6 and 4 real slots, two rows at a time, equal graphs off; the target's steps all replays."""
    from specgen.image.target import CaptionCFGTarget
    from specgen.methods import run_batch
    from specgen.methods.eagle import EagleTreeDrafter, FixedShape, TreeShape
    from specgen.models import graphs
    from specgen.models.eagle import EagleNet
    from specgen.models.layout import decode_layout
    from tests.image.test_t2i_generate import GRID, caption, tiny_t2i_gpt

    captions, n, got = [caption(i, valid) for i, valid in enumerate([2, 6, 4])], GRID * GRID, []
    for mode in ("off", "on"):
        model = decode_layout(tiny_t2i_gpt(1).to("cuda", dtype))
        net = EagleNet.from_target(model).to("cuda", dtype).eval()
        graphs.attach(model, mode)
        target = CaptionCFGTarget(model, 3.0, captions)
        prompts = [target.prompt(i) for i in range(len(captions))]
        tree = lambda i: EagleTreeDrafter(net, model.output, FixedShape(TreeShape(3, 4, 12)), max_len=64,  # noqa: E731
                                          guidance=3.0)
        got.append([[r.tokens for r in run_batch(target, make, prompts, n, SamplingParams(), batch_size=2).results]
                    for make in (lambda i: EmptyDrafter(), tree)])
    assert got[0] == got[1] and model.graphs.replays > 0 and model.graphs.eager_calls == 0


@pytest.mark.parametrize("captured", [False, True])
def test_a_bf16_chain_scores_each_node_bitwise_as_ar_steps(captured):
    """Low-precision exactness on the GPU itself: with a loader's layout (SlicedLinear products in 64-row slices) and
    the invariant attention, eager and captured, a 16-node chain verify scores each node bitwise as the 16
    AR steps did; and each SlicedLinear row of SmolLM2's product shapes is bitwise the row alone at 16, 64 and 130
    rows."""
    from specgen.models import graphs
    from specgen.models.layout import decode_layout
    from specgen.models.sliced_linear import SlicedLinear
    from tests.models.test_graphs import chain_against_steps

    model = decode_layout(tiny_model(0).to("cuda", torch.bfloat16))
    assert any(type(m) is SlicedLinear for m in model.modules())
    graphs.attach(model, "on" if captured else "off")
    steps, chain = chain_against_steps(model, PROMPT)
    assert torch.equal(steps, chain)
    for n, k in ((960, 576), (576, 1536), (49152, 576)):
        lin = SlicedLinear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(130, k, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            alone = torch.cat([lin(x[j: j + 1]) for j in range(130)])
            assert all(torch.equal(lin(x[:m]), alone[:m]) for m in (16, 64, 130)), (n, k)


@pytest.mark.parametrize("chunk,length,replays", [(None, 200, 1), (128, 165, 2)])
def test_a_long_bf16_prompt_prefilled_in_captured_chunks_has_one_eager_forwards_bits(chunk, length, replays,
                                                                                     monkeypatch):
    """A prompt prefilled into a batch's second row as captured chunks (`--graphs on`: one padded chunk of the default
    PROMPT_NODES, or two of 128 nodes, the tiny model's context being 256), against one eager forward (`off`): the
    last logits, the hidden states and the row's keys and values bitwise."""
    from specgen.models import graphs
    from specgen.models.layout import decode_layout

    if chunk:
        monkeypatch.setattr(graphs, "PROMPT_NODES", (chunk,))
    prompt = torch.randint(0, 64, (1, length), generator=torch.Generator().manual_seed(0))
    got = []
    for mode in ("off", "on"):
        model = decode_layout(tiny_model(0).to("cuda", torch.bfloat16))
        graphs.attach(model, mode)
        target = ModelTarget(model)
        cache = target.new_cache(2, prompt.shape[1] + 8)
        view = cache.rows(1, 2)
        with torch.inference_mode():
            out = target.prefill(prompt.cuda(), view)
        p = prompt.shape[1]
        got.append((out.logits, out.features, view.k[:, 0, :, :p], view.v[:, 0, :, :p]))
    assert model.graphs.prompts.replays == replays
    assert all(torch.equal(a, b) for a, b in zip(*got))


@pytest.mark.parametrize("captured", [False, True])
def test_a_bf16_tree_scores_its_path_bitwise_as_ar_steps(captured):
    """Trees on the GPU: each query over its visible slots in AR's order (the Triton list kernel, native/cuda_ops.py),
    so a tree verify's path nodes get the AR steps' bits, eager and captured (a target's trees are captured too)."""
    from specgen.models import graphs
    from specgen.models.layout import decode_layout
    from tests.models.test_graphs import tree_against_steps

    model = decode_layout(tiny_model(0).to("cuda", torch.bfloat16))
    steps = graphs.attach(model, "on" if captured else "off")
    ar, path = tree_against_steps(model, PROMPT)
    assert torch.equal(ar, path)
    assert not captured or (steps.eager_calls == 0 and steps.replays > 0)
