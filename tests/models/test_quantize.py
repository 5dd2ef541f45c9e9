"""Weight-only int8/int4 quantization: error bounds, kernels vs dequantized weights, row independence, lossless
greedy speculation on the quantized model, and stored quantized entries that reload bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from specgen import native
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.errors import UsageError
from specgen.methods import METHODS, run_batch
from specgen.models import quantize
from specgen.models.quantize import (
    QuantizedEmbedding,
    QuantizedLinear,
    build_quantized_transformer,
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
    quantize_model,
)
from tests.conftest import dequantized, method_drafter, tiny_model

GREEDY = SamplingParams()
LOSSLESS_TEXT = sorted(name for name, spec in METHODS.items() if spec.runs_on("text") and spec.lossless)
MODES = [("int8", 0), ("int4", 32)]


def weights(out=96, k=64, seed=0, offset=0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out, k, generator=g) * torch.rand(out, 1, generator=g) * 2 + offset


@pytest.mark.parametrize("offset", [0.0, 3.0])
def test_int8_round_trip_is_within_half_a_step_per_channel(offset):
    w = weights(offset=offset)
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and s.dtype == torch.bfloat16 and q.abs().max() <= 127
    err = (dequantize_int8(q, s) - w).abs()  # [out, in]
    assert (err <= s.float()[:, None] * 0.5 + 1e-6).all()
    assert q.abs().amax(1).min() >= 126  # the scale uses the range: the largest weight maps to ~127


@pytest.mark.parametrize("offset", [0.0, 3.0])
@pytest.mark.parametrize("group", [32, 64])
def test_int4_round_trip_is_within_half_a_step_per_group(group, offset):
    w = weights(offset=offset)
    q4, scale, zero = quantize_int4(w, group)
    assert q4.shape == (96, 32) and scale.shape == zero.shape == (96, 64 // group)
    err = (dequantize_int4(q4, scale, zero) - w).abs()
    step, mid = (t.float().repeat_interleave(group, dim=1) for t in (scale, zero))  # [out, in]
    # every weight inside the grid [mid - 8 step, mid + 7 step] is at its nearest level; the least-squares
    # refit may leave a group's extremes just outside the grid, clamped to its end level (no further off than
    # min-max leaves its largest error: test below)
    inside = (w >= mid - 8 * step) & (w <= mid + 7 * step)
    assert (err[inside] <= 0.5 * step[inside] * (1 + 1e-5)).all()
    assert inside.float().mean() > 0.9 and err.mean() < 0.3 * step.mean()  # a real fit, not only within bounds


def min_max_int4_error(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([out, in/g] squared error, [out, in/g] largest error) per group of plain min-max int4 (bfloat16 scale and
    zero, nearest level)."""
    wg = w.view(w.shape[0], -1, group)
    lo, hi = wg.amin(-1), wg.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-6).to(torch.bfloat16).float()
    zero = (lo + 8 * scale).to(torch.bfloat16).float()
    q = torch.round((wg - zero[..., None]) / scale[..., None] + 8).clamp(0, 15)
    diff = (q - 8) * scale[..., None] + zero[..., None] - wg
    return diff.square().sum(-1), diff.abs().amax(-1)


@pytest.mark.parametrize("offset", [0.0, 3.0])
def test_int4_refits_never_lose_to_min_max_on_either_measure(offset):
    """Per group, neither the squared error nor the largest error grows (a pure least-squares fit would clamp
    outliers); on Gaussian weights the refits still find ~2% less squared error."""
    w = weights(out=256, k=128, offset=offset)
    diff = (dequantize_int4(*quantize_int4(w, 32)) - w).view(256, 4, 32)  # [out, groups, g]
    base_sq, base_max = min_max_int4_error(w, 32)
    assert (diff.square().sum(-1) <= base_sq * (1 + 1e-6)).all()
    assert (diff.abs().amax(-1) <= base_max * (1 + 1e-6)).all()
    assert diff.square().sum() < 0.99 * base_sq.sum()


def test_int4_nearly_recovers_weights_already_on_a_4bit_grid():
    """Weights dequantized from GGUF Q4_1 blocks (q * d + m, d and m float16, 32 per block): the shipped
    SmolLM2's. Min-max finds the grid but rounds d and m to bfloat16; the refits halve what that costs."""
    g = torch.Generator().manual_seed(5)
    d = (torch.rand(512, 8, 1, generator=g) * 0.01 + 1e-3).half().float()
    m = (-7.5 * d + torch.randn(512, 8, 1, generator=g) * 1e-3).half().float()
    q = torch.randint(0, 16, (512, 8, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15  # as Q4_1's quantizer leaves them: both ends of every block used
    w = (q * d + m).view(512, 256)
    rel = lambda err_sq: (err_sq.sum() / w.square().sum()).sqrt()  # noqa: E731
    refined = (dequantize_int4(*quantize_int4(w, 32)) - w).square()
    assert rel(refined) < 0.6 * rel(min_max_int4_error(w, 32)[0]) and rel(refined) < 3e-3


def test_int4_refuses_widths_not_divisible_by_the_group():
    with pytest.raises(UsageError, match="group size must be one of"):
        quantize_model(tiny_model(0), "int4", 48)
    with pytest.raises(UsageError, match="divisible by the group size 32; this model has a 48-wide layer"):
        quantize_model(tiny_model(0, dim=48, n_heads=4), "int4", 32)


@pytest.mark.parametrize("mode,group", MODES)
def test_quantized_linear_equals_the_dequantized_float_product(mode, group):
    lin = torch.nn.Linear(64, 96, bias=True)
    torch.nn.init.normal_(lin.weight, std=0.5)
    q = QuantizedLinear.from_linear(lin, mode, group)
    x = torch.randn(3, 5, 64)  # batched [B, S, in]
    with torch.inference_mode():
        y = q(x)
        ref = F.linear(x.bfloat16().float(), dequantized(q), lin.bias.bfloat16().float())
    assert y.shape == (3, 5, 96) and y.dtype == torch.float32
    # the kernels return bfloat16: agreement to bfloat16 rounding of the outputs
    assert torch.allclose(y, ref, rtol=2**-7, atol=2**-7 * ref.abs().max().item())
    assert (y - ref).abs().max() > 0 or mode == "int8"  # (bf16 outputs are rounded, exact match is not expected)


@pytest.mark.parametrize("mode,group", MODES)
def test_every_row_of_a_product_is_bitwise_the_row_alone(mode, group):
    """What makes speculation lossless on a quantized target: a row's result never depends on the product's size."""
    lin = torch.nn.Linear(64, 96, bias=False)
    q = QuantizedLinear.from_linear(lin, mode, group)
    x = torch.randn(70, 64)
    with torch.inference_mode():
        alone = torch.cat([q(x[i : i + 1]) for i in range(70)])
        for m in (2, 3, 8, 17, 70):
            assert torch.equal(q(x[:m]), alone[:m]), m


def test_the_int4_kernel_copy_is_made_in_pieces_and_its_scales_are_held_once(monkeypatch):
    """Where qmm.c is not built, torch's int4 kernel runs: its weight is converted `PACK_ROWS` output rows at a time (its int32 input stays small), bitwise the
    whole conversion; the scales and zeros buffers become views of the kernel's [in/g, out, 2] copy."""
    monkeypatch.setattr(quantize, "quantized_product", lambda in_features, group: "torch")
    q = QuantizedLinear.from_linear(torch.nn.Linear(64, 2 * quantize.PACK_ROWS + 48, bias=False), "int4", 32)
    scales, zeros = q.scales.clone(), q.zeros.clone()
    _, (packed, _, sz), _, _ = q.kernel()
    whole = torch.ops.aten._convert_weight_to_int4pack_for_cpu(quantize.unpack_int4(q.qweight).to(torch.int32), 1)
    assert torch.equal(packed, whole)
    assert torch.equal(q.scales, scales) and torch.equal(q.zeros, zeros)
    assert q.scales.untyped_storage().data_ptr() == q.zeros.untyped_storage().data_ptr() == sz.data_ptr()
    assert q._kernel is not None  # re-pointing the buffers kept the kernel
    assert q.state_dict()["scales"].shape == (q.out_features, 2)  # the stored layout is unchanged: [out, in/g]


@pytest.mark.parametrize("mode,group", MODES)
def test_the_fused_gate_up_product_is_bitwise_two_separate_ones(mode, group):
    """A quantized feed-forward stores w1 and w3 as one layer w13: the same numbers as quantizing and running them
    one by one (every output row is quantized and computed alone), one kernel call fewer per layer."""
    ffn = tiny_model(4).layers[0].feed_forward
    fused = quantize_model(tiny_model(4), mode, group).layers[0].feed_forward  # the same weights, quantized whole
    w1, w3, w2 = (QuantizedLinear.from_linear(lin, mode, group) for lin in (ffn.w1, ffn.w3, ffn.w2))
    assert torch.equal(fused.w13.qweight, torch.cat([w1.qweight, w3.qweight]))
    x = torch.randn(2, 7, ffn.w1.in_features).bfloat16()
    with torch.inference_mode():
        assert torch.equal(fused(x), w2(F.silu(w1(x)) * w3(x)))


@pytest.mark.parametrize("mode,group", MODES)
def test_quantized_model_equals_its_dequantized_float_model(mode, group):
    model = tiny_model(3)
    qm = quantize_model(copy.deepcopy(model), mode, group)
    ref = copy.deepcopy(model)
    with torch.no_grad():  # the float model with exactly the weights the kernels use
        for name, mod in qm.named_modules():
            if isinstance(mod, QuantizedLinear) and name.endswith(".w13"):  # the fused gate and up projections
                gate, up = dequantized(mod).chunk(2)
                ref.get_submodule(name[:-2] + "1").weight.copy_(gate)
                ref.get_submodule(name[:-2] + "3").weight.copy_(up)
            elif isinstance(mod, QuantizedLinear):
                ref.get_submodule(name).weight.copy_(dequantized(mod))
        ref.tok_embeddings.weight.copy_(dequantized(qm.output))
    ids = torch.randint(0, 64, (2, 9))
    pos = torch.arange(9).expand(2, 9)
    with torch.inference_mode():
        logits, _ = qm(ids, pos)
        want, _ = ref.to(torch.bfloat16)(ids, pos)
        f32, _ = model(ids, pos)
    assert logits.dtype == torch.bfloat16
    assert (logits.float() - want.float()).abs().max() < 0.05 * want.float().abs().max()
    if mode == "int8":  # and near the original float32 model (bf16 activations + rounding; 4 bits of random
        assert (logits.float() - f32).abs().max() < 0.1 * f32.abs().max()  # Gaussian weights are not near it)


def test_tied_embedding_and_head_share_one_int8_table():
    qm = quantize_model(tiny_model(0), "int4", 32)
    assert isinstance(qm.tok_embeddings, QuantizedEmbedding)
    assert qm.tok_embeddings.qweight is qm.output.qweight and qm.output.mode == "int8"
    assert not any(p.dtype == torch.float32 for p in qm.parameters())  # no float32 weights are kept
    f32_bytes = sum(p.numel() * 4 for p in tiny_model(0).parameters() if p.dim() > 1)  # tied table once
    held = {t.data_ptr(): t.numel() * t.element_size() for t in qm.state_dict().values()}  # tied tensors once
    assert sum(held.values()) < 0.3 * f32_bytes  # int4 body + int8 table (+ scales, norms): well under float32
    ids = torch.tensor([[1, 5, 63]])
    with torch.inference_mode():
        emb = qm.tok_embeddings(ids)  # [1, 3, dim]
    want = dequantized(qm.output)[ids[0]].bfloat16()
    assert torch.allclose(emb[0].float(), want.float(), rtol=2**-7, atol=1e-6)


@pytest.fixture(scope="module")
def quantized_targets():
    return {mode: ModelTarget(quantize_model(tiny_model(7), mode, group)) for mode, group in MODES}


def ragged(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 64, (int(torch.randint(2, 20, (), generator=g)),), generator=g).tolist() for _ in range(n)]


#: the default run: every method on the native path with prompt GEMMs, and one method on every path; the rest `slow`
PATHS = [(gemm, attention) for attention in ("native", "torch") for gemm in (False, True)]
QUANT_CASES = [pytest.param(method, mode, gemm, attention, id=f"{attention}-{gemm}-{mode}-{method}",
                            marks=() if (gemm, attention) == (True, "native") or method == LOSSLESS_TEXT[-1]
                            else pytest.mark.slow)
               for method in LOSSLESS_TEXT for mode, _ in MODES for gemm, attention in PATHS]


@pytest.mark.parametrize("method,mode,prompt_gemm,attention", QUANT_CASES)
def test_every_lossless_method_equals_ar_on_the_quantized_model(quantized_targets, method, mode, prompt_gemm,
                                                                  attention, monkeypatch):
    """Prompt prefills (models/prompt.py) run SDPA, and with `prompt_gemm` also the dequantized GEMM (these
    prompts are shorter than the real crossover): the state after a prefill is the same for every method. Forwards
    run the native kernels (attention, norms, qmm.c's products) where they are built, else (and with
    `attention="torch"`) the torch paths."""
    if attention == "native" and native.library("attention") is None:
        pytest.skip("no C compiler: the native attention kernel is not built here")
    if attention == "torch":  # as without a compiler: no native kernel at all (torch's quantized products too)
        monkeypatch.setattr(native, "library", lambda name: None)
    monkeypatch.setitem(quantize.PROMPT_MIN_ROWS, mode, 2 if prompt_gemm else 10**9)
    target = quantized_targets[mode]
    for lin in quantize.quantized_layers(target.model).values():  # each case makes its kernels on its own path
        lin.__dict__.pop("_kernel", None)
    prompts = ragged(4)

    def drafter(i):
        return method_drafter(method)

    ar = [run_batch(target, lambda i: method_drafter("ar"), [p], 24, GREEDY).results[0].tokens
          for p in prompts]
    alone = [run_batch(target, drafter, [p], 24, GREEDY).results[0].tokens for p in prompts]
    assert alone == ar
    batched = run_batch(target, drafter, prompts, 24, GREEDY, batch_size=3)
    assert [r.tokens for r in batched.results] == ar


def test_quantized_greedy_differs_from_float_somewhere():
    """The equality above is not vacuous: the quantized model is another model (int4 here)."""
    prompts = ragged(6)
    q = ModelTarget(quantize_model(tiny_model(7), "int4", 32))
    f = ModelTarget(tiny_model(7))

    def ar(target, prompt):
        return run_batch(target, lambda i: method_drafter("ar"), [prompt], 24, GREEDY).results[0].tokens

    assert any(ar(q, p) != ar(f, p) for p in prompts)


@pytest.mark.parametrize("mode,group", MODES)
def test_builder_skeleton_loads_the_state_bit_for_bit(mode, group):
    qm = quantize_model(tiny_model(2), mode, group)
    fresh = build_quantized_transformer(mode, group, **qm.cfg.to_dict())
    fresh.load_state_dict(qm.state_dict(), strict=True)
    assert fresh.tok_embeddings.qweight is fresh.output.qweight
    ids, pos = torch.randint(0, 64, (1, 6)), torch.arange(6)[None]
    with torch.inference_mode():
        assert torch.equal(fresh(ids, pos)[0], qm(ids, pos)[0])


def tiny_entry(name="tiny", seed=2):
    from specgen import registry

    model = tiny_model(seed)
    meta = {"builder": "transformer", "kwargs": model.cfg.to_dict(), "modality": "text", "vocab_size": 64}
    return registry.save("target", name, model.state_dict(), meta, force=True), model


@pytest.mark.parametrize("mode,group", MODES)
def test_stored_quantized_entry_reloads_bit_for_bit_and_is_made_once(mode, group):
    from specgen import checkpoints, precision, registry

    base, model = tiny_entry()
    entry = precision.quantized_entry(base, mode)
    assert entry.ref == f"target/tiny-{mode}" + ("-g32" if mode == "int4" else "")
    assert entry.meta["quantized"]["base"] == "target/tiny" and entry.meta["builder"] == "quantized-transformer"
    loaded = checkpoints.load_module(entry, "cpu", torch.bfloat16)
    want = quantize_model(model, mode, group).state_dict()
    got = loaded.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)
    assert loaded.tok_embeddings.qweight is loaded.output.qweight  # the tie survives the round trip
    stamp = (entry.path / registry.WEIGHTS).stat().st_mtime_ns
    again = precision.quantized_entry(base, mode)  # stored: read, not recomputed
    assert (again.path / registry.WEIGHTS).stat().st_mtime_ns == stamp


def test_a_changed_base_is_requantized_and_a_foreign_entry_refused():
    from specgen import precision, registry
    from specgen.errors import IncompatibleError

    base, _ = tiny_entry(seed=2)
    first = registry.read_state(precision.quantized_entry(base, "int8"))
    base, _ = tiny_entry(seed=3)  # same name, other weights
    second = registry.read_state(precision.quantized_entry(base, "int8"))
    assert not torch.equal(first["tok_embeddings.qweight"], second["tok_embeddings.qweight"])
    other, _ = tiny_entry("other", seed=4)
    foreign = precision.quantized_entry(other, "int8")
    registry.save("target", "tiny-int8", registry.read_state(foreign), foreign.meta, force=True)  # other's, our name
    with pytest.raises(IncompatibleError, match="not a quantized copy of target/tiny"):
        precision.quantized_entry(base, "int8")
    with pytest.raises(IncompatibleError, match="holds int8 weights, not int4"):
        precision.check_quantized_entry(foreign, "int4")


def test_an_entry_made_by_older_quantizers_is_remade():
    import json

    from specgen import precision, registry
    from specgen.models.quantize import VERSION

    base, _ = tiny_entry(seed=6)
    entry = precision.quantized_entry(base, "int4")
    assert entry.meta["quantized"]["version"] == VERSION
    config = entry.path / registry.CONFIG
    meta = json.loads(config.read_text())
    meta["quantized"]["version"] = VERSION - 1  # as an older quantizer wrote it
    config.write_text(json.dumps(meta))
    stamp = (entry.path / registry.WEIGHTS).stat().st_mtime_ns
    again = precision.quantized_entry(base, "int4")
    assert again.meta["quantized"]["version"] == VERSION
    assert (again.path / registry.WEIGHTS).stat().st_mtime_ns != stamp


@pytest.mark.parametrize("name,dtype,quantize,want", [
    ("m", None, None, ("m", "float32", None)),
    ("m+int8", None, None, ("m", "bfloat16", "int8")),
    ("m", None, "int4", ("m", "bfloat16", "int4")),
    ("m+bf16", None, None, ("m", "bfloat16", None)),
    ("m", "bfloat16", "none", ("m", "bfloat16", None)),
])
def test_precision_names_and_options_resolve(name, dtype, quantize, want):
    from specgen.precision import resolve

    assert resolve(name, dtype, quantize) == want


@pytest.mark.parametrize("name,dtype,quantize,match", [
    ("m", None, "int5", "--quantize must be one of"),
    ("m", "float64", None, "--dtype must be one of"),
    ("m", "float32", "int8", "runs bfloat16 activations"),
    ("m", "float16", "int4", "drop --dtype float16"),
    ("m+int8+f16", None, None, "drop --dtype float16"),
    ("m+int8", None, "int4", "contradicts the model name"),
    ("m+fp8", None, None, "unknown precision suffix"),
])
def test_bad_precision_input_is_one_usage_error(name, dtype, quantize, match):
    from specgen.precision import resolve

    with pytest.raises(UsageError, match=match):
        resolve(name, dtype, quantize)


@pytest.mark.parametrize("product", ["native", "torch"])
@pytest.mark.parametrize("mode,group", [("int4", 32), ("int8", 0)])
def test_the_kernel_operands_meta_shapes_are_the_made_ones(monkeypatch, product, mode, group):
    """What the layout cache matches a stored file against (`make_kernel("meta")`, from the shapes alone) is what
    `make_kernel` makes, on qmm.c's layout (outputs not a whole tile) and on torch's (whose int4 packs whole 16s)."""
    if product == "native" and not native.library("qmm"):
        pytest.skip("qmm.c is not built here")
    monkeypatch.setattr(quantize, "quantized_product", lambda *_: product)
    lin = QuantizedLinear.from_linear(torch.nn.Linear(64, 40 if product == "native" else 48), mode, group)
    made, shapes = lin.make_kernel(), lin.make_kernel("meta")
    assert {k: (t.shape, t.dtype) for k, t in shapes.items()} == {k: (t.shape, t.dtype) for k, t in made.items()}
    assert all(t.is_meta for t in shapes.values())
