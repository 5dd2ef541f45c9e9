"""Held-out label sequences of a `train-heads` run, run teacher-forced through a backbone and its heads."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from safetensors.torch import load_file

from specgen.methods.xspecmesh import load_mesh


@dataclass(frozen=True)
class HeldOut:
    """The last label rows of a run (its eval split) and one teacher-forced pass of the heads' backbone over them."""

    model: torch.nn.Module  # the backbone, the heads' LoRA adapter merged
    heads: torch.nn.Module
    tokens: torch.Tensor  # [S, L], -1 = padding
    logits: torch.Tensor  # [S, L, V]: row i predicts tokens[:, i]
    hidden: torch.Tensor  # [S, L, dim]
    cond: torch.Tensor  # [S, M, cross_dim]


@torch.inference_mode()
def held_out(labels: str, heads: str, sequences: int) -> HeldOut:
    """Score the last `sequences` rows of labels.safetensors (a run's eval split), trimmed to the longest sequence
    (-1 = padding), with the backbone of registry heads `heads`."""
    loaded = load_mesh(None, heads)
    model = loaded.decoder.model
    t = load_file(labels)
    pcs, tokens = t["pcs"][-sequences:], t["tokens"][-sequences:]
    tokens = tokens[:, : int((tokens >= 0).sum(1).max())]
    logits, hidden, cond = model.forward_train(pcs, tokens)
    return HeldOut(model, loaded.decoder.heads, tokens, logits, hidden, cond)
