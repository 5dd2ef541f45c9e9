"""User-given .npy arrays, read without pickles: a file that is not one, or holds Python objects, refused as such."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specgen.errors import UsageError


def read_npy(path: Path, what: str) -> np.ndarray:
    """A .npy array of numbers; `what` names what to save instead, in the refusal. np.load alone would refuse a file
    without NumPy's header, or an array of Python objects, as pickled data, with advice to allow pickles, which nothing
    here does."""
    fmt, objects = np.lib.format, False
    try:
        with path.open("rb") as f:
            npy = f.read(len(fmt.MAGIC_PREFIX)) == fmt.MAGIC_PREFIX
            if npy:
                f.seek(0)
                header = fmt.read_array_header_1_0 if fmt.read_magic(f)[0] == 1 else fmt.read_array_header_2_0
                objects = header(f)[2].hasobject
        arr = np.load(path, allow_pickle=False) if npy and not objects else None
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: not a readable .npy array ({e})") from None
    if not npy:
        raise UsageError(f"{path}: not a .npy file (no NumPy header); save {what} with numpy.save")
    if objects:
        raise UsageError(f"{path}: holds Python objects, not numbers; save {what} as a float array")
    return arr
