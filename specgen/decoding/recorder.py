"""AR decoding that keeps the target's features: the empty draft plus a record of every hidden state it decoded from."""

from __future__ import annotations

import torch

from specgen.decoding.draft import Draft
from specgen.decoding.draft_verify import DrafterBase
from specgen.decoding.target import TargetOut


class FeatureRecorder(DrafterBase):
    """Drafter that proposes nothing (AR) and keeps f_t [branches, D] for t = 0, 1, ...: f_0 from the prefill's
    last position, f_t from the forward that fed token t - 1 (its root, input 0)."""

    def __init__(self) -> None:
        self.features: list[torch.Tensor] = []

    def reset(self, prompt: list[int], first: TargetOut) -> None:
        self.features = [first.features[:, -1]]  # [branches, D]

    def propose(self, seq: list[int], budget: int, stats) -> Draft:
        return Draft.empty()

    def on_accept(self, draft: Draft, verdict, out: TargetOut) -> None:
        self.features.append(out.features[:, 0])  # the root's: it predicts the token this step commits
