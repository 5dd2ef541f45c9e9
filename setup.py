"""Install-time build of the native kernels (specgen/native/*.c) into specgen/native/lib/, where a C compiler exists.

Each is a plain C shared library, not a Python module, compiled without torch (pip's isolated build has none) by the
same code and flags as the first-use build (specgen/native/__init__.py), `-march=native` included: the library is
for the installing machine's CPU, and its file name carries that CPU's signature, so a wheel copied to another CPU
kind is never loaded there (the kernels are then built on first use). A failed or impossible compile is one warning
and the install goes on; the first-use build stays the fallback.
"""

import importlib.util
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

spec = importlib.util.spec_from_file_location("native", Path(__file__).parent / "specgen" / "native" / "__init__.py")
native = importlib.util.module_from_spec(spec)
spec.loader.exec_module(native)  # by path, torch-free: importing the specgen package would import torch


class BuildKernels(build_ext):
    """Compiles each kernel library with native.compile_to under its native.installed name."""

    def get_ext_filename(self, fullname: str) -> str:
        return str(Path(*fullname.split("."))) + ".so"

    def copy_extensions_to_source(self) -> None:  # an editable install: into the checkout's specgen/native/lib/
        native.INSTALLED_DIR.mkdir(exist_ok=True)
        super().copy_extensions_to_source()

    def build_extension(self, ext: Extension) -> None:
        cc, why = native.compiler()
        if cc is not None:
            why = native.compile_to(cc, ext.kernel, ext.flags, Path(self.get_ext_fullpath(ext.name)))
        if why:
            raise CompileError(why)  # the extension is optional: a warning, and no library


def kernel(name: str, flags: tuple[str, ...]) -> Extension:
    ext = Extension(f"specgen.native.lib.{native.installed(name, flags).stem}", [f"specgen/native/{name}.c"],
                    optional=True)
    ext.kernel, ext.flags = name, flags
    return ext


def variants(name: str) -> tuple[tuple[str, ...], ...]:
    """A THREADED library with and without OpenMP (which one loads is known only at run time, from the OpenMP runtime
    torch brought: native.openmp_flags), the others with FLAGS."""
    return (native.FLAGS + native.OPENMP, native.FLAGS) if name in native.THREADED else (native.FLAGS,)


setup(ext_modules=[kernel(name, flags) for name in native.SIGNATURES for flags in variants(name)],
      cmdclass={"build_ext": BuildKernels})
