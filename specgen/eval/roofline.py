"""The memory roofline of a decode step: bytes of weights a forward streams, and the machine's copy bandwidth."""

from __future__ import annotations

import functools

import torch

from specgen.devices import now


def streamed_bytes(module: torch.nn.Module) -> int:
    """Bytes of weights one forward reads: every parameter and buffer once (shared storage counted once), without
    position tables (`rope`) and without the token-embedding table unless it is also the LM head (tied): a step
    reads one row of it. A layer with a `streamed_bytes()` (quantized layers) counts what its kernel reads instead."""
    def storages(name: str) -> set[int]:
        sub = getattr(module, name, None)
        return {t.data_ptr() for t in [*sub.parameters(), *sub.buffers()]} if sub is not None else set()

    lookup_only = storages("tok_embeddings") - storages("output")  # an embedding table the LM head does not share
    seen, total = set(), 0
    for sub in module.modules():  # a layer that says what its product reads (a quantized one: models/quantize.py)
        if hasattr(sub, "streamed_bytes") and sub is not module:
            total += sub.streamed_bytes()
            seen |= {t.data_ptr() for t in sub.buffers()}
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if "rope" in name or t.data_ptr() in seen or t.data_ptr() in lookup_only:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def copy_bandwidth(megabytes: int = 256, rounds: int = 5, device: str | torch.device = "cpu") -> float:
    """The memory bandwidth of `device` in GB/s as torch sees it (on cpu: with its current threads): best of `rounds`
    copies of a `megabytes` tensor (a copy reads and writes each byte: 2 x size per copy); measured once per process
    for each (size, rounds, device, threads)."""
    return measured_bandwidth(megabytes, rounds, str(device), torch.get_num_threads())


@functools.cache
def measured_bandwidth(megabytes: int, rounds: int, device: str, threads: int) -> float:
    assert threads == torch.get_num_threads()  # a key of the cache: the copies run on the threads torch has now
    src = torch.ones(megabytes * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(rounds):
        t0 = now(device)
        dst.copy_(src)
        best = min(best, now(device) - t0)
    return 2 * src.numel() * 4 / best / 1e9
