"""The facts of this machine that decide how specgen runs: devices, ISA, threads, kernels, caches, native build."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from specgen import native, registry
from specgen.decoding import cost
from specgen.devices import is_cpu, onednn_packs
from specgen.limits import usable_cpus
from specgen.models import kernel_choice, layout, layout_cache, quantize
from specgen.native import cuda_ops

#: CPU flags that change a kernel's path or speed (x86 /proc/cpuinfo names; ARM's `Features` are kept as they come).
ISA = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_ne_convert",
       "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "bf16")
QUANTIZED_MM = {"int8": "torch _weight_int8pack_mm", "int4": "torch _weight_int4pack_mm_for_cpu"}
QMM_PATHS = ("plain C", "AVX2", "AVX-512 VNNI")  # by qmm.c's specgen_qmm_path()


def cpu_lines(field: str) -> list[str]:
    """The values of a /proc/cpuinfo field, as `native.cpu_signature` keeps them (one per distinct line)."""
    return [ln.split(":", 1)[1].strip() for ln in native.cpu_signature().splitlines()
            if ":" in ln and ln.split(":", 1)[0].strip() == field]


def cpuinfo(field: str) -> str:
    """The first value of a /proc/cpuinfo field ("" where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.split(":", 1)[0].strip() == field), "")


def devices() -> list[dict]:
    """The CPU and every CUDA device torch sees."""
    name = (cpu_lines("model name") or [platform.processor() or platform.machine()])[0]
    pairs = (("family", cpuinfo("cpu family")), ("model", cpuinfo("model")))  # x86: what tells VM kinds apart
    kind = " ".join(f"{word} {value}" for word, value in pairs if value)  # where the name does not (Zen 4 or 5)
    cpu = {"name": "cpu", "model": f"{name} ({kind})" if kind else name, "arch": platform.machine(),
           "cpus": os.cpu_count()}
    gpus = [{"name": f"cuda:{i}", "model": torch.cuda.get_device_name(i),
             "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
            for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return [cpu, *gpus]


def float_path() -> dict:
    """float32 and bfloat16 products on the CPU: the weight layout and its kernels."""
    name = layout.layout_name()
    if name != "packed":
        why = f"{layout.ENV}={name}" if os.environ.get(layout.ENV) else "this torch build has no oneDNN"
        return {"path": f"MKL, {name} layout", "why": why}
    if native.library("tiled") is None:
        return {"path": "packed layout, oneDNN", "why": "native tiled not built: a row's bits depend on its batch"}
    bf16 = (f"weights from 2^18 elements oneDNN AMX, steps in {kernel_choice.AMX_SLICE_ROWS}-row slices, two a call "
            "where that gives each slice's bits"
            if kernel_choice.amx_bf16() and onednn_packs(torch.bfloat16) else "native tiled, prompts oneDNN")
    return {"path": f"packed layout, native tiled (bfloat16: {bf16})",
            "why": "one kernel shape at every row count, so a row's bits do not depend on its verify width"}


def quantized_path(mode: str) -> dict:
    """int8 / int4 text targets: qmm.c (15-bit activations) or torch's packed kernels at every row count."""
    prefill = f"bfloat16 GEMM from {quantize.PROMPT_MIN_ROWS[mode]} rows" if quantize.bf16_gemm() else "the same kernel"
    why = "one kernel at every row count, so a row's bits do not depend on its verify width"
    qmm = native.library("qmm")  # kernel_choice.quantized_product: qmm.c wherever it is built (and widths fit)
    if qmm is not None:
        isa = QMM_PATHS[qmm.specgen_qmm_path()]
        path = f"native qmm.c ({isa}), activations in two int8 bytes (15 bits), LM head too"
    else:
        path = f"{QUANTIZED_MM[mode]}, bfloat16 activations; LM head torch _weight_int8pack_mm"
        why += "; qmm.c not built here"
    if not onednn_packs(torch.bfloat16):
        why += "; no AVX-512 bfloat16 here: a prompt's bfloat16 products run torch's slow fallback"
    return {"path": f"{path}; prefill {prefill}", "why": why}


def kernel_paths(device: str | None = None) -> dict[str, dict]:
    """Model family -> the kernel path its linear products take on `device` (None: cpu) and why; `step_kernels`:
    the norms and attention around them (`specgen/native`)."""
    if not is_cpu(device):
        gpu = {"path": "cuBLAS (torch) in 64-row GEMM slices (row-invariant), decode steps replayed as CUDA graphs "
                       "(--graphs auto)",
               "why": "a GPU: the CPU layouts and native kernels do not apply"}
        steps = ({"path": "attention: each query over its visible slots, one Triton kernel a layer (cuda_ops.py)",
                  "why": "Triton imports here"} if cuda_ops.available() else
                 {"path": "attention: torch ops (bfloat16 chunked, float32 SDPA)", "why": "Triton is not installed"})
        return {"text float32": gpu, "text int8": {"path": "refused", "why": "--quantize uses CPU kernels"},
                "text int4": {"path": "refused", "why": "--quantize uses CPU kernels"}, "image": gpu, "mesh": gpu,
                "step_kernels": steps}
    steps = native.describe()
    why = ("SPECGEN_NATIVE=0" if os.environ.get("SPECGEN_NATIVE", "1") == "0" else "no C compiler"
           if native.compiler()[0] is None else "built at pip install, else once per machine into the native cache")
    why += "" if native.sixteen_lanes() else "; no 16-lane vectors (AVX-512F or AVX2 + FMA): no attention.c"
    floats = float_path()
    return {"text float32": floats, "text int8": quantized_path("int8"), "text int4": quantized_path("int4"),
            "image": floats, "mesh": floats, "step_kernels": {"path": steps, "why": why}}


def caches() -> dict[str, dict]:
    """Where specgen keeps files, with their sizes."""
    places = {"home": registry.home(), "registry": registry.checkpoints_dir(),
              "cost_curves": cost.path(), "decoded_weights": layout_cache.folder(), "native_cache": native.cache_dir()}
    return {k: {"path": str(p), "exists": p.exists(),  # bytes: under a file or a folder (0 when absent)
                "bytes": sum(f.stat().st_size for f in [p, *p.rglob("*")] if f.is_file() and not f.is_symlink())}
            for k, p in places.items()}


def machine_facts(device: str | None = None) -> dict:
    """Everything above as one JSON-ready object (`specgen env --json`, benchmark machine files)."""
    libraries = {name: native.library(name) is not None for name in native.SIGNATURES}  # built on first use
    have = {flag for line in cpu_lines("flags") + cpu_lines("Features") for flag in line.split()}
    threads = {"torch": torch.get_num_threads(), "usable_cpus": usable_cpus(), "cpus": os.cpu_count()}
    return {"devices": devices(), "isa": [flag for flag in ISA if flag in have], "threads": threads,
            "torch": torch.__version__, "cuda": torch.version.cuda, "kernels": kernel_paths(device),
            "native": {"compiler": native.compiler()[0], "libraries": libraries}, "caches": caches()}


#: (flag, name): the widest vector ISA, the one fact of `isa` the machine column names (kernels and speed follow it:
#: an AVX2-only CPU's rows are not an AVX-512 one's)
VECTOR_ISA = (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("sve", "SVE"), ("asimd", "NEON"))


def label(facts: dict, device: str | None = None) -> str:
    """The one-line machine column of benchmark tables and rows, from `machine_facts(device)`: `specgen env`'s CPU
    model and widest vector ISA first, then threads and the kernel paths."""
    cpu, t = facts["devices"][0], facts["threads"]
    vector = next((f" {name}" for flag, name in VECTOR_ISA if flag in facts["isa"]), "")
    host = f"{cpu['model']}, {cpu['arch']}{vector}, {cpu['cpus']} cpus, torch threads {t['torch']}"
    if not is_cpu(device):
        steps = facts["kernels"]["step_kernels"]["path"]
        gpu = f"{torch.cuda.get_device_name(device)}, torch {facts['torch']}, CUDA {facts['cuda']}"
        return f"{gpu}, {steps}; host {host}"
    name = layout.layout_name()
    steps = facts["kernels"]["step_kernels"]["path"]
    if kernel_choice.CAPPED_CHUNKED[0]:  # a Gemma 2 ran here: its capped scores take no attention.c (no cap there)
        steps += ", softcapped attention torch chunked"
    return f"{host}, {name} layout, step kernels {steps}"
