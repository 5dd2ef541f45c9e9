"""Shared fixtures: an isolated SPECGEN_HOME and tiny deterministic models."""

from __future__ import annotations

import functools
import gc
import os
import shutil
import traceback

import pytest
import torch
import typer.testing

from specgen import native
from specgen.methods import METHODS, run_batch
from specgen.models import packed_linear, plan_cache
from specgen.models.quantize import QuantizedLinear, dequantize_int4, dequantize_int8
from specgen.models.transformer import Transformer, TransformerConfig
from tests import startup_checks

if not torch.cuda.is_available():  # Triton kernels (native/cuda_ops.py) run on CPU tensors in its interpreter, which
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must be chosen before anything imports triton
torch.set_num_threads(1)  # tiny models: threads only add spin-waiting (and the machine has 2 cores)
# A full garbage collection walks every tracked object, and this process keeps hundreds of thousands (torch,
# transformers, the test modules and what they cache) to its end: those made by the time the tests are collected are
# frozen (pytest_collection_finish; cli/_process.py freezes a command's imports likewise), and a full collection
# waits for ten times as many younger collections as Python's default.
gc.set_threshold(*gc.get_threshold()[:2], 100)
# typer's CliRunner converts the app to a Click command at every invoke; an app is complete once imported and the
# conversion only reads it, so one command per app serves every test, as one per process serves the CLI (a private
# name: a typer without it converts at every invoke again, slower and the same)
if hasattr(typer.testing, "_get_command"):
    typer.testing._get_command = functools.cache(typer.testing._get_command)

# oneDNN ships in torch's x86 CPU wheels (this project's machine and CI); on a build without it the tests that
# call it cannot run, and `test_builds_without_onednn_fall_back_to_column_major` checks what specgen does there.
needs_onednn = pytest.mark.skipif(not packed_linear.available(), reason="this torch build has no oneDNN")
# specgen/native's C kernels are built at pip install or first use; without a C compiler the tests that call them
# cannot run
needs_native = pytest.mark.skipif(any(native.library(name) is None for name in native.SIGNATURES),
                                  reason="no C compiler, or no 16-lane vectors (AVX-512F, AVX2 + FMA) for attention.c")
#: only the tiled products (and the row kernels beside them): built wherever there is a compiler
TILED = native.library("tiled") is not None and native.library("glue") is not None
needs_tiled = pytest.mark.skipif(not TILED, reason="no C compiler: the native kernels are not built here")


def pytest_collection_finish(session):
    """The imports' objects (and the collected tests') leave the collector's walks (see gc.set_threshold above)."""
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    """`gpu` tests (pyproject.toml markers) are skipped on a machine without CUDA, with the reason shown."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False here")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def specgen_home(tmp_path, monkeypatch):
    """Every test gets its own registry home."""
    home = tmp_path / "specgen_home"
    monkeypatch.setenv("SPECGEN_HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def measured_as_quiet(monkeypatch):
    """Cost curves are stored whatever else the machine runs (the suite's workers share its cores): only the
    tests of that judgement (`plan_cache.timed_quietly`) set the share a stored measurement needs."""
    monkeypatch.setattr(plan_cache, "QUIET_SHARE", 0.0)


@pytest.fixture(scope="session")
def fresh_interpreter(tmp_path_factory) -> dict[str, list]:
    """What one fresh interpreter saw at each start-up check (tests/startup_checks.py), by the check's name."""
    return startup_checks.answers(tmp_path_factory.mktemp("fresh-interpreter"), TILED and packed_linear.available())


def dequantized(q: QuantizedLinear) -> torch.Tensor:
    """The float32 weight [out, in] a quantized layer's kernels multiply by."""
    if q.mode == "int8":
        return dequantize_int8(q.qweight, q.scales)
    return dequantize_int4(q.qweight, q.scales, q.zeros)


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """`registered(fill)`: the test's SPECGEN_HOME gets what `fill()` registers. `fill` runs once per module, into a
    home of its own that each test gets a copy of, with torch's generator state as `fill` left it (fills seed it)."""
    done = {}

    def copy_into_home(fill) -> None:
        if fill not in done:
            home = tmp_path_factory.mktemp("registered")
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("SPECGEN_HOME", str(home))
                fill()
            done[fill] = home, torch.get_rng_state()
        home, rng = done[fill]
        shutil.copytree(home, os.environ["SPECGEN_HOME"], dirs_exist_ok=True)
        torch.set_rng_state(rng)

    return copy_into_home


def tiny_config(**over) -> TransformerConfig:
    base = dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=256,
                rope_theta=10000.0)
    base.update(over)
    return TransformerConfig(**base)


# a Gemma 3 block over tiny_config's shape: scaled embedding, GeGLU, sandwich and q/k norms, layer 0 local (its own
# RoPE base). Untied: tied, this tiny model's scaled embedding outweighs its two unit-RMS sublayer outputs and each
# step predicts its input token again (one token decoded over and over, which no draft could get wrong)
GEMMA = dict(embed_scale=32**0.5, ffn_act="gelu_tanh", sandwich_norms=True, qk_norm=True, local_layers=(0,),
             local_rope_theta=100.0, tie_embeddings=False)
# Gemma 1's block over tiny_config's shape: Llama's, with the scaled embedding and GeGLU
GEMMA1 = dict(embed_scale=32**0.5, ffn_act="gelu_tanh")
# Gemma 2's block over tiny_config's shape: Gemma 3's without q/k norms or a local RoPE base, its local layer 0
# sliding over 6 positions, scores capped at 2 (this tiny model's run past it: the cap changes the tokens) and
# logits at 5 (monotone: greedy tokens keep, sampled ones not)
GEMMA2 = dict(embed_scale=32**0.5, ffn_act="gelu_tanh", sandwich_norms=True, local_layers=(0,), window=6,
              attn_softcap=2.0, logit_softcap=5.0, tie_embeddings=False)
# OLMo 2's block over tiny_config's shape: no norm before its sublayers, each output normed before its add, q and k
# normed over their whole projections ([H hd], [Hkv hd]), SwiGLU, untied (its class default)
OLMO2 = dict(pre_norms=False, sandwich_norms=True, qk_norm=True, qk_norm_span="all", tie_embeddings=False)
# OLMo 3's: OLMo 2's with layer 0 sliding over 6 positions and turning with its own RoPE base
OLMO3 = dict(OLMO2, local_layers=(0,), window=6, local_rope_theta=100.0)
# EXAONE 4's: OLMo 2's norms with per-head q/k norms, layer 0 sliding over 6 positions, layer 1 full without RoPE
EXAONE4 = dict(OLMO2, qk_norm_span="head", local_layers=(0,), window=6, nope_layers=(1,))
# Granite over tiny_config's shape: Llama's block with its embeddings times 4 and its logits divided by 2 (its attention
# and residual multipliers are folded into the weights at load, so a random model needs only these two fields), tied
GRANITE = dict(embed_scale=4.0, logit_scale=2.0)
# Mixtral's block over tiny_config's shape: Llama's attention, a routed feed-forward of 4 SwiGLU experts of ffn_dim, 2 a
# token, their weights renormalised; untied (its class default)
MOE = dict(n_experts=4, experts_per_token=2, expert_renorm=True, tie_embeddings=False)
# Qwen2-MoE's block over tiny_config's shape: Qwen2's attention (q/k/v biases), 4 routed experts, 2 a token, not
# renormalised, and a shared expert of 64 on every row (whole vector lanes, as real widths: models/moe.py), scaled by
# its gate's sigmoid
QWEN2_MOE = dict(n_experts=4, experts_per_token=2, shared_expert_dim=64, qkv_bias=True, tie_embeddings=False)
# OLMoE's block over tiny_config's shape: Llama's pre-norms, q and k normed over their whole projections (OLMo 2's),
# 4 routed experts, 2 a token, not renormalised
OLMOE = dict(n_experts=4, experts_per_token=2, qk_norm=True, qk_norm_span="all", tie_embeddings=False)
# sliding-window targets over tiny_config's shape, decoded well past their window: Gemma 3's block with its local
# layer 0 sliding over 6 positions, and Mistral's kind (Llama's block, every layer sliding over 5)
SLIDING = {"gemma": dict(GEMMA, window=6), "mistral": dict(local_layers=(0, 1), window=5)}


def unwindowed(over: dict) -> dict:
    """A SLIDING target's overrides without its window (Gemma's local layers keep their own RoPE base)."""
    return {**over, "window": 0, "local_layers": over["local_layers"] if "local_rope_theta" in over else ()}


def tiny_model(seed: int = 0, **over) -> Transformer:
    """A random tiny model whose logits are peaked enough to make drafts matter."""
    torch.manual_seed(seed)
    model = Transformer(tiny_config(**over))
    for p in model.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.3)
    return model.eval()


def decode(target, drafter, prompt: list[int], max_new_tokens: int, params, stop_ids: tuple[int, ...] = (),
           generator=None, max_draft: int = 256, rule=None):
    """One prompt on the shared loop under `drafter`'s own step policy (`run_batch` of one row); its DecodeResult."""
    return run_batch(target, lambda i: drafter, [prompt], max_new_tokens, params, stop_ids, [generator],
                     max_draft=max_draft, rule=rule).results[0]


# the method table's lossless text methods (each equals AR of its own model: cllm's and pcllm's distilled one)
LOSSLESS_TEXT = sorted(name for name, spec in METHODS.items() if spec.runs_on("text") and spec.lossless)
LOSSLESS_IMAGE = sorted(name for name, spec in METHODS.items() if spec.runs_on("image") and spec.lossless)


def method_drafter(name: str, seed: int = 0, gpu: bool = False, **options):
    """Method `name`'s text drafter from `options` through the request's parse path (`MethodSpec.parse_options`; `gpu`:
    with its GPU defaults)."""
    spec = METHODS[name]
    return spec.drafter(spec.parse_options(options, gpu=gpu), seed)


def host_reads_inside(monkeypatch, policy: type) -> tuple[list[str], list[int]]:
    """(reads, calls), filled as the caller decodes: the host reads of tensor values made inside `policy.forward` (a
    run_ahead loop step's steps; the CPU's RoPE bound check aside: on a GPU an assert queued on the device), by the
    reading function, and one entry a call of it."""
    reads: list[str] = []
    calls: list[int] = []
    forward = policy.forward
    module = forward.__code__.co_filename

    def counted(real):
        def read(*a, **k):
            stack = traceback.extract_stack()
            if any(f.name == "forward" and f.filename == module for f in stack) and \
                    all(f.name != "forward_rotation" for f in stack):
                reads.append(stack[-2].name)
            return real(*a, **k)
        return read

    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "cpu", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))
    monkeypatch.setattr(policy, "forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    return reads, calls
