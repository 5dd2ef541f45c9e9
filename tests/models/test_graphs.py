"""Captured steps on the CPU: the static step reads nothing on the host, keeps its bucket's shapes, and decodes what
the eager forward decodes, run uncaptured and through a replay emulation (the CUDA replay runs in tests/test_gpu.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.errors import UsageError
from specgen.image.target import CFGTarget
from specgen.methods import get_method, run_batch
from specgen.methods.options import JacobiOptions, NgramOptions, gpu_defaults
from specgen.methods.text import EmptyDrafter, JacobiDrafter, NgramDrafter
from specgen.models import graphs, kernel_choice, static_step
from specgen.models.kernel_choice import attention_path
from specgen.models.sliced_linear import SLICE_ROWS, SlicedLinear
from specgen.models.static_step import Bucket, StaticInputs, target_step
from tests.conftest import decode
from tests.conftest import (EXAONE4, GEMMA, GEMMA1, GEMMA2, GRANITE, LOSSLESS_TEXT, MOE, OLMO2, OLMO3, OLMOE, QWEN2_MOE,
                            SLIDING, method_drafter, tiny_model, unwindowed)
from tests.image_fixtures import tiny_image_target

PROMPT = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
DRAFTERS = {"ar": EmptyDrafter, "ngram": lambda: NgramDrafter(NgramOptions(num_draft=4, max_ngram=3, min_ngram=1)),
            "jacobi": lambda: JacobiDrafter(JacobiOptions(4), seed=0)}


class Traced:
    """A CUDA graph's replay on the CPU: the step traced once (make_fx), so that Python values and tensors made
    outside the static buffers are frozen into it as a capture freezes them; a replay reruns the traced ops over the
    same buffers and writes into the first call's outputs, as a graph's replay does. A tensor made from Python data
    inside the step (a copy from host memory, which a capture cannot hold) is refused as a capture refuses it."""

    def __init__(self, step) -> None:
        step()  # the warm-up a capture runs first: lazy initialisations (a weight's tiles) stay outside the graph
        self.program = make_fx(step)()
        if any(node.target is torch.ops.aten.lift_fresh_copy.default for node in self.program.graph.nodes):
            raise RuntimeError("a tensor made from host data inside the step")
        self.outs = tuple(self.program())

    def replay(self) -> None:
        for out, new in zip(self.outs, self.program()):
            out.copy_(new)


def traced(self, step):
    """`StepGraphs.captured` on the CPU: (outputs, the replayable trace)."""
    graph = Traced(step)
    return graph.outs, graph


@pytest.fixture
def capture(request, monkeypatch) -> bool:
    """Static steps uncaptured ("static") or captured through the replay emulation ("traced")."""
    if request.param == "traced":
        monkeypatch.setattr(graphs.StepGraphs, "captured", traced)
    return request.param == "traced"


BOTH_SLOW = pytest.mark.parametrize("capture", ["static", pytest.param("traced", marks=pytest.mark.slow)],
                                    indirect=True)


def static_target(model, capture=False) -> ModelTarget:
    graphs.attach(model, "on", capture=capture)
    return ModelTarget(model)


def fake_step(model, bucket: Bucket, step=target_step):
    """Run a bucket's step under FakeTensorMode over a buffer twice its width: a read of a tensor value on the host
    raises there."""
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.inference_mode():
        cfg = model.cfg
        k = torch.zeros(cfg.n_layers, bucket.rows + 1, cfg.n_kv_heads, 2 * bucket.width, cfg.hd, dtype=model.dtype)
        x = StaticInputs.for_bucket(bucket, "cpu")
        x = StaticInputs(*(mode.from_tensor(t) for t in (x.tokens, x.positions, x.meta, x.tree)))
        return step(model, x, mode.from_tensor(k), mode.from_tensor(k.clone()), None, bucket.width)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bucket", [Bucket(1, 1, 64), Bucket(2, 8, 64)])
@pytest.mark.parametrize("over", [{}, MOE, QWEN2_MOE], ids=["llama", "moe", "qwen2-moe"])
def test_static_step_reads_nothing_on_the_host_and_keeps_the_bucket_shape(dtype, bucket, over):
    """(A routed feed-forward too: its static path, `moe.static_routing`, sizes nothing by the routing; Qwen2-MoE's
    shared expert pads its gate to whole lanes by shapes alone.)"""
    model = tiny_model(0, **over).to(dtype)
    logits, hidden = fake_step(model, bucket)
    assert logits.shape == (bucket.rows, bucket.nodes, model.cfg.vocab_size)
    assert hidden.shape == (bucket.rows, bucket.nodes, model.cfg.dim)


@pytest.mark.parametrize("sliced", [True, False])
def test_buckets_of_sliced_products_fill_whole_slices_so_no_product_copies_its_rows(sliced):
    """With SlicedLinear products (a GPU model's low-precision layout) a bucket pads its nodes up to a whole slice of
    rows, so a captured step's products read their rows in place; the control: plain products keep the bucket as it
    was, and a sliced model's bucket that no slice divides copies before each product (the copy the fill saves)."""
    model = tiny_model(0).to(torch.bfloat16)
    for lin in model.modules():
        if type(lin) is torch.nn.Linear and sliced:
            lin.__class__ = SlicedLinear
    steps = graphs.attach(model, "on", capture=False)
    steps.new_cache(3, 40)
    fill = SLICE_ROWS if sliced else 1
    assert steps.bucket(1, 1, 20).nodes == max(1, fill) and steps.bucket(2, 5, 20).nodes == max(8, fill // 2)
    assert steps.bucket(3, 1, 20).nodes == 1  # 3 rows fill no slice: as before

    def copies(b: Bucket) -> int:
        x = StaticInputs.for_bucket(b, "cpu")
        with torch.inference_mode():
            trace = make_fx(lambda: target_step(model, x, steps.k, steps.v, None, b.width))()
        return sum(n.target is torch.ops.aten.copy_.default for n in trace.graph.nodes)

    assert copies(steps.bucket(1, 1, 20)) == 0
    assert copies(steps.bucket(3, 1, 20)) == (len(model.layers) * 5 + 1 if sliced else 0)  # each product's rows


def test_a_staged_buckets_visibility_is_each_nodes_committed_pending_and_own_slots():
    """A bucket's visibility over its cache slots: a row's committed slots, the pending slots its tree mask names and
    its own (a padding node and a padding row: the causal base's, their own and the nodes before them), by a walk over
    the slots."""
    model = tiny_model(0)
    steps = graphs.attach(model, "on", capture=False)
    steps.new_cache(3, 40)
    b = steps.bucket(3, 3, 20)  # 4 rows of 4 nodes: a padding row, and a padding node in every row
    x = StaticInputs.for_bucket(b, "cpu")
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # a root and two children
    x.meta.copy_(torch.tensor(static_step.meta_rows([4, 0, 17], 3, b.rows, steps.capacity)))
    steps.stage_tree(x, 3, 3, 1, tree)
    lengths = [4, 0, 17, 0]
    want = torch.zeros(b.rows, 1, b.nodes, b.width, dtype=torch.bool)
    for r in range(b.rows):
        for q in range(b.nodes):
            for slot in range(b.width):
                j = slot - lengths[r]
                real = r < 3 and q < 3 and 0 <= j < 3
                want[r, 0, q, slot] = j < 0 or (bool(tree[q, j]) if real else j <= q)
    assert torch.equal(static_step.visibility(x, b.width), want)


def test_a_buckets_tree_masks_hold_each_calls_mask_and_a_chain_reuses_the_causal_base():
    """Trees and chains of other sizes in turn over one bucket's inputs: each call's real nodes see exactly its mask
    (nothing past its nodes), every node sees itself and no later node (padding ones: the causal base's), and a chain
    after a chain writes nothing (a chain's length changes every step: no copy a step)."""
    model = tiny_model(0)
    steps = graphs.attach(model, "on", capture=False)
    steps.new_cache(3, 40)
    b = steps.bucket(3, 5, 20)
    x = StaticInputs.for_bucket(b, "cpu")
    root_and_children = lambda s: torch.eye(s, dtype=torch.bool) | (torch.arange(s) > 0)[:, None] & (  # noqa: E731
        torch.arange(s) == 0)[None, :]
    calls = [(3, 3, root_and_children(3)), (2, 2, None), (2, 5, None), (3, 2, root_and_children(2)),
             (1, 4, root_and_children(4)), (3, 1, None), (3, 3, root_and_children(3))]
    for i, (n, s, tree) in enumerate(calls):
        before = x.tree._version
        steps.stage_tree(x, n, s, 1, tree)
        mask = torch.ones(s, s, dtype=torch.bool).tril() if tree is None else tree
        assert torch.equal(x.tree[:n, :s, :s], mask.expand(n, s, s)), (n, s)
        assert not x.tree[:n, :s, s:].any()  # no real node sees a node past the call's
        assert torch.equal(x.tree & ~x.causal, torch.zeros_like(x.tree))  # nothing after a node, anywhere
        assert x.tree.diagonal(dim1=1, dim2=2).all()
        if i in (1, 2):  # a chain after a tree copies the causal base back; the chain after it, nothing
            assert (x.tree._version == before) == (i == 2)


def test_a_step_that_reads_the_host_fails_the_check():
    """The control: the same harness refuses a step that reads a value (as `.item()` would sync a GPU)."""
    def reads(model, x, k, v, cross, width):
        if int(x.meta[0, 0]) > 0:
            pass
        return target_step(model, x, k, v, cross, width)

    with pytest.raises(Exception, match="[Dd]ata.dependent|item|local_scalar"):
        fake_step(tiny_model(0), Bucket(1, 4, 64), reads)


# targets whose blocks differ from Llama's: (`tiny_model`'s overrides, new tokens, controls: overrides that each
# change the tokens)
TARGETS = {
    "nope": (dict(nope_layers=(1,)), 24, [{}]),  # SmolLM3-style: layer 1 without RoPE
    # Gemma 3: scaled embedding, GeGLU, sandwich and q/k norms, a local layer with its own RoPE base; the scale and
    # the local base each change the tokens
    "gemma": (GEMMA, 24, [{**GEMMA, "embed_scale": 1.0}, {**GEMMA, "local_layers": (1,)}]),
    # Gemma 1: scaled embedding and GeGLU in Llama's block (its residual adds in the fused norms); each changes the
    # tokens
    "gemma1": (GEMMA1, 24, [{"ffn_act": "gelu_tanh"}, {"embed_scale": 32**0.5}]),
    # Gemma 2: Gemma 3's block without q/k norms, scores capped, layer 0 sliding (40 tokens: past its window of 6);
    # the cap, the window and the scale each change the tokens (the logit cap, monotone, cannot under greedy)
    "gemma2": (GEMMA2, 40, [{**GEMMA2, "attn_softcap": 0.0}, unwindowed(GEMMA2), {**GEMMA2, "embed_scale": 1.0}]),
    # OLMo 2: no pre-norms (no fused residual norms), sandwich norms, q and k normed over their whole projections;
    # per-head q/k norms and added pre-norms each change the tokens
    "olmo2": (OLMO2, 24, [{**OLMO2, "qk_norm_span": "head"}, {**OLMO2, "pre_norms": True}]),
    # OLMo 3: OLMo 2's block, layer 0 sliding (40 tokens: past its window of 6) with its own RoPE base; the window
    # and the base each change the tokens
    "olmo3": (OLMO3, 40, [unwindowed(OLMO3), {**OLMO3, "local_rope_theta": 0.0}]),
    # EXAONE 4: no pre-norms, per-head q/k norms, layer 0 sliding, layer 1 NoPE; the window, RoPE in layer 1 and
    # whole-span q/k norms each change the tokens
    "exaone4": (EXAONE4, 40, [unwindowed(EXAONE4), {**EXAONE4, "nope_layers": ()}, {**EXAONE4, "qk_norm_span": "all"}]),
    # Granite: Llama's block with its embeddings scaled and its logits divided (its other multipliers are weights);
    # the embedding scale changes the tokens (the divisor, monotone, cannot under greedy)
    "granite": (GRANITE, 24, [{**GRANITE, "embed_scale": 1.0}]),
    # Mixtral's routed experts in Llama's block (its residual adds in the fused norms); the renormalisation and k each
    # change the tokens
    "moe": (MOE, 24, [{**MOE, "expert_renorm": False}, {**MOE, "experts_per_token": 1}]),
    # Qwen2-MoE: q/k/v biases, routed experts unrenormalised beside a shared expert gated per row (its sigmoid over
    # whole lanes: the float32 CPU sigmoid's scalar tail would give a row other bits among other row counts); the
    # renormalisation and the shared expert each change the tokens
    "qwen2-moe": (QWEN2_MOE, 24, [{**QWEN2_MOE, "expert_renorm": True}, {**QWEN2_MOE, "shared_expert_dim": 0}]),
    # OLMoE: pre-norms with q and k normed over their whole projections, routed experts; per-head norms and the
    # renormalisation each change the tokens
    "olmoe": (OLMOE, 24, [{**OLMOE, "qk_norm_span": "head"}, {**OLMOE, "expert_renorm": True}]),
    # local layers sliding over a window of 5-6 positions, decoded well past it from prompts of 12 and 7 tokens
    **{f"sliding-{kind}": (over, 40, [unwindowed(over)]) for kind, over in SLIDING.items()},
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", LOSSLESS_TEXT)
def test_other_blocks_keep_every_lossless_method_on_ar_eager_and_static(name, target):
    """Each TARGETS block with each lossless text method equals eager AR of a batch of rows of different lengths,
    eagerly and as static steps (which scale, norm, turn and mask their layers as eager forwards do: a sliding layer's
    mask by the nodes' positions, built from device tensors). Controls: each changes the tokens."""
    (over, new, controls), prompts = TARGETS[target], [PROMPT, PROMPT[:7]]
    eager = run_batch(ModelTarget(tiny_model(0, **over)), lambda i: EmptyDrafter(), prompts, new, SamplingParams())
    make = lambda i: method_drafter(name, 0, False)  # noqa: E731
    static = tiny_model(0, **over)
    for target in (ModelTarget(tiny_model(0, **over)), static_target(static)):
        got = run_batch(target, make, prompts, new, SamplingParams())
        assert [r.tokens for r in got.results] == [r.tokens for r in eager.results]
    # (a capped model attends chunked on a CPU, where tree steps run eager: `StepGraphs.servable`; the rest replay)
    assert static.graphs.replays > 0 and (static.graphs.eager_calls == 0 or over.get("attn_softcap"))
    for other in controls:
        got = run_batch(ModelTarget(tiny_model(0, **other)), lambda i: EmptyDrafter(), prompts, new, SamplingParams())
        assert [r.tokens for r in got.results] != [r.tokens for r in eager.results]


@pytest.mark.parametrize("name,gpu,batch,capture",
                         [(name, gpu, batch, "static") for name in LOSSLESS_TEXT for gpu in (False, True)
                          for batch in (1, 3)] + [("ngram", False, 3, "traced"), ("ngram", True, 3, "traced")],
                         indirect=["capture"])
def test_static_steps_decode_what_eager_ar_decodes(name, gpu, batch, capture):
    """Every lossless text method of the method table, at the CPU's and a GPU's option defaults (tests/test_gpu.py
    runs the same on CUDA): AR's tokens, every forward a replay of a static step (none eager)."""
    prompts = [PROMPT, PROMPT[:7], [3, 1, 4, 1, 5]][:batch]
    eager = run_batch(ModelTarget(tiny_model(0)), lambda i: EmptyDrafter(), prompts, 24, SamplingParams())
    model = tiny_model(0)
    target = static_target(model, capture)
    make = lambda i: method_drafter(name, 0, gpu)  # noqa: E731
    got = run_batch(target, make, prompts, 24, SamplingParams())
    assert [r.tokens for r in got.results] == [r.tokens for r in eager.results]
    assert model.graphs.replays > 0 and model.graphs.eager_calls == 0
    recorded = model.graphs.recorded  # a second call replays what the first captured: nothing new
    again = run_batch(target, make, prompts, 24, SamplingParams())
    assert [r.tokens for r in again.results] == [r.tokens for r in got.results]
    assert model.graphs.recorded == recorded
    assert all(graph is not None for _, graph, _ in model.graphs.graphs.values()) == capture


@pytest.mark.parametrize("capture", ["traced"], indirect=True)
@pytest.mark.parametrize("name", ["ar", "ngram", "eagle2"])
def test_a_sampled_judge_replays_its_walk_and_draws_what_the_hosts_walk_draws(name, capture, monkeypatch):
    """At T > 0 a GPU judges every row of a step in one replay of a walk the target captured (`accept.device_walks`,
    its logits filtered inside: top-k, top-p): the tokens a CPU draws walking a node at a time, from the same uniforms
    (text AR and n-gram chains, EAGLE-2's image trees; batch 2). Each later step replays its bucket's walk."""
    from specgen.decoding import accept
    from specgen.generate.image_methods import ImageParts, build_image_method
    from specgen.models.eagle import EagleNet

    def decode(walk_on_device: bool):
        monkeypatch.setattr(accept, "HOST_WALK", frozenset() if walk_on_device else frozenset({"cpu"}))
        if name != "eagle2":
            model = tiny_model(0)
            target = static_target(model, capture) if walk_on_device else ModelTarget(model)
            got = run_batch(target, lambda i: DRAFTERS[name](), [PROMPT, PROMPT[:7]], 24,
                            SamplingParams(1.0, top_k=20, top_p=0.9), generators=gens())
            return [r.tokens for r in got.results], model
        model = tiny_image_target(0)
        torch.manual_seed(1)
        net = EagleNet.from_target(model).eval()
        if walk_on_device:
            graphs.attach(model, "on", capture=capture)
        parts = ImageParts(model, CFGTarget(model, 3.0), net, None, 4)
        got = run_batch(parts.target, lambda i: build_image_method(name, parts, {})[0], [[0], [1]], 16,
                        SamplingParams(1.0, top_k=50), generators=gens())
        return [r.tokens for r in got.results], model

    def gens() -> list[torch.Generator]:
        return [torch.Generator().manual_seed(7 + i) for i in range(2)]

    want, _ = decode(False)
    got, model = decode(True)
    assert got == want
    walks = {key: n for key, n in model.graphs.uses.items() if isinstance(key, tuple) and key[0] == "walk"}
    assert sum(walks.values()) > len(walks)  # replays: a step's walk captured once a bucket


@pytest.mark.parametrize("capture", ["traced"], indirect=True)
def test_the_replay_emulation_freezes_what_a_capture_freezes(capture, monkeypatch):
    """The control: a step that reads Python state (here a call counter) decodes one way run uncaptured and another
    way replayed, where the value read at capture stays; so the emulated runs above can fail."""
    calls = iter(range(10**6))

    def drifts(model, x, k, v, cross, width):
        logits, hidden = target_step(model, x, k, v, cross, width)
        logits[..., next(calls) % 7] += 1e4
        return logits, hidden

    monkeypatch.setitem(graphs.KINDS, type(tiny_model(0)), graphs.StepKind(drifts))
    runs = []
    for replayed in (False, True):
        got = run_batch(static_target(tiny_model(0), replayed), lambda i: EmptyDrafter(), [PROMPT], 12,
                        SamplingParams())
        runs.append(got.results[0].tokens)
    assert runs[0] != runs[1] and len(set(runs[1][1:])) == 1  # after the prefill's: the token the capture forced


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_step_over_its_width_bucket_gives_the_bits_of_the_whole_buffer(dtype):
    """Slots past a bucket's width are hidden from every node: reading fewer of them changes no bit."""
    torch.manual_seed(0)
    model = tiny_model(0).to(dtype)
    cfg = model.cfg
    k = torch.randn(cfg.n_layers, 3, cfg.n_kv_heads, 512, cfg.hd).to(dtype)  # 2 rows + the scratch row
    v = torch.randn_like(k)
    x = StaticInputs.for_bucket(Bucket(2, 4, 256), "cpu")
    x.tokens.copy_(torch.randint(0, cfg.vocab_size, (2, 4)))
    x.meta.copy_(torch.tensor([[200, 37], [0, 1]]))  # lengths; cache rows written
    x.positions.copy_(x.meta[0][:, None] + torch.arange(4))
    x.tree.copy_(x.causal)
    with torch.inference_mode():
        narrow = target_step(model, x, k, v, None, 256)
        whole = target_step(model, x, k, v, None, None)
        wider = target_step(model, x, k, v, None, 384)
    for a, b, c in zip(narrow, whole, wider):
        assert torch.equal(a, b) and torch.equal(a, c)
    x.meta[0, 0] = 300  # the control: row 0 now sees slots past 256, which the narrow bucket cuts off
    with torch.inference_mode():
        assert not torch.equal(target_step(model, x, k, v, None, 256)[0][0],
                               target_step(model, x, k, v, None, None)[0][0])


@pytest.mark.parametrize("capture", ["traced"], indirect=True)
def test_a_step_that_makes_a_tensor_from_host_data_cannot_be_captured(capture, monkeypatch):
    def copies(model, x, k, v, cross, width):
        logits, hidden = target_step(model, x, k, v, cross, width)
        return logits + torch.tensor(0.0), hidden

    monkeypatch.setitem(graphs.KINDS, type(tiny_model(0)), graphs.StepKind(copies))
    with pytest.raises(UsageError, match="cannot be captured .a tensor made from host data"):
        run_batch(static_target(tiny_model(0), True), lambda i: EmptyDrafter(), [PROMPT], 4, SamplingParams())


@BOTH_SLOW
def test_a_decode_across_width_buckets_decodes_what_eager_ar_decodes(capture, monkeypatch):
    monkeypatch.setattr(graphs, "MIN_WIDTH", 8)  # 12-token prompts + 24 new tokens cross widths 16, 32 and 64
    prompts = [PROMPT, PROMPT[:7]]
    eager = run_batch(ModelTarget(tiny_model(0)), lambda i: EmptyDrafter(), prompts, 24, SamplingParams())
    model = tiny_model(0)
    got = run_batch(static_target(model, capture), lambda i: DRAFTERS["ngram"](), prompts, 24, SamplingParams())
    assert [r.tokens for r in got.results] == [r.tokens for r in eager.results]
    assert {b.width for b in model.graphs.uses} == {16, 32, 64}


def test_a_tree_verify_scores_each_node_as_the_eager_forward_does():
    torch.manual_seed(0)
    model = tiny_model(1)
    target = static_target(model)
    cache = target.new_cache(2, 64)
    target.prefill(torch.tensor([PROMPT, PROMPT[::-1]]), cache)
    parents = [-1, 0, 0, 1, 1, 2]  # a root with two children, each with children
    mask = torch.zeros(6, 6, dtype=torch.bool)
    for i, p in enumerate(parents):
        mask[i, i] = True
        while p >= 0:
            mask[i, p], p = True, parents[p]
    tokens = torch.randint(0, model.cfg.vocab_size, (2, 6))
    positions = torch.tensor([[12, 13, 13, 14, 14, 14]] * 2)
    got = target.forward(tokens, positions, cache, mask).logits
    model.graphs = None
    want = target.forward(tokens, positions, cache, mask).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def chain_against_steps(model, prompt: list[int], n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [n, V] of n greedy AR steps after the prompt, logits [n, V] of the same n tokens verified as one chain)
    through the model's steps (its static ones where attached), on the model's device."""
    target, dev = ModelTarget(model), next(model.parameters()).device
    target.device = dev

    def ids(rows: list) -> torch.Tensor:
        return torch.tensor(rows, device=dev)

    with torch.inference_mode():
        cache = target.new_cache(1, len(prompt) + n + 1)
        tok, steps, toks = int(target.prefill(ids([prompt]), cache).logits[0, -1].argmax()), [], []
        for i in range(n):
            toks.append(tok)
            steps.append(target.forward(ids([[tok]]), ids([[len(prompt) + i]]), cache, None).logits[0, 0])
            cache.commit(0, [0])
            tok = int(steps[-1].argmax())
        cache = target.new_cache(1, len(prompt) + n + 1)
        target.prefill(ids([prompt]), cache)
        chain = target.forward(ids([toks]), len(prompt) + torch.arange(n, device=dev)[None], cache, None).logits[0]
    return torch.stack(steps), chain


def tree_against_steps(model, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [4, V] of 4 greedy AR steps after the prompt, logits [4, V] of the same tokens as the path 0-2-4-5 of a
    6-node tree verify, a sibling beside each of its first two nodes), through the model's steps as attached."""
    steps, _ = chain_against_steps(model, prompt, 4)
    target, dev = ModelTarget(model), next(model.parameters()).device
    target.device = dev
    toks = [int(steps[i].argmax()) for i in range(3)]
    with torch.inference_mode():
        cache = target.new_cache(1, len(prompt) + 8)
        first = int(target.prefill(torch.tensor([prompt], device=dev), cache).logits[0, -1].argmax())
        parents = [-1, 0, 0, 2, 2, 4]  # nodes 1 and 3: siblings of the path's nodes 2 and 4
        tokens = [first, (toks[0] + 1) % model.cfg.vocab_size, toks[0], (toks[1] + 1) % model.cfg.vocab_size,
                  toks[1], toks[2]]
        mask = torch.eye(6, dtype=torch.bool, device=dev)
        for i, p in enumerate(parents):
            while p >= 0:
                mask[i, p], p = True, parents[p]
        depth = mask.sum(-1) - 1
        out = target.forward(torch.tensor([tokens], device=dev), (len(prompt) + depth)[None], cache, mask).logits[0]
    return steps, out[[0, 2, 4, 5]]


@pytest.mark.parametrize("capture", ["static", "traced"], indirect=True)
def test_a_bf16_tree_scores_its_path_bitwise_as_ar_steps(capture):
    """A target's tree verify runs in its static steps where the attention takes each query's visible slots in AR's
    order (the list kernel: attention.c here, native/cuda_ops.py on CUDA), and its path's nodes get the AR steps'
    bits; the test_gpu.py twin runs it captured on CUDA."""
    with torch.inference_mode():
        lists = attention_path(torch.bfloat16, "cpu") == "native"
    if not lists:
        pytest.skip("no C compiler: attention.c is not built here")
    model = tiny_model(0).to(torch.bfloat16)
    steps = graphs.attach(model, "on", capture=capture)
    ar, path = tree_against_steps(model, PROMPT)
    assert torch.equal(ar, path)
    assert steps.eager_calls == 0


@pytest.mark.parametrize("products,capture", [("sliced", "static"), ("plain", "static"), ("sliced", "traced")],
                         indirect=["capture"])
def test_a_bf16_chain_scores_each_node_bitwise_as_ar_steps_with_sliced_products(products, capture, monkeypatch):
    """Low-precision exactness as a GPU runs it, on the CPU: the static steps' invariant attention and SlicedLinear
    products (a GPU model's layout, models/sliced_linear.py) score a 16-node chain bitwise as 16 AR steps, under a
    product kernel whose sums move with its row count; the control: plain products under that kernel do not."""
    from tests.models.test_sliced_linear import shape_dependent

    model = tiny_model(0).to(torch.bfloat16)
    for lin in model.modules():
        if type(lin) is torch.nn.Linear and products == "sliced":
            lin.__class__ = SlicedLinear
    graphs.attach(model, "on", capture=capture)
    monkeypatch.setattr(torch.nn.functional, "linear", shape_dependent)
    steps, chain = chain_against_steps(model, PROMPT)
    assert torch.equal(steps, chain) == (products == "sliced")


def test_image_cfg_steps_decode_what_eager_decodes():
    eager = decode(CFGTarget(tiny_image_target(0), 3.0), EmptyDrafter(), [1], 16, SamplingParams())
    model = tiny_image_target(0)
    graphs.attach(model, "on", capture=False)
    got = decode(CFGTarget(model, 3.0), EmptyDrafter(), [1], 16, SamplingParams())
    assert got.tokens == eager.tokens and model.graphs.replays == 15


def test_a_bucket_too_large_for_the_gpu_is_one_line_naming_it_and_its_bytes():
    torch_says = "CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 79.19 GiB of which ..."
    e = graphs.out_of_memory("bucket of 64 rows x 128 nodes over 4096 slots", torch_says, 512 * 2**20)
    assert str(e) == ("--graphs: the bucket of 64 rows x 128 nodes over 4096 slots asked for 1.50 GiB more with 512 "
                      "MiB of the GPU free; use --graphs off or a smaller --batch-size")
    assert "ran out of memory" in str(graphs.out_of_memory("capture ('k',)", "out of memory", 0))


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_a_step_that_cannot_be_captured_is_one_line_under_on_and_runs_uncaptured_under_auto(mode, monkeypatch):
    def refuses(self, step):
        raise RuntimeError("operation not permitted when stream is capturing\nCUDA kernel errors might be ...")

    monkeypatch.setattr(graphs.StepGraphs, "captured", refuses)
    prompts = [PROMPT]
    eager = run_batch(ModelTarget(tiny_model(0)), lambda i: EmptyDrafter(), prompts, 8, SamplingParams())
    model = tiny_model(0)
    graphs.attach(model, mode, capture=False)
    model.graphs.capture, model.graphs.strict = True, mode == "on"  # as attach leaves them on CUDA
    target = ModelTarget(model)
    if mode == "on":
        with pytest.raises(UsageError, match=r"^--graphs on: the bucket of 1 rows x 1 nodes over 256 slots cannot "
                                             r"be captured \(operation not permitted when stream is capturing\); "):
            run_batch(target, lambda i: EmptyDrafter(), prompts, 8, SamplingParams())
        return
    with pytest.warns(UserWarning, match="cannot be captured") as caught:
        got = run_batch(target, lambda i: EmptyDrafter(), prompts, 8, SamplingParams())
    assert len(caught) == 1 and not model.graphs.capture
    assert [r.tokens for r in got.results] == [r.tokens for r in eager.results]


def test_graphs_on_a_cpu_are_refused_and_auto_is_off():
    model = tiny_model(0)
    with pytest.raises(UsageError, match="--graphs on needs a CUDA device"):
        graphs.attach(model, "on")
    assert graphs.attach(model, "auto") is None and model.graphs is None
    with pytest.raises(UsageError, match="--graphs 'maybe'"):
        graphs.attach(model, "maybe")


def fake_growth(dtype: torch.dtype, plan, children=None):
    """An EAGLE drafter's static growth (methods/eagle_grow.py) over fake tensors: 3 CFG sequences, the widest row's
    top-k 5 and depths 0..3, as ADT-Tree's rows differ; a read of a tensor value on the host raises."""
    from specgen.methods.eagle_grow import Children, static_growth
    from specgen.models.eagle import EagleNet

    model = tiny_image_target(0).to(dtype)
    net = EagleNet.from_target(model).to(dtype).eval()
    children = children or Children(model.output, 2, 3.0)
    c = net.cfg
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.inference_mode():
        k = mode.from_tensor(torch.zeros(1, 7, c.n_kv_heads, 64, c.hd, dtype=dtype))
        ints = mode.from_tensor(torch.tensor([[3, 4, 5], [5, 2, 4], [3, 0, 2], [12, 0, 12], [4, 5, 6], [7, 8, 9]]))
        hidden = mode.from_tensor(torch.zeros(6, 1, c.dim, dtype=dtype))
        return static_growth(net, children, (k, k), plan, 2, 32, hidden, ints,  # 32 of 64 slots
                             mode.from_tensor(torch.arange(6)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("widths", [(8,), (8, 8, 8), (16, 16)])
def test_a_tree_growth_reads_nothing_on_the_host_and_keeps_the_plan_shape(dtype, widths):
    from specgen.methods.eagle_grow import GrowPlan

    grown = fake_growth(dtype, GrowPlan(widths, 12))
    t = min(12, widths[0] + sum(w * w for w in widths[1:]))  # the root's children, then W x W per level
    # tokens, parents; the verify's tokens, positions and tree mask
    assert [tuple(p.shape) for p in grown] == [(3, t)] * 2 + [(3, t + 1)] * 2 + [(3, t + 1, t + 1)]
    assert [tuple(p.shape) for p in fake_growth(dtype, GrowPlan(widths, 12, feed=False))] == [(3, t)] * 2  # VVS's


def test_a_growth_that_reads_the_host_fails_the_check():
    """The growth's control: the same harness refuses a level whose ranking reads a value."""
    from specgen.methods.eagle_grow import GrowPlan

    def reads(h, scores, k, frame, at):
        if h.sum().item() > 0:
            pass
        return h.float().log_softmax(-1).topk(k, dim=-1)

    with pytest.raises(Exception, match="[Dd]ata.dependent|item|local_scalar"):
        fake_growth(torch.float32, GrowPlan((8, 8), 12), reads)


@BOTH_SLOW
@pytest.mark.parametrize("method", ["eagle2", "adt-tree", "lantern", "vvs"])
@pytest.mark.parametrize("gpu", [False, True, 60], ids=["cpu-defaults", "gpu-defaults", "60-nodes"])
def test_image_trees_grown_by_the_static_growth_decode_what_eager_decodes(method, gpu, capture):
    """Target verifies and whole EAGLE tree growths (one static program per row bucket, width bucket and depth) both
    through static steps, batch 1 and 2, at the CPU's and a GPU's option defaults (16 and 31 nodes) and at 60 (a CFG
    verify of two product slices on a GPU): the same tokens as the eager method (lossless ones: as AR)."""
    from specgen.generate.image_methods import ImageParts, build_image_method
    from specgen.methods.eagle_grow import CapturedGrowth
    from specgen.models.eagle import EagleNet

    def run(attached: bool, batch: int):
        model = tiny_image_target(0)
        torch.manual_seed(1)
        net = EagleNet.from_target(model).eval()
        if attached:
            graphs.attach(model, "on", capture=capture)
            graphs.attach(net, "on", capture=capture)
        codebook = torch.randn(model.cfg.vocab_size, 8, generator=torch.Generator().manual_seed(0))  # LANTERN's
        parts = ImageParts(model, CFGTarget(model, 3.0), net, codebook, 4)
        options = {"total_tokens": gpu} if gpu > 1 else gpu_defaults(get_method(method).options_type) if gpu else {}
        decode = lambda: run_batch(parts.target, lambda i: build_image_method(method, parts, options)[0],  # noqa: E731
                                   [[0], [1], [2]], 16, SamplingParams(), batch_size=batch,
                                   rule=build_image_method(method, parts, options)[1])
        got = [r.tokens for r in decode().results]
        if attached:  # a second call replays what the first captured: nothing new, the same tokens
            recorded = model.graphs.recorded, net.graphs.recorded
            assert [r.tokens for r in decode().results] == got
            assert (model.graphs.recorded, net.graphs.recorded) == recorded
        return got, net

    for batch in (1, 2):
        eager, _ = run(False, batch)
        got, net = run(True, batch)
        assert got == eager
        # each growth one replay with its catch-up: keyed by the catch-up's bucket and the growth
        assert any(isinstance(key, tuple) and isinstance(key[1], CapturedGrowth) for key in net.graphs.graphs)
        assert net.graphs.eager_calls == 0


@pytest.mark.parametrize("capture", ["traced"], indirect=True)
def test_a_step_without_trees_catches_up_in_a_replay_of_its_own(capture):
    """A step whose every tree ends at its root (ADT-Tree's depth may adapt to 0) still catches its drafter up: one
    replay with nothing after it (`RootsAlone`), its pairs committed, so the next tree's drafts are the eager run's."""
    from specgen.methods.eagle import EagleTreeDrafter, FixedShape, TreeShape
    from specgen.methods.eagle_grow import RootsAlone
    from specgen.models.eagle import EagleNet

    class EveryThird(FixedShape):  # no tree at every third position
        def shape(self, next_index: int) -> TreeShape:
            return replace(self.tree, depth=0) if next_index % 3 == 0 else self.tree

    model = tiny_image_target(0)
    torch.manual_seed(1)
    net = EagleNet.from_target(model).eval()
    target = CFGTarget(model, 3.0)

    def run():
        make = lambda i: EagleTreeDrafter(net, model.output, EveryThird(TreeShape(3, 2, 8)),  # noqa: E731
                                          max_len=64, guidance=target.cfg_scale)
        got = run_batch(target, make, [[0], [1]], 16, SamplingParams())
        return [(r.tokens, r.stats.steps) for r in got.results]

    eager = run()
    graphs.attach(model, "on", capture=capture)
    graphs.attach(net, "on", capture=capture)
    assert run() == eager
    assert any(isinstance(key, tuple) and isinstance(key[1], RootsAlone) for key in net.graphs.graphs)
    assert net.graphs.eager_calls == 0


@pytest.mark.slow
@pytest.mark.parametrize("capture", ["traced"], indirect=True)
def test_a_drafter_net_grows_each_pools_trees_under_its_own_guidance(capture):
    """One drafter net, two runs at different CFG scales: the second run's captured growths combine at its own scale
    (a pool drops the net's earlier captures), so its drafts, and with them its acceptance, are the eager run's."""
    from specgen.generate.image_methods import ImageParts, build_image_method
    from specgen.models.eagle import EagleNet

    model = tiny_image_target(0)
    torch.manual_seed(1)
    net = EagleNet.from_target(model).eval()

    def run(scale: float):
        parts = ImageParts(model, CFGTarget(model, scale), net, None, 4)
        got = run_batch(parts.target, lambda i: build_image_method("eagle2", parts, {})[0], [[0], [1]], 16,
                        SamplingParams())
        return [(r.tokens, r.stats.steps) for r in got.results]

    eager = [run(3.0), run(1.5)]
    graphs.attach(model, "on", capture=capture)
    graphs.attach(net, "on", capture=capture)
    assert [run(3.0), run(1.5)] == eager


@pytest.mark.parametrize("args,line", [
    (["generate", "--graphs", "on", "--prompt", "hi"], "--graphs on needs a CUDA device"),
    (["generate", "--graphs", "maybe", "--prompt", "hi"], "--graphs 'maybe': use one of auto, on, off"),
    (["benchmark", "--graphs", "on", "--limit", "1"], "--graphs on needs a CUDA device"),
])
def test_graphs_flag_refusals_are_one_line_before_any_model_loads(args, line):
    from typer.testing import CliRunner

    from cli.main import app

    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and line in r.output and "Traceback" not in r.output


@BOTH_SLOW
def test_mesh_steps_with_conditions_decode_what_eager_decodes_at_batch_2(capture):
    """Cross-attention conditions live in static buffers of the batch's rows; a bucket of fewer rows (a row left)
    reads its own rows of them."""
    from specgen.eval.mesh_bench import benchmark_clouds
    from specgen.generate.mesh import load_mesh_model

    loaded = load_mesh_model(graphs="off")
    clouds = [pc for _, pc in benchmark_clouds(loaded.target.meta, 3)]
    eager = [r.tokens for r in loaded.decoder.generate_batch(clouds, SamplingParams(), 24, batch_size=2)]
    graphs.attach(loaded.decoder.model.decoder, "on", capture=capture)
    got = [r.tokens for r in loaded.decoder.generate_batch(clouds, SamplingParams(), 24, batch_size=2)]
    assert got == eager and loaded.decoder.model.decoder.graphs.replays > 0


def test_a_mesh_prefill_is_one_replay_a_point_count_with_the_eager_prefills_bits(monkeypatch):
    """The encoder, the conditions' K/V and the start's step: one capture for clouds of one point count, each later
    cloud a replay into its own row; the bits of the eager prefill (logits, hidden, condition, the row's slot 0 and
    its conditions' K/V), and a cloud's kept outputs survive the next cloud's replay (a batch prefills every free
    slot before its rows read theirs)."""
    from specgen.mesh.target import MeshTarget
    from tests.mesh.mesh_fixtures import procedural_clouds, tiny_mesh_model

    monkeypatch.setattr(graphs.StepGraphs, "captured", traced)
    clouds = procedural_clouds([0, 1]) + [torch.randn(100, 6)]

    def prefills(target: MeshTarget) -> list:
        cache = target.new_cache(3, 16)
        outs = []
        for i in range(len(clouds)):  # as the loop admits a row (`Batch.admit`)
            view = cache.rows(i, i + 1)
            outs.append(target.prefill(torch.tensor([[i]]), view))
            cache.absorb(view, i)
        assert cache.lengths == [1, 1, 1]
        rows = [(cache.k[:, i, :, :1], cache.v[:, i, :, :1], *cache.cross[1]) for i in range(len(clouds))]
        return [(o.logits, o.features, target.conditions[i], *row) for i, (o, row) in enumerate(zip(outs, rows))]

    eager, model = prefills(MeshTarget(tiny_mesh_model(), clouds)), tiny_mesh_model()
    replayed = graphs.attach(model.decoder, "on", capture=True)
    got = prefills(MeshTarget(model, clouds))
    assert replayed.prompts.recorded == 2 and replayed.prompts.uses["mesh", (1, 100, 6)] == 1  # two point counts
    for a, b in zip(eager, got):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("scale", [4.0, 1.0])
def test_a_class_prefill_is_one_replay_with_the_eager_prefills_bits(monkeypatch, scale):
    """A c2i image's class position (under guidance two branch rows, else one): one capture, each later image a replay
    into its own rows; the eager prefill's bits (the combined logits, hidden, the rows' slot 0), and an image's
    outputs survive the next image's replay."""
    from specgen.image.target import CFGTarget
    from tests.image.helpers import tiny_image_gpt

    monkeypatch.setattr(graphs.StepGraphs, "captured", traced)

    def prefills(target: CFGTarget) -> list:
        cache, br, got = target.new_cache(3, 8), target.branches, []
        for i, label in enumerate([2, 0, 1]):  # as the loop admits a row (`Batch.admit`)
            view = cache.rows(i * br, (i + 1) * br)
            out = target.prefill(torch.tensor([[label]]), view)
            cache.absorb(view, i * br)
            got.append((out.logits, out.features))
        assert cache.lengths == [1] * 3 * br
        return got + [(cache.k[:, :, :, :1], cache.v[:, :, :, :1])]

    eager, model = prefills(CFGTarget(tiny_image_gpt(0), scale)), tiny_image_gpt(0)
    replayed = graphs.attach(model, "on", capture=True)
    got = prefills(CFGTarget(model, scale))
    assert replayed.prompts.recorded == 1 and replayed.prompts.replays == 3
    for a, b in zip(eager, got):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("cfg_scale", [3.0, 1.0])
def test_t2i_steps_see_each_rows_caption_padding_as_eager_steps_do(monkeypatch, cfg_scale):
    """A t2i target's hidden caption slots (`KVCache.key_mask`) in the steps' static buffer: AR and EAGLE-2 over three
    captions of 2, 6 and 4 real slots, two rows at a time (a refill, a row left), captured and replayed through the
    emulation, decode what eager decodes, and the steps were replays."""
    from specgen.image.target import CaptionCFGTarget
    from specgen.methods import run_batch
    from specgen.methods.eagle import FixedShape, TreeShape
    from tests.image.test_t2i_generate import GRID, caption, drafter, tiny_t2i_gpt

    monkeypatch.setattr(graphs.StepGraphs, "captured", traced)
    captions, n = [caption(i, valid) for i, valid in enumerate([2, 6, 4])], GRID * GRID

    def decode_all(model) -> list:
        target = CaptionCFGTarget(model, cfg_scale, captions)
        prompts = [target.prompt(i) for i in range(len(captions))]
        makes = (lambda i: EmptyDrafter(), lambda i: drafter(model, target, FixedShape(TreeShape(3, 4, 12))))
        return [[r.tokens for r in run_batch(target, make, prompts, n, SamplingParams(), batch_size=2).results]
                for make in makes]

    eager, model = decode_all(tiny_t2i_gpt(1)), tiny_t2i_gpt(1)
    steps = graphs.attach(model, "on", capture=True)
    assert decode_all(model) == eager and eager[0] == eager[1]
    assert steps.replays > 0 and steps.eager_calls == 0 and steps.key_mask is not None


def test_a_copied_model_runs_eagerly():
    import copy

    model = tiny_model(0)
    graphs.attach(model, "on", capture=False)
    assert copy.deepcopy(model).graphs is None and model.graphs is not None


@pytest.mark.parametrize("kind,extra", [("ca", {}), ("ca", {"token_input": True, "history": 2}), ("mlp", {})])
def test_a_heads_step_reads_nothing_on_the_host(kind, extra):
    """XSpecMesh's heads on one row (`heads.head_logits`, what a captured heads step replays) over fake inputs."""
    from specgen.models.heads import head_logits
    from tests.mesh.mesh_fixtures import tiny_heads, tiny_mesh_model

    heads, model = tiny_heads(kind, **extra), tiny_mesh_model()
    stacked = heads.stacked()
    h = torch.randn(1, 32)
    kv = stacked.context_kv(heads.context_kv(torch.randn(1, 8, 32)))
    inputs = {"h": h, "token": torch.tensor([5]) if stacked.token_input else None, "k": kv and kv[0],
              "v": kv and kv[1], "past": stacked.project_history(torch.randn(2, 32)) if stacked.history else None}
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, torch.inference_mode():
        fake = {name: mode.from_tensor(t) for name, t in inputs.items() if t is not None}
        (logits,) = head_logits(stacked, model.decoder.output, model.decoder.tok_embeddings, torch.float32, 2, **fake)
    assert logits.shape == (2, 5121)


@pytest.mark.parametrize("params,capture", [(SamplingParams(), "static"), (SamplingParams(1.0), "static"),
                                            pytest.param(SamplingParams(1.0), "traced", marks=pytest.mark.slow)],
                         indirect=["capture"])
def test_lossless_xspecmesh_with_captured_heads_decodes_what_eager_decodes(params, capture):
    """Lossless XSpecMesh (argmax heads, rejection rule) with the backbone's static steps and the heads' static calls,
    batch 2: the eager method's tokens (greedy: AR's)."""
    from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions
    from tests.mesh.mesh_fixtures import procedural_clouds, tiny_heads, tiny_mesh_model

    clouds = procedural_clouds(range(11, 14))
    opts = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1)

    def run(attached: bool):
        decoder = MeshDecoder(tiny_mesh_model(), tiny_heads())
        if attached:
            graphs.attach(decoder.model.decoder, "on", capture=capture)
            graphs.attach(decoder.heads, "on", capture=capture)
        gens = [torch.Generator().manual_seed(i) for i in range(3)]
        return [r.tokens for r in decoder.generate_batch(clouds, params, 40, opts, gens, None, 2)], decoder

    eager, _ = run(False)
    got, decoder = run(True)
    assert got == eager and decoder.heads.graphs.replays > 0 and decoder.model.decoder.graphs.replays > 0


@BOTH_SLOW
def test_a_candidate_tree_read_ahead_through_static_steps_decodes_ar(capture, monkeypatch):
    """Lossless XSpecMesh with a candidate tree (3, 2, 1) and vertex lookup, its heads read ahead at every tree node as
    on a GPU (`ONE_READ`), through the backbone's and the heads' static steps (traced: as captured), batch 2: greedy
    AR's tokens, the tree's nodes accepted."""
    from specgen.methods import xspecmesh_pool
    from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions
    from tests.mesh.mesh_fixtures import procedural_clouds, tiny_heads, tiny_mesh_model

    monkeypatch.setattr(xspecmesh_pool, "ONE_READ", frozenset({"cpu"}))
    clouds = procedural_clouds(range(11, 14))
    opts = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1, vertex_lookup=True,
                            candidate_tree="3,2,1")
    model, heads = tiny_mesh_model(), tiny_heads(scramble=False)
    ar = [r.tokens for r in MeshDecoder(model).generate_batch(clouds, SamplingParams(), 40, batch_size=2)]
    decoder = MeshDecoder(model, heads)
    graphs.attach(decoder.model.decoder, "on", capture=capture)
    graphs.attach(decoder.heads, "on", capture=capture)
    res = decoder.generate_batch(clouds, SamplingParams(), 40, opts, None, None, 2)
    assert [r.tokens for r in res] == ar and decoder.heads.graphs.replays > 0
    assert max(max(r.stats.draft_sizes) for r in res) > 4 and sum(sum(r.stats.accepted) for r in res) > 0


def test_a_later_xspecmesh_call_replays_the_heads_captures_unless_their_constants_changed(monkeypatch):
    """The heads' captures read the stacked weights, the stage and the LM head that the first pool made: a second
    `generate_batch` on the same decoder replays them (no capture; each pool used to capture again), with the first
    call's tokens. One at another temperature (frozen into a capture) captures again (a key without the temperature
    fails here), and decodes what the eager decoder decodes at that temperature."""
    from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions
    from tests.mesh.mesh_fixtures import procedural_clouds, tiny_heads, tiny_mesh_model

    monkeypatch.setattr(graphs.StepGraphs, "captured", traced)
    clouds = procedural_clouds(range(11, 13))
    opts = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1)

    def run(decoder, params):
        gens = [torch.Generator().manual_seed(i) for i in range(2)]
        return [r.tokens for r in decoder.generate_batch(clouds, params, 24, opts, gens, None, 2)]

    with torch.inference_mode():  # weights loaded as inference tensors (no version counters) serve as well
        decoder = MeshDecoder(tiny_mesh_model(), tiny_heads())
    graphs.attach(decoder.model.decoder, "on", capture=True)
    graphs.attach(decoder.heads, "on", capture=True)
    first = run(decoder, SamplingParams())
    captured = decoder.heads.graphs.recorded
    assert captured > 0 and run(decoder, SamplingParams()) == first and decoder.heads.graphs.recorded == captured
    sampled = run(decoder, SamplingParams(1.0))
    assert decoder.heads.graphs.recorded > captured
    assert sampled == run(MeshDecoder(tiny_mesh_model(), tiny_heads()), SamplingParams(1.0))


def test_read_ahead_heads_run_inside_the_verify_replay_and_a_later_call_replays_it(monkeypatch):
    """Where the heads run ahead (`ONE_READ`: a GPU), they are the verify step's post-step, inside the backbone's
    captured replay (`ReadAhead`): the heads' own graph serves a mesh's first step alone (its candidates come before
    any verify), a second `generate_batch` replays the backbone's captures (the pool's held `ReadAhead` keys them), a
    third with heads in another dtype drops those (a new `ReadAhead`), and all decode greedy AR's meshes at batch 2
    with candidates accepted."""
    from specgen.methods import xspecmesh_pool
    from specgen.methods.xspecmesh import MeshDecoder, XSpecMeshOptions
    from tests.mesh.mesh_fixtures import procedural_clouds, tiny_heads, tiny_mesh_model

    monkeypatch.setattr(xspecmesh_pool, "ONE_READ", frozenset({"cpu"}))
    monkeypatch.setattr(graphs.StepGraphs, "captured", traced)
    clouds = procedural_clouds(range(11, 14))
    opts = XSpecMeshOptions(criterion="rejection", sampling="tree", top_k_tree=1)
    model = tiny_mesh_model()
    ar = [r.tokens for r in MeshDecoder(model).generate_batch(clouds, SamplingParams(), 40, batch_size=2)]
    decoder = MeshDecoder(model, tiny_heads(scramble=False))
    backbone = graphs.attach(decoder.model.decoder, "on", capture=True)
    graphs.attach(decoder.heads, "on", capture=True)
    runs, captures = [], []
    for _ in range(2):
        runs.append(decoder.generate_batch(clouds, SamplingParams(), 40, opts, None, None, 2))
        captures.append(backbone.captures)
    posts = {key[1] for key in backbone.graphs if isinstance(key, tuple) and isinstance(key[0], Bucket)}
    assert len(posts) == 1 and isinstance(posts.pop(), xspecmesh_pool.ReadAhead) and captures[0] == captures[1]
    assert decoder.heads.graphs.replays == 2 * len(clouds)
    # heads drafting in another dtype: new statics, a new ReadAhead; the backbone's captures of the old one are dropped
    runs.append(decoder.generate_batch(clouds, SamplingParams(), 40, replace(opts, draft_dtype="bfloat16"), None,
                                       None, 2))
    posts = [key[1] for key in backbone.graphs if isinstance(key, tuple) and isinstance(key[0], Bucket)]
    assert posts and set(posts) == {v for v in decoder.heads.graphs.held.values()
                                    if isinstance(v, xspecmesh_pool.ReadAhead)}
    for res in runs:
        assert [r.tokens for r in res] == ar and sum(sum(r.stats.accepted) for r in res) > 0


@BOTH_SLOW
def test_mulo_sd_with_static_steps_decodes_what_eager_decodes(capture):
    """MuLo-SD's low-resolution drafter follows the target: static steps for both, the eager run's tokens (greedy)."""
    from specgen.image.neighbours import compute_neighbours
    from specgen.methods.mulo_sd import MuLoSD
    from specgen.models.upsampler import UpDownSampler, UpsamplerConfig
    from tests.image.helpers import tiny_image_gpt

    def run(attached: bool):
        model, lowres = tiny_image_gpt(1, grid=4), tiny_image_gpt(3, grid=2, classes=3)
        torch.manual_seed(4)
        pair = UpDownSampler(UpsamplerConfig(codebook_size=32, embed_dim=8, scale=2, channels=8, blocks=1)).eval()
        table = compute_neighbours(pair.codebook, 4)
        if attached:
            graphs.attach(model, "on", capture=capture)
        got = run_batch(CFGTarget(model, 3.0), lambda i: MuLoSD(lowres, pair, table, 4, tau=0.05, radius=1),
                        [[0], [2], [1]], 16, SamplingParams(), batch_size=2)
        return [r.tokens for r in got.results], lowres

    eager, lowres = run(False)
    assert lowres.graphs is None
    got, lowres = run(True)
    assert got == eager and lowres.graphs.replays > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_adds_inside_the_norms_give_the_blocks_bits(dtype, monkeypatch):
    """A static step's blocks hand each output on as x + f unsummed, the add done inside the next norm's kernel
    (Block.deferred): the logits and hidden states are bitwise those of the blocks' own forwards."""
    with torch.inference_mode():
        if not kernel_choice.native_norms(torch.zeros(1, dtype=dtype), torch.zeros(1, dtype=dtype)):
            pytest.skip("no C compiler: the native norms are not built here")
    model = tiny_model(0).to(dtype)
    steps = graphs.attach(model, "on", capture=False)
    steps.new_cache(2, 40)
    b = Bucket(2, 4, 64)
    x = StaticInputs.for_bucket(b, "cpu")
    x.tokens.copy_(torch.randint(0, model.cfg.vocab_size, (2, 4), generator=torch.Generator().manual_seed(0)))
    x.meta[0] = torch.tensor([3, 7])
    x.meta[1] = torch.tensor([0, 1])
    x.tree.copy_(x.causal)
    with torch.inference_mode():
        fused = target_step(model, x, steps.k, steps.v, None, b.width)
        monkeypatch.setattr(static_step, "deferrable", lambda *a: False)  # each block's forward, its add on its own
        plain = target_step(model, x, steps.k, steps.v, None, b.width)
    assert all(torch.equal(a, c) for a, c in zip(fused, plain))


@pytest.mark.parametrize("chunk,length,replays", [(None, 200, 1), (128, 165, 2)])
@pytest.mark.parametrize("products,capture", [("sliced", "static"), ("sliced", "traced"), ("plain", "static")],
                         indirect=["capture"])
def test_a_prompt_prefilled_in_captured_chunks_has_the_bits_of_one_eager_forward(products, capture, chunk, length,
                                                                                 replays, monkeypatch):
    """Where a prompt attends as a step does (CUDA; forced here on the CPU), a prompt prefills into any row as captured
    chunks over the prompts' own buffer (one padded chunk of the default PROMPT_NODES, or two of 128 nodes: the tiny
    model's context is 256): the last logits, every hidden state and the row's keys and values are bitwise one eager
    forward's, under a product kernel whose sums move with its row count (prompt mode's slices, eager and captured);
    the control: plain products under that kernel do not keep them."""
    from tests.models.test_sliced_linear import shape_dependent

    monkeypatch.setattr(kernel_choice, "prompts_as_steps", lambda dtype, device: True)
    monkeypatch.setattr(torch.nn.functional, "linear", shape_dependent)
    if chunk:
        monkeypatch.setattr(graphs, "PROMPT_NODES", (chunk,))
    prompt = torch.randint(0, 64, (1, length), generator=torch.Generator().manual_seed(0))
    got = []
    for staged in (False, True):
        model = tiny_model(0).to(torch.bfloat16)
        for lin in model.modules():
            if type(lin) is torch.nn.Linear and products == "sliced":
                lin.__class__ = SlicedLinear
        target = static_target(model, capture) if staged else ModelTarget(model)
        cache = target.new_cache(2, prompt.shape[1] + 8)
        view = cache.rows(1, 2)  # the second row: a slot a batch refills
        with torch.inference_mode():
            out = target.prefill(prompt, view)
        cache.absorb(view, 1)
        got.append((out.logits, out.features, cache.k[:, 1, :, : prompt.shape[1]], cache.v[:, 1, :, : prompt.shape[1]]))
        assert cache.lengths == [0, prompt.shape[1]]
    assert model.graphs.prompts.replays == replays and model.graphs.prompts.eager_calls == 0  # every chunk replayed
    assert all(torch.equal(a, b) for a, b in zip(*got)) == (products == "sliced")


@pytest.mark.parametrize("name,capture", [("ar", "traced"), ("ngram", "traced")], indirect=["capture"])
def test_prompts_prefilled_in_captured_chunks_decode_what_eager_ar_decodes(name, capture, monkeypatch):
    monkeypatch.setattr(kernel_choice, "prompts_as_steps", lambda dtype, device: True)
    monkeypatch.setattr(graphs, "PROMPT_NODES", (128,))  # two chunks within the tiny model's context of 256
    long = (PROMPT * 12)[: graphs.PROMPT_NODES[-1] + 9]
    prompts = [PROMPT, long, PROMPT[:7]]
    eager = run_batch(ModelTarget(tiny_model(0)), lambda i: EmptyDrafter(), prompts, 24, SamplingParams())
    model = tiny_model(0)
    got = run_batch(static_target(model, capture), lambda i: DRAFTERS[name](), prompts, 24, SamplingParams())
    assert [r.tokens for r in got.results] == [r.tokens for r in eager.results]
    assert model.graphs.prompts.replays == 4 and model.graphs.describe()["replays"] > 4
    captures = model.graphs.captures  # the prompts' buffer's captures counted, and kept across a reset that drops it
    assert captures == model.graphs.describe()["captures"] > model.graphs.recorded
    model.graphs.reset()
    assert model.graphs.prompts is None and model.graphs.captures == captures


def test_the_static_buffer_only_grows_so_a_smaller_call_keeps_the_captures():
    """Rows and width are the most asked for so far: a batch after a long prompt, or the reverse, resets (and drops
    the captures) once, not at every alternation (a benchmark's batch-1 and batched rows alternate)."""
    steps = graphs.attach(tiny_model(0), "on", capture=False)
    steps.new_cache(1, 600)
    steps.new_cache(2, 50)  # more rows: one growth, the long prompt's width kept
    width = steps.k.shape[3]
    steps.graphs["kept"] = ({}, None, ())
    for batch, length in ((1, 600), (2, 50), (1, 10)):
        cache = steps.new_cache(batch, length)
        assert cache.batch == batch and steps.capacity == 2 and steps.k.shape[3] == width and "kept" in steps.graphs
