"""Native CPU kernels: C sources beside this file, built at install time or on first use, loaded with ctypes.

Why: a low-precision SmolLM2 decode step ran ~2,300 small aten ops, and on this kind of CPU their dispatch cost
as much as the quantized products (docs/results/precision.md). `attention.c` does a layer's RoPE, cache write and
attention in one call; `glue.c` the norms and residual adds around the products; `tiled.c` float32 linear products
of a few rows, where MKL and oneDNN left half the memory bandwidth unused. Models reach them only through the torch
ops of `ops.py` (`torch.ops.specgen.*`); which of them a forward runs is `models/kernel_choice.py`'s rule.

Where a library comes from, first found wins: the install-time build (`pip install` compiles the sources into
`lib/` where a compiler exists, setup.py), then `$SPECGEN_CACHE` (default `~/.cache/specgen/native`), else it is
compiled there now with `$CC` (else `cc`). Each file is named by a hash of its source and headers, flags and this
CPU's model and flags (the cache's also by the compiler's version): `-march=native` code built on another CPU kind
(a shared home directory, a copied wheel) is never loaded. Without a compiler, or with `SPECGEN_NATIVE=0`, nothing
is loaded and callers use their torch path (one `warning:` line on stderr says so, and why, unless SPECGEN_NATIVE=0
asked for it); a cached library that does not load (damaged, foreign) is removed and built again. `attention.c`,
written in vec16.h's 16-lane vectors, is loaded only where those live in registers (AVX-512, or AVX2 + FMA as two
halves: `SIXTEEN_LANE`).

Which path runs is decided once per process (`library()` is cached), so every forward of a model computes the same
way: a speculative method is lossless against AR of the model that runs, whichever path that is. The two paths round
differently, so a quantized model's greedy outputs may differ between a machine with a compiler and one without.
"""

from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

from specgen.native.toolchain import FLAGS, NAMES, OPENMP, THREADED, compile_to, compiler, cpu_signature, installed, key

#: Libraries written in vec16.h's 16-lane vectors, loaded only where those live in registers (`sixteen_lanes`): as
#: GCC's generic vectors on an AVX2-only EPYC every operation went through the stack, and attention.c ran slower
#: than the torch paths it replaces, until vec16.h got its two-halves form (docs/results/text.md, "An AVX2-only CPU").
SIXTEEN_LANE = ("attention",)
PTR, INT, FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
SIGNATURES = {  # library -> function -> (argument types, return type); `es`: element size, 2 bfloat16 / 4 float32
    "attention": {"specgen_attend": ([PTR] * 10 + [INT] * 7 + [FLOAT], INT),
                  "specgen_rope_write_attend": ([PTR] * 3 + [INT] + [PTR] * 10 + [INT] * 7 + [FLOAT], INT),
                  "specgen_plan": ([PTR, INT, INT, INT, PTR, PTR, PTR], INT)},
    "glue": {"specgen_rms_norm": ([PTR] * 3 + [INT, INT, FLOAT, INT], INT),
             "specgen_add_rms_norm": ([PTR] * 5 + [INT, INT, FLOAT, INT], INT)},
    "tiled": {"specgen_tiled_linear": ([PTR] * 4 + [INT] * 4, INT), "specgen_tiled_width": ([], INT),
              "specgen_tiled_openmp": ([], INT)},
}


def cache_dir() -> Path:
    return Path(os.environ.get("SPECGEN_CACHE") or Path.home() / ".cache" / "specgen" / "native")


def sixteen_lanes() -> bool:
    """Whether vec16.h's 16-lane vectors live in registers on this CPU: AVX-512F (one zmm), or AVX2 + FMA (two ymm
    halves). Elsewhere GCC's generic 64-byte vectors go through the stack, and SIXTEEN_LANE libraries are not loaded."""
    flags = [set(ln.split(":", 1)[1].split()) for ln in cpu_signature().splitlines() if ln.startswith("flags")]
    return any("avx512f" in f or {"avx2", "fma"} <= f for f in flags)


def openmp_flags() -> tuple[str, ...]:
    """OPENMP where torch runs its threads on a libgomp already loaded in this process under the file name (and
    soname) `libgomp.so.1` that a GCC build links against: the library then joins torch's thread pool. Elsewhere ()
    and a one-thread library: a wheel whose libgomp carries a hashed name (libgomp-<hash>.so.1), or another runtime
    (libiomp5, libomp), would leave ours loading a second OpenMP runtime whose threads spin against torch's."""
    import torch  # noqa: F401  (loads torch's OpenMP runtime first, so the check below sees it)

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return ()
    return OPENMP if plain_libgomp_loaded(maps) else ()


def plain_libgomp_loaded(maps: str) -> bool:
    """Whether a /proc/<pid>/maps text maps a file named exactly libgomp.so.1."""
    return any(Path(f).name == "libgomp.so.1" for f in maps.split() if f.startswith("/"))


def build(name: str) -> Path | None:
    """`name`'s library for this process: installed, cached or compiled into the cache now; None without a compiler
    or when the compile fails. A THREADED library is built with OpenMP where `openmp_flags` allows, and without it
    when that build fails."""
    return built(name)[0]


def built(name: str) -> tuple[Path | None, str]:
    """(`build`'s library, "") or (None, why not)."""
    extra = openmp_flags() if name in THREADED else ()
    path, why = compile_library(name, FLAGS + extra) if extra else (None, "")
    return (path, "") if path else compile_library(name, FLAGS)


def compile_library(name: str, flags: tuple[str, ...]) -> tuple[Path | None, str]:
    """(`<name>.c` with `flags`: the install-time build, else the cache's, else compiled into the cache now, "") or
    (None, why not)."""
    if (done := installed(name, flags)).is_file():
        return done, ""
    cc, version = compiler()
    if cc is None:
        return None, version
    out = cache_dir() / f"{name}-{key(name, flags, version)}.so"
    if out.is_file():
        return out, ""
    why = compile_to(cc, name, flags, out)
    return (None, why) if why else (out, "")


@functools.cache
def library(name: str) -> ctypes.CDLL | None:
    """The compiled library `name` (one of NAMES), or None (no compiler, a failed build, `SPECGEN_NATIVE=0`, or a
    SIXTEEN_LANE library on a CPU without 16-lane vectors). Cached: a process decides once. A file that does not
    load or lacks a function is removed and built once more; where the native path was expected and is not used,
    one warning line says so."""
    if os.environ.get("SPECGEN_NATIVE", "1") == "0" or (name in SIXTEEN_LANE and not sixteen_lanes()):
        return None
    lib, why = None, ""
    for _ in range(2):  # the second pass rebuilds what the first found damaged
        path, why = built(name)
        if path is None:
            break
        try:
            lib = ctypes.CDLL(str(path))
            for fn_name, (args, result) in SIGNATURES[name].items():
                fn = getattr(lib, fn_name)
                fn.argtypes, fn.restype = args, result
            return lib
        except (OSError, AttributeError) as e:  # damaged, truncated or foreign: not ours to load
            why = f"{path.name} in {path.parent} does not load ({' '.join(str(e).split())[:120]})"
            path.unlink(missing_ok=True)
    fall_back(why)
    return None


def fall_back(why: str) -> None:
    """The one stderr line per process saying the native kernels are not used, and why."""
    if not WARNED:
        import sys

        print(f"warning: native kernels not used ({why}); CPU decode steps run the torch path "
              "(SPECGEN_NATIVE=0 silences this)", file=sys.stderr)
        WARNED.append(why)


WARNED: list[str] = []  # the reason already printed: one line per process, whichever library hit it first


def attention() -> ctypes.CDLL | None:
    """The attention kernels (attention.c), or None."""
    return library("attention")


def glue() -> ctypes.CDLL | None:
    """The row-wise kernels between products (glue.c: RMSNorm, residual add + RMSNorm), or None."""
    return library("glue")


def tiled() -> ctypes.CDLL | None:
    """The float32 linear products over tiled weights (tiled.c), or None."""
    return library("tiled")


def describe() -> str:
    """Which path CPU decode steps (float32, bfloat16, quantized) run, for machine labels: "native C", "torch", or
    the libraries built where only some are ("native C (glue, tiled)": no attention.c on an AVX2-only CPU)."""
    built = [name for name in NAMES if library(name) is not None]
    if len(built) == len(NAMES):
        return "native C"
    return f"native C ({', '.join(built)})" if built else "torch"
