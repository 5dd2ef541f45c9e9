"""Install-time build of the native kernels (specgen/native/*.c) into specgen/native/lib/, where a C compiler exists.

Each is a plain C shared library, not a Python module, compiled without torch (pip's isolated build has none) by the
same code and flags as the first-use build (specgen/native/toolchain.py), `-march=native` included: the library is
for the installing machine's CPU, and its file name carries that CPU's signature, so a wheel copied to another CPU
kind is never loaded there (the kernels are then built on first use). A failed or impossible compile is one warning
and the install goes on; the first-use build stays the fallback.
"""

import importlib.util
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

spec = importlib.util.spec_from_file_location("toolchain", Path(__file__).parent / "specgen" / "native" / "toolchain.py")
toolchain = importlib.util.module_from_spec(spec)
spec.loader.exec_module(toolchain)  # by path: importing the specgen package would import torch


class BuildKernels(build_ext):
    """Compiles each kernel library with toolchain.compile_to under its toolchain.installed name."""

    def get_ext_filename(self, fullname: str) -> str:
        return str(Path(*fullname.split("."))) + ".so"

    def copy_extensions_to_source(self) -> None:  # an editable install: into the checkout's specgen/native/lib/
        toolchain.INSTALLED_DIR.mkdir(exist_ok=True)
        super().copy_extensions_to_source()

    def build_extension(self, ext: Extension) -> None:
        cc, why = toolchain.compiler()
        if cc is not None:
            why = toolchain.compile_to(cc, ext.kernel, ext.flags, Path(self.get_ext_fullpath(ext.name)))
        if why:
            raise CompileError(why)  # the extension is optional: a warning, and no library


def kernel(name: str, flags: tuple[str, ...]) -> Extension:
    ext = Extension(f"specgen.native.lib.{toolchain.installed(name, flags).stem}", [f"specgen/native/{name}.c"],
                    optional=True)
    ext.kernel, ext.flags = name, flags
    return ext


setup(ext_modules=[kernel(name, flags) for name in toolchain.NAMES for flags in toolchain.variants(name)],
      cmdclass={"build_ext": BuildKernels})
