"""Devices and dtypes (specgen/devices.py): parsing, one-line refusals for every command that runs a model, honest
CUDA clocks in the decoding loop, and the fence that keeps the packed CPU layout and its measurement off other
devices (a "meta" tensor stands in for a non-cpu device here)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specgen import devices
from specgen.errors import UsageError
from tests.cli.test_cli_refusals import check_refusal, invoke, tiny  # noqa: F401  (fixture)

NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
NO_FP16 = pytest.mark.skipif(devices.onednn_packs(torch.float16), reason="this CPU has native float16 kernels")


# ---- parsing -----------------------------------------------------------------------------------------------------
@NO_CUDA
def test_auto_is_cpu_here_and_cuda_is_one_usage_error():
    assert devices.resolve_device("auto") == torch.device("cpu")
    assert devices.resolve_device(None) == torch.device("cpu") and devices.device_name("auto") == "cpu"
    for spec in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(UsageError, match="no CUDA GPU"):
            devices.resolve_device(spec)


def test_a_plan_knows_a_gpu_run_without_a_gpu_here(monkeypatch):
    """`on_gpu`: a config naming cuda is a GPU run wherever it is planned (a login node's dry run); auto is one where
    CUDA is here."""
    assert devices.on_gpu("cuda") and devices.on_gpu("cuda:1") and devices.on_gpu(" CUDA:0 ")
    assert not devices.on_gpu("cpu") and not devices.on_gpu("auto") and not devices.on_gpu(None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert devices.on_gpu("auto") and devices.on_gpu(None) and not devices.on_gpu("cpu")


def test_device_names():
    assert devices.resolve_device("cpu") == torch.device("cpu")
    assert devices.resolve_device(torch.device("cpu")) == torch.device("cpu")
    for spec, needle in (("tpu9", "unknown device"), ("meta:0", "unsupported device"), ("x", "unknown device")):
        with pytest.raises(UsageError, match=needle):
            devices.resolve_device(spec)
    with pytest.raises(UsageError, match="not accepted here"):
        devices.check_device("auto", allow_auto=False)
    assert devices.is_cpu("cpu") and devices.is_cpu(None) and not devices.is_cpu("meta")


def test_an_indexed_cpu_is_the_cpu():
    """cpu:0 names the one CPU device, resolved as cpu: torch's `t.to("cpu:0")` copies a CPU tensor (cpu != cpu:0),
    so `generate --device cpu:0` copied every weight of the model it built (SmolLM2: ~400 MB more peak memory)."""
    assert devices.device_name("cpu:0") == "cpu" and devices.resolve_device("cpu:1") == torch.device("cpu")
    x = torch.zeros(2)
    assert x.to(devices.resolve_device("cpu:0")) is x


def test_config_checks_use_the_same_check():
    from specgen.config_checks import check_config
    from specgen.generate.image import ImageGenConfig
    from specgen.generate.mesh import MeshGenConfig

    check_config(ImageGenConfig(device="auto"))  # generate resolves auto itself
    check_config(MeshGenConfig(device="cpu"))
    with pytest.raises(UsageError, match="unknown device"):
        check_config(MeshGenConfig(device="tpu9"))


def test_dtypes():
    assert devices.resolve_dtype(None) == torch.float32
    assert devices.resolve_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(UsageError, match="--dtype must be one of float32, bfloat16, float16"):
        devices.resolve_dtype("float64")
    assert devices.resolve_dtype("float16", "cuda") == torch.float16  # a GPU runs it (the device is not checked here)


@NO_FP16
def test_float16_on_a_cpu_without_float16_kernels_is_one_line():
    with pytest.raises(UsageError, match="float16 needs a CUDA device .*; use bfloat16 on CPU"):
        devices.resolve_dtype("float16", "cpu")


def test_train_device():
    assert devices.train_device(None) == "cpu" and devices.train_device("auto") == devices.device_name("auto")
    with pytest.raises(UsageError, match="unknown device"):
        devices.train_device("tpu9")


# ---- clocks ------------------------------------------------------------------------------------------------------
def test_now_synchronises_cuda_only(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    devices.now("cpu")
    assert calls == []  # cpu: no wait
    devices.now("cuda:0")
    devices.now(None)  # the CUDA device in use, when the process has used CUDA
    assert calls == [torch.device("cuda:0"), torch.device("cuda")]  # a bare "cuda": the current device


def test_decode_loop_waits_for_the_device_only_at_its_ends(monkeypatch):
    """The batch's start and each row's latency read `now(device)` (a synchronised clock); the phases (prefill,
    propose, verify, accept, commit) read the host clock and never wait: on a GPU ten waits a step slowed a
    launch-bound AR step (docs/results/gpu.md)."""
    from specgen.decoding import loop
    from specgen.decoding.sampling import SamplingParams
    from specgen.decoding.target import ModelTarget
    from specgen.methods import run_batch
    from tests.conftest import method_drafter, tiny_model

    seen = []

    def fake_now(device=None):
        seen.append(device)
        return float(len(seen))

    monkeypatch.setattr(loop, "now", fake_now)
    monkeypatch.setattr(devices, "synchronize", lambda device=None: seen.append(("sync", device)))
    target = ModelTarget(tiny_model(0))
    prompts = [[1, 2, 3, 1, 2], [4, 5, 6]]
    res = run_batch(target, lambda i: method_drafter("ngram"), prompts, 6, SamplingParams())
    assert seen == ["cpu"] * (1 + len(prompts))  # the start, then one latency per row; no phase synchronised
    assert set(res.stats.times) >= {"prefill", "propose", "verify", "accept", "commit"}
    assert all(r.stats.extras["latency_s"] > 0 for r in res.results)


def test_the_decode_paths_queue_host_built_tensors_without_a_wait():
    """`torch.tensor(data, device=cuda)` copies from pageable memory, which waits for every kernel queued before it: a
    prompt's admission waited for the batch's last step (and each prefill for the one before it; a prompt now reaches
    `Target.prefill` on the host). The decode paths queue host-built tensors with `devices.host_tensor` (page-locked,
    no wait); a call that names a device fails here, by file and line."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "specgen"
    found = []
    for folder in ("decoding", "methods", "generate", "image", "mesh", "text"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "tensor"
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                        and any(k.arg == "device" for k in node.keywords)):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert not found, found


@pytest.mark.parametrize("data", [[3, -1, 2**40], [[1, 2], [3, 4], [5, 6]], [7], [[8]], [], [[], []], [True, False],
                                  [0.5, 1.0], [[1, 2.5]]])
def test_host_tensors_are_what_torch_tensor_makes(data):
    """`host_tensor` packs ints (flat or in equal rows) through `int_tensor`'s buffer: the same values, dtype and shape
    as `torch.tensor`; anything else goes through `torch.tensor` itself."""
    made, want = devices.host_tensor(data, "cpu"), torch.tensor(data)
    assert (made.dtype, made.shape) == (want.dtype, want.shape) and torch.equal(made, want)


# ---- the packed CPU layout stays on the CPU ------------------------------------------------------------------------
def tiny_linears(device="cpu") -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 8)).to(device)


def test_layout_is_not_applied_off_the_cpu(monkeypatch):
    from specgen.models import layout, packed_linear
    from specgen.models.sliced_linear import SlicedLinear

    m = tiny_linears("meta")  # a non-cpu device type (no memory, no kernels)
    strides = [lin.weight.stride() for lin in m]
    for name in layout.LAYOUTS:
        out = layout.decode_layout(m, name)
        assert out is m and all(type(lin) is SlicedLinear for lin in m), name  # the GPU's products, no PackedLinear
        assert [lin.weight.stride() for lin in m] == strides, name  # not re-stored column-major
    packed_linear.pack_linears(m)
    assert all(type(lin) is SlicedLinear for lin in m)


def test_packed_linear_moved_off_the_cpu_neither_tiles_nor_packs(monkeypatch):
    """A model packed on the CPU and then moved (e.g. .to("cuda")) runs F.linear: no CPU copy is made there."""
    from specgen.models import packed_linear

    m = packed_linear.pack_linears(tiny_linears())
    if not packed_linear.available():
        pytest.skip("this torch build has no oneDNN")
    assert all(isinstance(lin, packed_linear.PackedLinear) for lin in m)
    monkeypatch.setattr(packed_linear.PackedLinear, "packed_weight", lambda self: pytest.fail("packed off the CPU"))
    monkeypatch.setattr(packed_linear.PackedLinear, "tiled_weight", lambda self: pytest.fail("tiled off the CPU"))
    m.to("meta")
    with torch.inference_mode():
        y = m(torch.empty(8, 16, device="meta"))
    assert y.shape == (8, 8) and y.device.type == "meta"


def test_float16_weights_are_not_packed():
    """oneDNN's packed float16 path needs AVX512-FP16: float16 linears stay nn.Linear (F.linear)."""
    from specgen.models import packed_linear

    m = packed_linear.pack_linears(tiny_linears().half())
    assert all(type(lin) is nn.Linear for lin in m)


# ---- the CLI: every command that runs a model ---------------------------------------------------------------------
GEN_TEXT = ["generate", "--model", "tiny-text", "--prompt", "hi", "--no-chat", "--max-new-tokens", "3"]
GEN_IMAGE = ["generate", "--model", "tiny-image-gpt", "--method", "ar", "--num", "1", "-o", "imgs"]
GEN_MESH = ["generate", "--model", "mesh-gpt-tiny", "--method", "ar", "--num", "1", "--max-new-tokens", "8"]
COMMANDS = [GEN_TEXT, GEN_IMAGE, GEN_MESH, ["train-heads", "--out", "run"],
            ["train-heads", "--kind", "eagle", "--out", "run"], ["train-upsampler", "--out", "run"],
            ["collect-trajectories", "--out", "run"], ["distill", "--out", "run"]]
IDS = ["generate-text", "generate-image", "generate-mesh", "train-heads", "train-heads-eagle", "train-upsampler",
       "collect-trajectories", "distill"]


@NO_CUDA
@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_cuda_request_without_cuda_is_one_line(tiny, cmd):  # noqa: F811
    check_refusal(tiny, [*cmd, "--device", "cuda"], 2, "no CUDA GPU")


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_unknown_device_is_one_line(tiny, cmd):  # noqa: F811
    check_refusal(tiny, [*cmd, "--device", "tpu9"], 2, "unknown device 'tpu9'")


@NO_FP16
@pytest.mark.parametrize("cmd", [GEN_TEXT, GEN_IMAGE, GEN_MESH, ["collect-trajectories", "--out", "run"]],
                         ids=["generate-text", "generate-image", "generate-mesh", "collect-trajectories"])
def test_float16_on_this_cpu_is_one_line(tiny, cmd):  # noqa: F811
    check_refusal(tiny, [*cmd, "--dtype", "float16"], 2, "float16 needs a CUDA device")


@pytest.mark.parametrize("cmd", [GEN_IMAGE, GEN_MESH], ids=["generate-image", "generate-mesh"])
def test_quantize_with_float32_activations_is_one_line(tiny, cmd):  # noqa: F811
    check_refusal(tiny, [*cmd, "--quantize", "int8", "--dtype", "float32"], 2, "runs bfloat16 activations")


@NO_CUDA
def test_device_auto_is_cpu_here(tiny):  # noqa: F811
    import json

    outs = []
    for device in ("auto", "cpu"):
        r = invoke(*GEN_TEXT, "--device", device, "--format", "json")
        assert r.exit_code == 0, r.output
        outs.append(json.loads(r.stdout.splitlines()[0])["token_ids"])
    assert outs[0] == outs[1]
    r = invoke(*GEN_MESH, "--device", "auto", "--dtype", "bfloat16", "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.splitlines()[0])["num_tokens"] > 0


# ---- on a GPU ----------------------------------------------------------------------------------------------------
@pytest.mark.gpu  # skipped without CUDA by tests/conftest.py
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_greedy_lossless_equals_ar_in_each_dtype(dtype):
    from specgen.decoding.sampling import SamplingParams
    from specgen.decoding.target import ModelTarget
    from specgen.methods import run_batch
    from specgen.models.layout import decode_layout
    from specgen.models.packed_linear import PackedLinear
    from tests.conftest import method_drafter, tiny_model

    model = decode_layout(tiny_model(0).to("cuda", dtype))
    assert all(type(m) is not PackedLinear for m in model.modules())
    target = ModelTarget(model)
    target.device = "cuda"
    prompt = [[1, 2, 3, 1, 2, 3, 1]]
    ar = run_batch(target, lambda i: method_drafter("ar"), prompt, 16, SamplingParams()).results[0].tokens
    for name in ("ngram", "jacobi"):
        got = run_batch(target, lambda i: method_drafter(name), prompt, 16, SamplingParams())
        assert got.results[0].tokens == ar, name
    sampled = [run_batch(target, lambda i: method_drafter("ar"), prompt, 8, SamplingParams(1.0),
                         generators=[torch.Generator().manual_seed(0)]).results[0].tokens for _ in range(2)]
    assert sampled[0] == sampled[1]  # CPU generators drive CUDA sampling (decoding/sampling.on_generator)


def test_bfloat16_on_a_cpu_without_its_kernels_runs_with_a_warning(monkeypatch):
    """An AVX2-only CPU: oneDNN refuses bfloat16 and torch's fallback GEMM took ~10x float32's time. Not refused (it
    computes the same numbers), but said once, as the CLI prints Python warnings after a command succeeds."""
    import warnings

    monkeypatch.setattr(devices, "onednn_packs", lambda dtype: dtype == torch.float32)
    with pytest.warns(UserWarning, match="bfloat16 weights on this CPU"):
        assert devices.resolve_dtype("bfloat16", "cpu") is torch.bfloat16
    monkeypatch.setattr(devices, "onednn_packs", lambda dtype: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert devices.resolve_dtype("bfloat16", "cpu") is torch.bfloat16
        assert devices.resolve_dtype("bfloat16", "meta") is torch.bfloat16
