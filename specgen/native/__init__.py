"""Native CPU kernels: C sources beside this file, built at install time or on first use, loaded with ctypes."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE_DIR = Path(__file__).parent
INSTALLED_DIR = SOURCE_DIR / "lib"  # not a package: nothing there is a Python module
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC")
OPENMP = ("-fopenmp",)
#: Libraries that split their work over threads where the process's OpenMP runtime is libgomp (`openmp_flags`).
THREADED = ("tiled", "qmm")
#: Libraries in vec16.h's 16-lane vectors, loaded only where those live in registers (`sixteen_lanes`): elsewhere
#: every operation goes through the stack, slower than torch (docs/results/text.md).
SIXTEEN_LANE = ("attention",)
COMPILE_TIMEOUT_S = 120
PTR, INT, FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
SIGNATURES = {  # library -> function -> (argument types, return type); `es`: element size, 2 bfloat16 / 4 float32
    "attention": {"specgen_attend": ([PTR] * 10 + [INT] * 7 + [FLOAT], INT),
                  "specgen_rope_write_attend": ([PTR] * 3 + [INT] + [PTR] * 10 + [INT] * 7 + [FLOAT], INT),
                  "specgen_plan": ([PTR, INT, INT, INT, PTR, PTR, PTR], INT)},
    "glue": {"specgen_rms_norm": ([PTR] * 3 + [INT, INT, FLOAT, INT], INT),
             "specgen_add_rms_norm": ([PTR] * 5 + [INT, INT, FLOAT, INT], INT)},
    "tiled": {"specgen_tiled_linear": ([PTR] * 4 + [INT] * 4, INT), "specgen_tiled_width": ([], INT)},
    "qmm": {"specgen_qmm": ([PTR, INT, PTR, PTR, INT, INT, PTR] + [INT] * 4, INT), "specgen_qmm_path": ([], INT)},
}


def cpu_signature() -> str:
    """This CPU's model name and flags (the part of /proc/cpuinfo that decides what -march=native emits)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in lines if ln.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")]
    return "\n".join(sorted(set(keep)))


def sixteen_lanes() -> bool:
    """Whether vec16.h's 16-lane vectors live in registers here: AVX-512F (one zmm), or AVX2 + FMA (two ymm halves)."""
    flags = [set(ln.split(":", 1)[1].split()) for ln in cpu_signature().splitlines() if ln.startswith("flags")]
    return any("avx512f" in f or {"avx2", "fma"} <= f for f in flags)


def openmp_flags() -> tuple[str, ...]:
    """OPENMP where torch's threads run on a loaded `libgomp.so.1` (the name a GCC build links: ours then joins torch's
    pool), else () (a hashed libgomp or another runtime would start a second pool spinning against torch's)."""
    import torch  # noqa: F401  (loads torch's OpenMP runtime first, so the check below sees it; setup.py has no torch)

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return ()
    return OPENMP if plain_libgomp_loaded(maps) else ()


def plain_libgomp_loaded(maps: str) -> bool:
    """Whether a /proc/<pid>/maps text maps a file named exactly libgomp.so.1."""
    return any(Path(f).name == "libgomp.so.1" for f in maps.split() if f.startswith("/"))


def key(name: str, flags: tuple[str, ...], compiler: str = "") -> str:
    """A library's identity: its source and the shared headers, the flags, this CPU (`-march=native` code never runs
    on another CPU kind) and (in the cache) the compiler."""
    sources = [(SOURCE_DIR / f"{name}.c").read_bytes()] + [h.read_bytes() for h in sorted(SOURCE_DIR.glob("*.h"))]
    parts = [*sources, " ".join(flags).encode(), compiler.encode(), cpu_signature().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def installed(name: str, flags: tuple[str, ...]) -> Path:
    """Where an install-time build of `name` with `flags` on this CPU lies (it may not exist)."""
    return INSTALLED_DIR / f"{name}-{key(name, flags)}.so"


def built(name: str) -> tuple[Path | None, str]:
    """(`name`'s library for this process: installed, cached or compiled into the cache now, "") or (None, why not).
    A THREADED library is built with OpenMP where `openmp_flags` allows, and without it when that build fails."""
    extra = openmp_flags() if name in THREADED else ()
    path = compile_library(name, FLAGS + extra)[0] if extra else None
    return (path, "") if path else compile_library(name, FLAGS)


def compiler() -> tuple[str | None, str]:
    """(the C compiler `$CC`, else `cc`, and its first --version line) or (None, why not)."""
    cc_name = os.environ.get("CC", "cc")
    if (cc := shutil.which(cc_name)) is None:
        return None, f"no C compiler ({cc_name} not found)"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{cc} --version failed ({e})"
    return cc, (version or [""])[0]


def cache_dir() -> Path:
    """Where first-use builds are kept: `$SPECGEN_CACHE`, default ~/.cache/specgen/native."""
    return Path(os.environ.get("SPECGEN_CACHE") or Path.home() / ".cache" / "specgen" / "native")


def compile_library(name: str, flags: tuple[str, ...]) -> tuple[Path | None, str]:
    """(`<name>.c` with `flags`: installed, else cached, else compiled into the cache now, "") or (None, why not)."""
    if (done := installed(name, flags)).is_file():
        return done, ""
    cc, version = compiler()
    if cc is None:
        return None, version
    out = cache_dir() / f"{name}-{key(name, flags, version)}.so"
    why = "" if out.is_file() else compile_to(cc, name, flags, out)
    return (None, why) if why else (out, "")


def compile_to(cc: str, name: str, flags: tuple[str, ...], out: Path) -> str:
    """Compile `<name>.c` with `flags` into `out`: "" when done, else why not. Atomic: another process sees the
    whole library or none."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        done = subprocess.run([cc, *flags, "-o", tmp, str(SOURCE_DIR / f"{name}.c")], capture_output=True,
                              timeout=COMPILE_TIMEOUT_S)
        if done.returncode != 0:
            os.unlink(tmp)
            first = (done.stderr.decode(errors="replace").strip().splitlines() or [f"exit {done.returncode}"])[0]
            return f"{cc} failed on {name}.c: {first[:120]}"
        os.replace(tmp, out)
    except subprocess.TimeoutExpired:
        return f"{cc} took over {COMPILE_TIMEOUT_S} s on {name}.c"
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot build into {out.parent} ({getattr(e, 'strerror', None) or e})"
    return ""


def bind(path: Path, name: str) -> ctypes.CDLL:
    """The library file `path` loaded with library `name`'s SIGNATURES set (OSError, AttributeError: it does not load
    or lacks a function)."""
    lib = ctypes.CDLL(str(path))
    for fn_name, (args, result) in SIGNATURES[name].items():
        fn = getattr(lib, fn_name)
        fn.argtypes, fn.restype = args, result
    return lib


@functools.cache
def library(name: str) -> ctypes.CDLL | None:
    """The compiled library `name` (a key of SIGNATURES), or None (no compiler, a failed build, `SPECGEN_NATIVE=0`, or
    a SIXTEEN_LANE library without 16-lane vectors: one warning line says why). A file that does not load is rebuilt.
    Cached: which path runs is decided once per process, so every forward computes one way (docs/precision.md)."""
    if os.environ.get("SPECGEN_NATIVE", "1") == "0" or (name in SIXTEEN_LANE and not sixteen_lanes()):
        return None
    for _ in range(2):  # the second pass rebuilds what the first found damaged
        path, why = built(name)
        if path is None:
            break
        try:
            return bind(path, name)
        except (OSError, AttributeError) as e:  # damaged, truncated or foreign: not ours to load
            why = f"{path.name} in {path.parent} does not load ({' '.join(str(e).split())[:120]})"
            with contextlib.suppress(OSError):  # an installed file may be read-only: the warning then names it
                path.unlink()
    if not WARNED:  # one line per process, whichever library hit it first
        print(f"warning: native kernels not used ({why}); CPU decode steps run the torch path "
              "(SPECGEN_NATIVE=0 silences this)", file=sys.stderr)
        WARNED.append(why)
    return None


WARNED: list[str] = []


def describe() -> str:
    """Which path CPU decode steps (float32, bfloat16, quantized) run, for machine labels: "native C", "torch", or
    the libraries built where only some are ("native C (glue, tiled)": no attention.c on an AVX2-only CPU)."""
    built = [name for name in SIGNATURES if library(name) is not None]
    if len(built) == len(SIGNATURES):
        return "native C"
    return f"native C ({', '.join(built)})" if built else "torch"
