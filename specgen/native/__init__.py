"""Native CPU kernels, compiled once per machine from the C sources beside this file and loaded with ctypes.

Why: a low-precision SmolLM2 decode step ran ~2,300 small aten ops, and on this kind of CPU their dispatch cost
as much as the quantized products (docs/results/precision.md). `attention.c` does a layer's RoPE, cache write and
attention in one call; `glue.c` the norms and residual adds around the products; `tiled.c` float32 linear products
of a few rows, where MKL and oneDNN left half the memory bandwidth unused (`models/kernel_choice.py` decides per
machine whether they run).

How: the first use compiles each source with the system C compiler (`$CC`, else `cc`) into a shared library under
`$SPECGEN_CACHE` (default `~/.cache/specgen/native`), named by a hash of the source, the flags, the compiler's
version and this CPU's model and flags (`-march=native` code must not run on another CPU kind sharing a home
directory). Without a compiler, or with `SPECGEN_NATIVE=0`, nothing is built and callers use their torch path (one
`warning:` line on stderr says so, and why, unless SPECGEN_NATIVE=0 asked for it); a cached library that does not
load (damaged, foreign) is removed and built again;
`attention.c`, written in vec16.h's 16-lane vectors, is loaded only where those live in registers (AVX-512, or AVX2 +
FMA as two halves: `SIXTEEN_LANE`).

Which path runs is decided once per process (`library()` is cached), so every forward of a model computes the same
way: a speculative method is lossless against AR of the model that runs, whichever path that is. The two paths round
differently, so a quantized model's greedy outputs may differ between a machine with a compiler and one without.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE_DIR = Path(__file__).parent
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC")
#: Libraries that split their work over threads where the process's OpenMP runtime is libgomp (`openmp_flags`).
THREADED = ("tiled",)
#: Libraries written in vec16.h's 16-lane vectors, loaded only where those live in registers (`sixteen_lanes`): as
#: GCC's generic vectors on an AVX2-only EPYC every operation went through the stack, and attention.c ran 2-10x slower
#: than the torch paths it replaces, until vec16.h got its two-halves form (docs/results/text.md, "An AVX2-only CPU").
SIXTEEN_LANE = ("attention",)
COMPILE_TIMEOUT_S = 120


def cache_dir() -> Path:
    return Path(os.environ.get("SPECGEN_CACHE") or Path.home() / ".cache" / "specgen" / "native")


def cpu_signature() -> str:
    """This CPU's model name and flags (the part of /proc/cpuinfo that decides what -march=native emits)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in lines if ln.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")]
    return "\n".join(sorted(set(keep)))


def sixteen_lanes() -> bool:
    """Whether vec16.h's 16-lane vectors live in registers on this CPU: AVX-512F (one zmm), or AVX2 + FMA (two ymm
    halves). Elsewhere GCC's generic 64-byte vectors go through the stack, and SIXTEEN_LANE libraries are not loaded."""
    flags = [set(ln.split(":", 1)[1].split()) for ln in cpu_signature().splitlines() if ln.startswith("flags")]
    return any("avx512f" in f or {"avx2", "fma"} <= f for f in flags)


def openmp_flags() -> tuple[str, ...]:
    """("-fopenmp",) where torch runs its threads on a libgomp already loaded in this process under the file name
    (and soname) `libgomp.so.1` that a GCC build links against: the library then joins torch's thread pool. Elsewhere
    () and a one-thread library: a wheel whose libgomp carries a hashed name (libgomp-<hash>.so.1), or another
    runtime (libiomp5, libomp), would leave ours loading a second OpenMP runtime whose threads spin against torch's."""
    import torch  # noqa: F401  (loads torch's OpenMP runtime first, so the check below sees it)

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return ()
    return ("-fopenmp",) if plain_libgomp_loaded(maps) else ()


def plain_libgomp_loaded(maps: str) -> bool:
    """Whether a /proc/<pid>/maps text maps a file named exactly libgomp.so.1."""
    return any(Path(f).name == "libgomp.so.1" for f in maps.split() if f.startswith("/"))


def build(name: str) -> Path | None:
    """Compile `<name>.c` into the cache (once per source and shared headers, flags, compiler and CPU); None without
    a compiler or when the compile fails. A THREADED library is built with OpenMP where `openmp_flags` allows, and
    without it when that build fails."""
    return built(name)[0]


def built(name: str) -> tuple[Path | None, str]:
    """(`build`'s library, "") or (None, why not)."""
    extra = openmp_flags() if name in THREADED else ()
    path, why = compile_library(name, FLAGS + extra) if extra else (None, "")
    return (path, "") if path else compile_library(name, FLAGS)


def compile_library(name: str, flags: tuple[str, ...]) -> tuple[Path | None, str]:
    """(`<name>.c` compiled with `flags` into the cache, "") or (None, why not)."""
    cc_name = os.environ.get("CC", "cc")
    cc = shutil.which(cc_name)
    if cc is None:
        return None, f"no C compiler ({cc_name} not found)"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{cc} --version failed ({e})"
    sources = [(SOURCE_DIR / f"{name}.c").read_bytes()] + [h.read_bytes() for h in sorted(SOURCE_DIR.glob("*.h"))]
    key = hashlib.sha256(b"\0".join([*sources, " ".join(flags).encode(), (version or [""])[0].encode(),
                                     cpu_signature().encode()])).hexdigest()[:16]
    out = cache_dir() / f"{name}-{key}.so"
    if out.is_file():
        return out, ""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        done = subprocess.run([cc, *flags, "-o", tmp, str(SOURCE_DIR / f"{name}.c")], capture_output=True,
                              timeout=COMPILE_TIMEOUT_S)
        if done.returncode != 0:
            os.unlink(tmp)
            first = (done.stderr.decode(errors="replace").strip().splitlines() or [f"exit {done.returncode}"])[0]
            return None, f"{cc} failed on {name}.c: {first[:120]}"
        os.replace(tmp, out)  # atomic: a concurrent process sees the whole library or none
    except subprocess.TimeoutExpired:
        return None, f"{cc} took over {COMPILE_TIMEOUT_S} s on {name}.c"
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"cannot build into {out.parent} ({getattr(e, 'strerror', None) or e})"
    return out, ""


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


@functools.cache
def library(name: str) -> ctypes.CDLL | None:
    """The compiled library `name` (a key of SIGNATURES), or None (no compiler, a failed build, `SPECGEN_NATIVE=0`,
    or a SIXTEEN_LANE library on a CPU without 16-lane vectors). Cached: a process decides once. A cached file that
    does not load or lacks a function is removed and built once more; where the native path was expected and is
    not used, one warning line says so."""
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
            why = f"{path.name} in the cache does not load ({' '.join(str(e).split())[:120]})"
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
    built = [name for name in SIGNATURES if library(name) is not None]
    if len(built) == len(SIGNATURES):
        return "native C"
    return f"native C ({', '.join(built)})" if built else "torch"
