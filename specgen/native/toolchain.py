"""Compiling the C kernels into shared libraries: torch-free, for setup.py at install time and the loader at use."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE_DIR = Path(__file__).parent
#: Where an install-time build puts its libraries (not a package: nothing there is a Python module).
INSTALLED_DIR = SOURCE_DIR / "lib"
NAMES = ("attention", "glue", "tiled")
# -march=native: the code is for the CPU that builds it; every library's name carries that CPU's signature (`key`),
# so a library built on another CPU kind (a shared home, a copied wheel) is never loaded, only rebuilt here.
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC")
OPENMP = ("-fopenmp",)
#: Libraries that split their work over threads where the process's OpenMP runtime is libgomp (native.openmp_flags).
THREADED = ("tiled",)
COMPILE_TIMEOUT_S = 120


def cpu_signature() -> str:
    """This CPU's model name and flags (the part of /proc/cpuinfo that decides what -march=native emits)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in lines if ln.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")]
    return "\n".join(sorted(set(keep)))


def variants(name: str) -> tuple[tuple[str, ...], ...]:
    """The flag sets `name` is built with: with and without OpenMP for THREADED libraries (which one loads is known
    only at run time, from the OpenMP runtime torch brought), else FLAGS alone."""
    return (FLAGS + OPENMP, FLAGS) if name in THREADED else (FLAGS,)


def key(name: str, flags: tuple[str, ...], compiler: str = "") -> str:
    """A library's identity: its source and the shared headers, the flags, this CPU and (in the cache) the compiler."""
    sources = [(SOURCE_DIR / f"{name}.c").read_bytes()] + [h.read_bytes() for h in sorted(SOURCE_DIR.glob("*.h"))]
    parts = [*sources, " ".join(flags).encode(), compiler.encode(), cpu_signature().encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def installed(name: str, flags: tuple[str, ...]) -> Path:
    """Where an install-time build of `name` with `flags` on this CPU lies (it may not exist)."""
    return INSTALLED_DIR / f"{name}-{key(name, flags)}.so"


def compiler() -> tuple[str | None, str]:
    """(the C compiler `$CC`, else `cc`, and its first --version line) or (None, why not)."""
    cc_name = os.environ.get("CC", "cc")
    cc = shutil.which(cc_name)
    if cc is None:
        return None, f"no C compiler ({cc_name} not found)"
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{cc} --version failed ({e})"
    return cc, (version or [""])[0]


def compile_to(cc: str, name: str, flags: tuple[str, ...], out: Path) -> str:
    """Compile `<name>.c` with `flags` into `out` ("" when done, else why not); atomic: another process sees the
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
