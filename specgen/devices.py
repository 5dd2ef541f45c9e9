"""Devices and dtypes of every command that runs a model: one parser, one check, and clocks that are honest on GPUs."""

from __future__ import annotations

import functools
import itertools
import time
import warnings
from array import array

import torch

from specgen.errors import UsageError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICE_HELP = "use cpu, cuda, cuda:N or auto"


def check_device(device: str, allow_auto: bool = True) -> None:
    """A torch device string that exists on this machine (cpu, cuda, cuda:N, mps), or "auto" (when allowed)."""
    if device == "auto":
        if allow_auto:
            return
        raise UsageError(f"device 'auto' is not accepted here; {DEVICE_HELP.replace(' or auto', '')}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UsageError(f"unknown device {device!r}; {DEVICE_HELP}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"device {device!r}: no CUDA GPU is available to this torch; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise UsageError(f"device {device!r}: MPS is not available here; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise UsageError(f"unsupported device {device!r}; {DEVICE_HELP}")


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """The torch.device for `spec` ("auto"/None/"" = cuda when available, else cpu); a missing one is a UsageError."""
    spec = str(spec or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    check_device(spec)
    dev = torch.device(spec)
    return torch.device("cpu") if dev.type == "cpu" else dev  # one CPU device: t.to("cpu:0") would copy a cpu tensor


def on_gpu(spec: str | torch.device | None) -> bool:
    """Whether a run on `spec` decodes off the CPU (whose GPU option defaults it takes: `options.gpu_defaults`), without
    requiring the device here (a plan made on a login node): any device but the CPU, or auto (None, "") where this
    machine has CUDA."""
    spec = str(spec or "auto").strip().lower()
    return torch.cuda.is_available() if spec == "auto" else not spec.startswith("cpu")


def device_name(spec: str | torch.device | None) -> str:
    """`resolve_device` as the string configs and loaders carry ("cpu", "cuda", "cuda:1")."""
    return str(resolve_device(spec))


def train_device(spec: str | None) -> str:
    """The device string of a training command: None is "cpu" (the tiny recipes' shipped weights are CPU numerics,
    reproduced bit for bit there), "auto" is cuda when present."""
    return "cpu" if spec in (None, "") else device_name(spec)


def is_cpu(device: str | torch.device | None) -> bool:
    """Whether `device` (a string, torch.device, or None = cpu) is the CPU: the packed layout applies only there."""
    return device is None or torch.device(device).type == "cpu"


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of a module's first parameter or buffer (cpu for a module without any)."""
    return next((t.device for t in itertools.chain(module.parameters(), module.buffers())), torch.device("cpu"))


@functools.cache
def onednn_packs(dtype: torch.dtype) -> bool:
    """Whether oneDNN's packed linear layout (`models/packed_linear.py`) takes `dtype` weights on this CPU (asked of
    oneDNN itself, once per dtype, with an 8 x 8 weight; docs/precision.md says which ISA each needs)."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), 16)
        return True
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def resolve_dtype(name: str | None, device: str | torch.device | None = "cpu", quantize: str | None = None) -> torch.dtype:
    """float32 (None) | bfloat16 | float16 -> torch dtype, checked against the device it will run on (`quantize`:
    the weight-only mode already chosen, whose activations are bfloat16)."""
    name = name or "float32"
    if name not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    # without native float16 kernels torch converts on the CPU, slower than bfloat16: refused rather than run slowly
    if name == "float16" and is_cpu(device) and not onednn_packs(torch.float16):
        raise UsageError("float16 needs a CUDA device (this CPU has no native float16 kernels); use bfloat16 on CPU")
    if name == "bfloat16" and is_cpu(device) and not onednn_packs(torch.bfloat16):  # runs, but slowly: say so
        faster = "plain float32 (no --quantize) is" if quantize else "float32 or --quantize int8|int4 is"
        what = f"--quantize {quantize}'s bfloat16 activations" if quantize else "bfloat16 weights"
        warnings.warn(f"{what} on this CPU (no AVX-512 bfloat16 support) run torch's slow fallback, ~10x "
                      f"float32's time: {faster} faster here", stacklevel=2)
    return DTYPES[name]


def synchronize(device: str | torch.device | None = None) -> None:
    """Wait until `device`'s queued kernels are done (cpu: at once); None: the current CUDA device if this process
    has used CUDA, so library timers are honest without knowing the device."""
    dev = torch.device("cuda" if device is None else device)  # "cuda": the current CUDA device
    if dev.type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.synchronize(dev)
    elif dev.type == "mps" and hasattr(torch, "mps"):
        torch.mps.synchronize()


def mark(device) -> torch.cuda.Event | None:
    """A point in `device`'s queue, now, for `wait_for` (CUDA); None elsewhere, where queued work is already done."""
    if torch.device(device).type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def wait_for(event: torch.cuda.Event | None) -> None:
    """Wait on the host until the device has run up to `event` (`mark`); the work queued after it runs on."""
    if event is not None:
        event.synchronize()


def host_tensor(data, device) -> torch.Tensor:
    """`torch.tensor(data)` made on the host and queued to `device` without making the host wait (`to_device`); ints,
    flat or in equal rows, through `int_tensor`."""
    first = data[0] if isinstance(data, list) and data else None
    if type(first) is int or (type(first) is list and bool(first) and type(first[0]) is int):
        try:
            return to_device(int_tensor(data), device)
        except TypeError:  # a float among them: torch.tensor's float tensor
            pass
    return to_device(torch.tensor(data), device)


def int_tensor(values: list) -> torch.Tensor:
    """Ints [N], or equal-length rows of them [M][N], as an int64 host tensor through a packed buffer: `torch.tensor`
    checks each element's type, which costs a step's staged inputs (a few hundred ints) more than the rest of their
    staging."""
    if values and isinstance(values[0], list):
        return int_tensor(list(itertools.chain.from_iterable(values))).view(len(values), len(values[0]))
    return torch.frombuffer(array("q", values), dtype=torch.int64) if values else torch.zeros(0, dtype=torch.int64)


def host_inputs(tokens: list, positions: list, mask: torch.Tensor | None, device) -> tuple:
    """A forward's inputs built on the host on `device` without a wait: tokens and positions [n][S] in one copy, the
    host tree mask (or None) in another."""
    tokens, positions = host_tensor([tokens, positions], device)
    return tokens, positions, None if mask is None else to_device(mask, device)


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """A host tensor queued to `device` without making the host wait: on cuda through page-locked memory (a copy from
    pageable memory waits for everything queued before it), elsewhere `t.to(device)`."""
    dev = torch.device(device)
    if dev.type != "cuda" or t.device.type != "cpu":
        return t.to(dev)
    return t.pin_memory().to(dev, non_blocking=True)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Write src into dst without making the host wait: a host tensor into a cuda buffer through page-locked memory
    (`to_device`'s copy, into a buffer that exists)."""
    host_to_cuda = dst.device.type == "cuda" and src.device.type == "cpu"
    dst.copy_(src.pin_memory() if host_to_cuda else src, non_blocking=True)


def now(device: str | torch.device | None = None) -> float:
    """`time.perf_counter()` after `device` finished its queued work (`synchronize`)."""
    synchronize(device)
    return time.perf_counter()
