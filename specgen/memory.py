"""Free memory of a device, so a cache that cannot fit is refused before it is allocated (one line, with what fits)."""

from __future__ import annotations

import torch

from specgen.errors import UsageError

#: Share of the free memory a cache may take: the model's activations and the drafter need the rest.
HEADROOM = 0.8


def free_bytes(device: torch.device | str) -> int | None:
    """Bytes free on `device` (CPU: MemAvailable; CUDA: the driver's count); None when unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")), None)
    except OSError:
        return None


def check_cache_fits(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> None:
    """Refuse a K + V cache of `shape` [L, B, H, T, D] that would not fit, naming its size and the rows that fit."""
    layers, rows, heads, slots, dim = shape
    per_row = 2 * layers * heads * slots * dim * torch.empty((), dtype=dtype).element_size()
    free = free_bytes(device)
    if free is None or per_row * rows <= HEADROOM * free:
        return
    fit = int(HEADROOM * free // per_row)
    raise UsageError(f"a KV cache of {rows} rows x {slots} slots needs {size(per_row * rows)}, over the "
                     f"{HEADROOM:.0%} of the {size(free)} free that a cache may take (the model and drafter need the "
                     f"rest): at most {fit} rows of {slots} slots fit (lower the batch size or the token budget)")


def size(n: int) -> str:
    """Bytes in the largest unit that keeps a whole number before the point (x.y GiB, MiB or KiB; n B)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"
