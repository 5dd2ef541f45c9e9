"""Routed feed-forwards (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): each row's k of E SwiGLU experts (and Qwen2-MoE's
gated shared expert), its bits independent of other rows."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

import torch
from torch import nn

from specgen.models.elementwise import row_invariant

# The invariant (lossless methods equal AR token for token): a row's output never depends on which rows share its
# forward (an AR step has 1 row, a verify or a tree many). So (1) the router, softmax and top-k work on each row alone;
# (2) an expert's products over the rows routed to it give each row the bits it gets over any other rows, wherever the
# model's products are row-invariant (on a GPU fixed-shape slices, models/sliced_linear.py; int4/int8: qmm.c computes
# each row alone; tested in float32 and bfloat16 in tests/models/test_moe.py). torch's float32 CPU products are not
# always (MKL's one-row path rounds otherwise): a limit every dense product shares (docs/architectures.md); (3) a row's
# k weighted contributions go into its own [k, dim] slots, by top-k slot, and are summed over them by one reduction
# of a [T, k, dim] buffer (each (row, dim) over its k values alone), never by atomics or an order another row could
# change. transformers 5's default experts forward (grouped_mm) sums so too: the same bits in bfloat16 (tested).
# (4) the shared expert's [T, 1] gate takes its sigmoid over its elements alone (`elementwise.row_invariant`: torch's
# float32 CPU sigmoid took a tensor's last partial vector through a scalar path, so the gate's bits moved with T).

_STATIC: ContextVar[bool] = ContextVar("specgen_static_routing", default=False)


@contextmanager
def static_routing() -> Iterator[None]:
    """Route every MoE feed-forward run inside by its shape-static path (`MoEFeedForward.every`): what a captured
    step runs (models/static_step.py), which can neither read the routing on the host nor size a product by it. A
    context, as prompt mode (models/prompt.py), not a flag on the module: one module serves a model's eager forwards
    and its captured steps, and the routing is data, so no input tells the paths apart."""
    token = _STATIC.set(True)
    try:
        yield
    finally:
        _STATIC.reset(token)


class MoEFeedForward(nn.Module):
    """A router (`gate`, dim -> E, no bias) and E experts (`expert(cfg)`: FeedForward's SwiGLU at cfg.ffn_dim). Each
    row: softmax of its router logits in float32, its top k (cfg.experts_per_token) weights, renormalised to sum 1
    where cfg.expert_renorm (Mixtral always, the others by norm_topk_prob), rounded to the activation dtype before
    they scale the experts' outputs where cfg.expert_weight_round (Qwen2-MoE, Qwen3-MoE, OLMoE: products and their sum
    in the dtype; Mixtral's in float32, the sum rounded once), then the k products summed over the top-k slots. With
    cfg.shared_expert_dim (Qwen2-MoE) a shared expert of that width (`shared_expert`) runs on every row, scaled by the
    sigmoid of `shared_expert_gate` (dim -> 1, no bias), and is added to that sum, as transformers adds it."""

    def __init__(self, cfg, expert: Callable[[object], nn.Module]) -> None:
        super().__init__()
        self.k, self.renorm, self.round = cfg.experts_per_token, cfg.expert_renorm, cfg.expert_weight_round
        self.gate = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(expert(cfg) for _ in range(cfg.n_experts))
        self.shared = cfg.shared_expert_dim > 0
        if self.shared:
            self.shared_expert = expert(dataclasses.replace(cfg, ffn_dim=cfg.shared_expert_dim))
            self.shared_expert_gate = nn.Linear(cfg.dim, 1, bias=False)

    def route(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(each row's k experts [T, k] by falling weight, their weights [T, k]: float32, or the dtype where rounded)
        of rows [T, dim]; every op is per row."""
        probs = torch.softmax(self.gate(rows).float(), -1)  # [T, E] float32
        weights, experts = torch.topk(probs, self.k, -1)  # [T, k] each
        if self.renorm:
            weights = weights / weights.sum(-1, keepdim=True)
        return experts, weights.to(rows.dtype) if self.round else weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., dim] -> [..., dim]
        rows = x.reshape(-1, x.shape[-1])  # [T, dim]
        experts, weights = self.route(rows)
        picked = (self.every if _STATIC.get() else self.routed)(rows, experts)  # [T, k, dim]
        parts = picked * weights[..., None]  # [T, k, dim]: float32, or the dtype where the weights were rounded
        out = parts.sum(1).to(x.dtype)  # [T, dim]: each (row, dim) summed over its k slots
        if self.shared:  # every row's, gated per row (its sigmoid over its elements alone)
            out = out + row_invariant(torch.sigmoid, self.shared_expert_gate(rows)) * self.shared_expert(rows)
        return out.view(x.shape)

    def routed(self, rows: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """Each row's k experts' outputs [T, k, dim] (row t's slot j: expert experts[t, j] of row t), each expert run
        over the rows routed to it only (eager forwards: its row counts are read on the host)."""
        t, dim = rows.shape
        flat = experts.flatten()  # [T k]: row t's slot j at t k + j
        order = flat.argsort(stable=True)  # [T k]: the slots grouped by expert
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()
        out = rows.new_empty(t * self.k, dim)  # [T k, dim]
        for expert, slots in zip(self.experts, order.split(counts)):
            if len(slots):
                out[slots] = expert(rows[slots // self.k])  # [n, dim]
        return out.view(t, self.k, dim)

    def every(self, rows: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """`routed`'s [T, k, dim] with static shapes and no host read: every expert over every row, then each row's k
        gathered. The same bits as `routed` (row-invariant products), at E / k times its products."""
        t, dim = rows.shape
        every = torch.stack([expert(rows) for expert in self.experts], 1)  # [T, E, dim]
        return every.gather(1, experts[..., None].expand(t, self.k, dim))
