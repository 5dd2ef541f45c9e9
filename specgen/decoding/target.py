"""The Target protocol (what verification calls) and the adapter for a plain Transformer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from specgen.devices import to_device
from specgen.models.cache import KVCache
from specgen.models.prompt import prompt_mode


class Replays(Protocol):
    """A target's captured device work over static buffers (models/graphs.StepGraphs)."""

    def call(self, key: tuple, fn: Callable[..., tuple], inputs: dict[str, torch.Tensor],
             shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[torch.Tensor, ...]:
        """fn(**static) over static copies of `inputs` (each the leading block of its `shapes` entry), replayed."""


@dataclass(frozen=True)
class TargetOut:
    """One target forward: logits for the requested rows and per-row features for drafters."""

    logits: torch.Tensor  # [B, S, V] (or [B, 1, V] when last_only)
    features: torch.Tensor  # [B, S, D] final hidden states (CFG adapters: per-branch, see their doc)
    argmax: list[list[int]] | None = None  # [B][S] on the host where the step read it (greedy judging): reused
    ahead: torch.Tensor | None = None  # [B, S, 1 + k] float32: greedy picks, then a pool's columns (`ReadAlong`)
    graphs: Replays | None = None  # the target's captures, where a sampled judge replays its walk (None: eager)

    def picks(self) -> list[list[int]]:
        """The greedy picks [B][S] on the host: the step's own read where it made one, else one device read now."""
        return self.logits.argmax(-1).tolist() if self.argmax is None else self.argmax


class Target(Protocol):
    """A model that scores new nodes over a KV cache."""

    vocab_size: int
    branches: int  # cache rows per sequence (CFG: cond + uncond)
    device: torch.device | str  # where its inputs go

    def new_cache(self, batch: int, max_len: int) -> KVCache: ...

    def prefill(self, tokens: torch.Tensor, cache: KVCache) -> TargetOut:
        """Run a prompt [B, P] from empty rows; commits it; logits of the last position only. The prompt comes on the
        host: a target moves what it uses (`devices.to_device`) and reads ids there without waiting for the device."""

    def forward(
        self, tokens: torch.Tensor | list, positions: torch.Tensor | list, cache: KVCache,
        tree_mask: torch.Tensor | None
    ) -> TargetOut:
        """Score S pending nodes [B, S] at positions [B, S] under tree_mask [S, S]; does not commit. Tokens and
        positions built on the host come as nested lists (a captured step stages them in one copy, the eager forward
        moves them), made on the device as tensors; a list's tree mask is on the host too."""


class ModelTarget:
    """Target over a `Transformer` (text LMs): features are the final normed hidden states."""

    branches = 1

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = str(model.device)  # "cpu" / "cuda:0", as callers that set it after loading (text/target.py) give it
        self.vocab_size = model.cfg.vocab_size

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return self.model.new_cache(batch, max_len)  # slots (tree nodes share positions)

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, cache: KVCache) -> TargetOut:
        tokens = to_device(tokens, self.device)  # [B, P]
        with prompt_mode():  # every method prefills alike and no step recomputes a prompt: its faster kernels
            staged = None if self.model.graphs is None else self.model.graphs.prefill(tokens, cache)
            if staged is not None:  # captured chunks, the bits of the eager forward below
                return TargetOut(*staged)
            b, p = tokens.shape
            positions = torch.arange(p, device=tokens.device).expand(b, p)
            hidden = self.model.hidden_states(self.model.embed(tokens), positions, cache)
            logits = self.model.logits(hidden[:, -1:])  # [B, 1, V]: prompt mode's products, as a captured chunk's
        cache.commit_seqs(dict.fromkeys(range(b), list(range(p))), 1)
        return TargetOut(logits, hidden)

    @torch.inference_mode()
    def forward(self, tokens, positions, cache, tree_mask) -> TargetOut:
        logits, hidden = self.model(tokens, positions, cache, tree_mask)
        return TargetOut(logits, hidden, graphs=self.model.graphs)
