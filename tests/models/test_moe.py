"""Routed feed-forwards (models/moe.py): a row's bits never depend on the rows beside it, the static path gives the
routed path's bits, and quantization, LoRA merges and exports take MoE targets or refuse them in one line."""

from __future__ import annotations

import pytest
import torch

from specgen.models import graphs
from specgen.models.moe import MoEFeedForward, static_routing
from specgen.models.sliced_linear import SlicedLinear
from tests.conftest import MOE, OLMOE, QWEN2_MOE, tiny_model
from tests.models.test_graphs import chain_against_steps, traced
from tests.models.test_sliced_linear import shape_dependent

PROMPT = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
DTYPES = [torch.float32, torch.bfloat16]
# a Qwen3-MoE block over tiny_config's shape: q/k norms, the k weights rounded before they scale, not renormalised
QWEN3_MOE = dict(n_experts=4, experts_per_token=2, expert_weight_round=True, qk_norm=True, tie_embeddings=False)


def moe_model(dtype: torch.dtype, products: str, over: dict = MOE):
    """A tiny routed model in `dtype`, its products SlicedLinear ("sliced": one GEMM shape at every row count) or
    plain nn.Linear."""
    model = tiny_model(0, **over).to(dtype)
    for lin in model.modules():
        if type(lin) is torch.nn.Linear and products == "sliced":
            lin.__class__ = SlicedLinear
    return model


def rows(n: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn(n, 32, generator=torch.Generator().manual_seed(n)) * 2).to(dtype)  # [n, dim]


@pytest.mark.parametrize("over", [MOE, QWEN3_MOE, QWEN2_MOE, OLMOE], ids=["mixtral", "qwen3-moe", "qwen2-moe", "olmoe"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("products", ["sliced", "plain"])
def test_a_row_gets_the_same_bits_alone_and_among_other_rows(products, dtype, over, monkeypatch):
    """Each of 130 rows (more than a slice of 64) through a routed feed-forward: alone (an AR step), in groups of 5 (a
    verify) and all together give identical bits, in float32 and bfloat16, under a product kernel whose sums move
    with its row count: routing, weights and the k-term sum are per row, and each expert's product over its rows is
    row-invariant (SlicedLinear, a GPU model's layout). The control: plain products under that kernel (an expert's
    rows change with the batch) are not."""
    ffn = moe_model(dtype, products, over).layers[0].feed_forward
    monkeypatch.setattr(torch.nn.functional, "linear", shape_dependent)
    x = rows(130, dtype)
    with torch.inference_mode():
        together = ffn(x)  # [130, dim]
        alone = torch.cat([ffn(x[i : i + 1]) for i in range(130)])
        fives = torch.cat([ffn(x[i : i + 5]) for i in range(0, 130, 5)])
    same = torch.equal(together, alone) and torch.equal(together, fives)
    assert same == (products == "sliced")


def test_torch_cpu_float32_products_are_not_row_invariant_so_the_invariant_rests_on_the_layout():
    """What the CPU gives (a record, not a requirement): torch's float32 F.linear scores a row alone (MKL's one-row
    path) with other bits than among 35 rows, so on the CPU a routed feed-forward is as row-invariant as the model's
    other products (SlicedLinear on a GPU, the decode layout's kernels on the CPU: docs/precision.md)."""
    torch.manual_seed(0)
    w, x = torch.randn(64, 32), torch.randn(35, 32)
    together = torch.nn.functional.linear(x, w)
    alone = torch.cat([torch.nn.functional.linear(x[i : i + 1], w) for i in range(35)])
    if torch.equal(together, alone):
        pytest.skip("this CPU's float32 products happen to be row-invariant")
    assert (together - alone).abs().max() < 1e-5  # last bits only


@pytest.mark.parametrize("over", [MOE, QWEN3_MOE, QWEN2_MOE, OLMOE], ids=["mixtral", "qwen3-moe", "qwen2-moe", "olmoe"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("products", ["sliced", "plain"])
def test_the_static_path_gives_the_routed_paths_bits(products, dtype, over, monkeypatch):
    """Every expert over every row, each row's k gathered (`static_routing`, what captured steps run) gives the bits
    of each expert over its own rows (eager), at 1, 5 and 130 rows, under a product kernel whose sums move with its
    row count, with row-invariant products; the control: plain products under it (the static path's experts hold
    every row, the routed path's fewer) do not, at 5 and 130 rows."""
    ffn = moe_model(dtype, products, over).layers[0].feed_forward
    monkeypatch.setattr(torch.nn.functional, "linear", shape_dependent)
    same = []
    for n in (1, 5, 130):
        x = rows(n, dtype)
        with torch.inference_mode():
            routed = ffn(x)
            with static_routing():
                static = ffn(x)
        same.append(torch.equal(routed, static))
    assert same == ([True] * 3 if products == "sliced" else [True, False, False])


@pytest.mark.parametrize("products,capture", [("sliced", False), ("sliced", True), ("plain", False)])
def test_a_bf16_moe_chain_scores_each_node_bitwise_as_ar_steps(products, capture, monkeypatch):
    """A routed bfloat16 target scores a 16-node chain bitwise as 16 AR steps, eagerly (routed) and in its static
    steps (every expert; `capture`: through the replay emulation of a CUDA graph, tests/models/test_graphs.py), under
    a product kernel whose sums move with its row count; the control: plain products under that kernel do not."""
    for static in (False, True):
        model = moe_model(torch.bfloat16, products)
        if static:
            monkeypatch.setattr(graphs.StepGraphs, "captured", traced)
            graphs.attach(model, "on", capture=capture)
        monkeypatch.setattr(torch.nn.functional, "linear", shape_dependent)
        steps, chain = chain_against_steps(model, PROMPT)
        monkeypatch.undo()
        assert torch.equal(steps, chain) == (products == "sliced"), static
        if static:
            assert model.graphs.replays > 0 and model.graphs.eager_calls == 0


def test_the_block_builds_experts_only_where_the_config_routes():
    """A dense config keeps its one FeedForward (its old path and state names); a routed one a gate and E experts."""
    dense, routed = tiny_model(0), tiny_model(0, **MOE)
    assert type(dense.layers[0].feed_forward).__name__ == "FeedForward"
    assert isinstance(routed.layers[0].feed_forward, MoEFeedForward)
    names = {k for k in routed.state_dict() if k.startswith("layers.0.feed_forward.")}
    assert names == {"layers.0.feed_forward.gate.weight"} | {
        f"layers.0.feed_forward.experts.{e}.w{j}.weight" for e in range(4) for j in (1, 2, 3)}


def test_the_block_builds_a_shared_expert_only_where_the_config_has_one():
    """Qwen2-MoE's block: the router and E experts, and its shared expert (a SwiGLU of shared_expert_dim) with its
    gate (dim -> 1, no bias)."""
    names = {k: v.shape for k, v in tiny_model(0, **QWEN2_MOE).state_dict().items()
             if k.startswith("layers.0.feed_forward.shared")}
    assert names == {"layers.0.feed_forward.shared_expert.w1.weight": (64, 32),
                     "layers.0.feed_forward.shared_expert.w3.weight": (64, 32),
                     "layers.0.feed_forward.shared_expert.w2.weight": (32, 64),
                     "layers.0.feed_forward.shared_expert_gate.weight": (1, 32)}


@pytest.mark.parametrize("over", [MOE, QWEN2_MOE], ids=["mixtral", "qwen2-moe"])
def test_an_eagle_drafter_of_a_moe_target_is_dense(over):
    from specgen.models.eagle import drafter_config

    cfg = drafter_config(tiny_model(0, **over).cfg)
    assert (cfg.n_experts, cfg.experts_per_token, cfg.expert_renorm, cfg.shared_expert_dim, cfg.n_layers) == (
        0, 0, False, 0, 1)


def test_a_quantized_qwen2_moe_target_quantizes_its_shared_expert_and_reloads_bit_for_bit():
    """int4 quantizes the shared expert as a dense feed-forward (as each routed one), its gate stays a bfloat16
    Linear; a quantized entry's skeleton loads the state strictly, bit for bit."""
    from specgen.models.quantize import QuantizedFeedForward, build_quantized_transformer, quantize_model

    qm = quantize_model(tiny_model(0, **QWEN2_MOE), "int4", 32)
    ffn = qm.layers[0].feed_forward
    assert type(ffn.shared_expert) is QuantizedFeedForward and ffn.shared_expert_gate.weight.dtype == torch.bfloat16
    fresh = build_quantized_transformer("int4", 32, **qm.cfg.to_dict())
    fresh.load_state_dict(qm.state_dict(), strict=True)
    ids, pos = torch.randint(0, 64, (1, 6)), torch.arange(6)[None]
    with torch.inference_mode():
        assert torch.equal(fresh(ids, pos)[0], qm(ids, pos)[0])


@pytest.mark.parametrize("mode,group", [("int4", 32), ("int8", 0)])
def test_a_quantized_moe_target_keeps_every_lossless_method_on_ar_and_reloads_bit_for_bit(mode, group):
    """int4 / int8 quantize each expert as a dense feed-forward (qmm.c: every row alone), the router stays a
    bfloat16 Linear; every lossless text method then equals AR on it, alone and batched; a quantized entry's skeleton
    (`build_quantized_transformer`) loads its state bit for bit; the control: it is another model than the float one
    (greedy tokens differ)."""
    from specgen.decoding.sampling import SamplingParams
    from specgen.decoding.target import ModelTarget
    from specgen.methods import run_batch
    from specgen.models.quantize import QuantizedFeedForward, build_quantized_transformer, quantize_model
    from tests.conftest import LOSSLESS_TEXT, method_drafter

    qm = quantize_model(tiny_model(0, **MOE), mode, group)
    ffn = qm.layers[0].feed_forward
    assert all(type(e) is QuantizedFeedForward for e in ffn.experts) and ffn.gate.weight.dtype == torch.bfloat16
    target, prompts, greedy = ModelTarget(qm), [PROMPT, PROMPT[:7], [3, 9, 27, 17]], SamplingParams()
    ar = [r.tokens for r in run_batch(target, lambda i: method_drafter("ar"), prompts, 24, greedy).results]
    for name in LOSSLESS_TEXT:
        got = run_batch(target, lambda i: method_drafter(name), prompts, 24, greedy, batch_size=2)
        assert [r.tokens for r in got.results] == ar, name
    fresh = build_quantized_transformer(mode, group, **qm.cfg.to_dict())
    fresh.load_state_dict(qm.state_dict(), strict=True)
    ids, pos = torch.randint(0, 64, (1, 6)), torch.arange(6)[None]
    with torch.inference_mode():
        assert torch.equal(fresh(ids, pos)[0], qm(ids, pos)[0])
    f = ModelTarget(tiny_model(0, **MOE))
    assert [r.tokens for r in run_batch(f, lambda i: method_drafter("ar"), prompts, 24, greedy).results] != ar


def test_a_lora_adapter_merges_into_an_experts_weights():
    """A saved adapter over an expert's projection (its path: layers.i.feed_forward.experts.e.w1) merges as into a
    dense one, W += (alpha / rank) B A; a path the model lacks (an expert past E) is one line."""
    from specgen.models.lora import merge_lora_state

    model = tiny_model(0, **MOE)
    path = "layers.1.feed_forward.experts.3.w1"
    before = model.get_submodule(path).weight.detach().clone()
    a, b = torch.randn(2, 32), torch.randn(64, 2)
    assert merge_lora_state(model, {f"{path}.lora_A": a, f"{path}.lora_B": b}, rank=2, alpha=4.0) == 1
    assert torch.equal(model.get_submodule(path).weight, before + (b @ a * 2.0))
    with pytest.raises(ValueError, match="^adapter layer layers.0.feed_forward.experts.4.w1 is not in the model$"):
        merge_lora_state(model, {"layers.0.feed_forward.experts.4.w1.lora_A": a,
                                 "layers.0.feed_forward.experts.4.w1.lora_B": b}, rank=2, alpha=4.0)


@pytest.mark.parametrize("method,over", [("jacobi", MOE), ("ngram", MOE), ("ngram", QWEN2_MOE)],
                         ids=["jacobi", "ngram", "ngram-qwen2-moe"])
def test_a_moe_registry_target_generates_ar_tokens_through_the_cli(tmp_path, monkeypatch, method, over):
    """A routed target stored in the registry loads in its decode layout (its experts' and router's Linears as every
    other's; Qwen2-MoE's shared expert and its one-row gate too) and `specgen generate` with a lossless method gives
    AR's 16 tokens."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from specgen import registry
    from tests.cli.test_cli_text import invoke

    tok = Tokenizer(models.WordLevel({chr(i): i - 32 for i in range(32, 96)}, unk_token="?"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Split("", behavior="isolated"), decoders.Fuse()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="?", eos_token="_")
    model = tiny_model(0, **over)
    meta = {"builder": "transformer", "kwargs": model.cfg.to_dict(), "vocab_size": 64, "modality": "text",
            "tokenizer": True}
    registry.save("target", "tiny-moe", model.state_dict(), meta, extra=lambda d: hf.save_pretrained(str(d)))
    args = ["generate", "--model", "tiny-moe", "--no-chat", "--max-new-tokens", "16", "--format", "json",
            "--prompt", "HELLO WORLD HELLO WORLD"]
    runs = [invoke(*args, "--method", m) for m in ("ar", method)]
    assert all(r.exit_code == 0 for r in runs), runs[-1].output
    ar, got = (json.loads(r.stdout.splitlines()[0])["token_ids"] for r in runs)
    assert got == ar and len(ar) == 16


def test_lora_trains_through_the_routed_path_and_merges_into_the_experts():
    """`apply_lora` wraps each expert's projections and the router (their attribute names, as a dense block's); a
    backward through the routed path reaches every adapter; the trained adapters merged into a fresh model give the
    wrapped model's logits. The control: the base model's logits differ from them."""
    from specgen.models.lora import merge_lora_state
    from specgen.train.lora import apply_lora, lora_state

    model = tiny_model(0, **MOE)
    paths = apply_lora(model, ("w1", "w2", "w3", "gate"), rank=2, alpha=4.0)
    assert len(paths) == 2 * (1 + 4 * 3)  # per layer: the router and 4 experts' three projections
    x, pos = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0)), torch.arange(9).expand(2, 9)
    model(x, pos)[0].float().logsumexp(-1).mean().backward()
    adapters = [p for n, p in model.named_parameters() if "lora_" in n]
    assert len(adapters) == 2 * len(paths) and all(p.grad is not None for p in adapters)
    with torch.no_grad():
        for p in adapters:
            p.sub_(0.5 * p.grad.sign())  # one signed step: every B nonzero
        wrapped = model(x, pos)[0]
    merged = tiny_model(0, **MOE)
    assert merge_lora_state(merged, lora_state(model), rank=2, alpha=4.0) == len(paths)
    with torch.no_grad():
        torch.testing.assert_close(merged(x, pos)[0], wrapped, atol=1e-4, rtol=1e-4)
        assert (tiny_model(0, **MOE)(x, pos)[0] - wrapped).abs().max() > 1e-2


@pytest.mark.parametrize("over,cls", [(QWEN2_MOE, "Qwen2MoeForCausalLM"), (OLMOE, "OlmoeForCausalLM")],
                         ids=["qwen2-moe", "olmoe"])
def test_the_hf_rows_of_a_qwen2_moe_or_olmoe_target_decode_what_ar_decodes(over, cls):
    """A Qwen2-MoE block (a shared expert) exports as transformers' Qwen2MoeForCausalLM, an OLMoE block (whole-span
    q/k norms beside pre-norms) as OlmoeForCausalLM, whose `hf`, `hf-lookup` and `hf-compiled` (uncompiled here) rows
    (eval/hf_rows.py) decode AR's tokens. Control: AR of the same weights routing one expert a token decodes others."""
    from specgen.decoding.sampling import SamplingParams
    from specgen.decoding.target import ModelTarget
    from specgen.eval.hf_rows import generate_padded, one_token, timed_static_greedy
    from specgen.methods import run_batch
    from specgen.methods.text import EmptyDrafter
    from specgen.models.hf_export import to_hf

    prompt = PROMPT[:8]
    model = tiny_model(0, **over)
    ar = run_batch(ModelTarget(model), lambda i: EmptyDrafter(), [prompt], 30, SamplingParams()).results[0].tokens
    hf = to_hf(model).eval()
    assert type(hf).__name__ == cls
    got = [timed_static_greedy(hf, one_token, prompt, 30)[0], generate_padded(hf, [prompt], 30)[0][0],
           generate_padded(hf, [prompt], 30, prompt_lookup_num_tokens=10)[0][0]]
    assert got == [list(ar)] * 3
    other = tiny_model(0, **{**over, "experts_per_token": 1})
    assert run_batch(ModelTarget(other), lambda i: EmptyDrafter(), [prompt], 30,
                     SamplingParams()).results[0].tokens != ar
