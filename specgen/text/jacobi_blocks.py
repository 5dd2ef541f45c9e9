"""Block Jacobi decoding as a Drafter of the batched loop: what `collect-trajectories` records."""

from __future__ import annotations

import random

from specgen.decoding.draft import Draft, Verdict
from specgen.decoding.draft_verify import DrafterBase
from specgen.decoding.stats import DecodeStats
from specgen.decoding.target import TargetOut


class JacobiBlocks(DrafterBase):
    """Drafter: block Jacobi iterations of one prompt; `blocks` holds {trajectory, fixed_point, iterations} per block."""

    def __init__(self, block_size: int, seed: int, stop_ids: tuple[int, ...]) -> None:
        self.n, self.seed, self.stop_ids = block_size, seed, stop_ids

    def reset(self, prompt: list[int], first: TargetOut) -> None:
        self.rng = random.Random(self.seed)
        self.text = list(prompt)  # committed tokens before the current block
        self.blocks: list[dict] = []
        self.ended = False
        self.start_block(None)

    def start_block(self, root: int | None) -> None:
        """A new block after `text`: n - 1 guesses from the text so far (the root is filled in at propose)."""
        self.accepted: list[int] = []
        self.guesses = [self.rng.choice(self.text) for _ in range(self.n - 1)]
        self.states: list[list[int]] = [] if root is None else [[root] + self.guesses]
        self.iterations = 0

    def propose(self, seq: list[int], budget: int, stats: DecodeStats) -> Draft:
        self.root = seq[-1]  # the known next token this iteration starts from
        if not self.states:  # the first block learns its root (the prefill's token) here
            self.states = [[self.root] + self.guesses]
        return Draft.chain(self.guesses[: max(0, budget)])

    def on_accept(self, draft: Draft, verdict: Verdict, out: TargetOut) -> None:
        """One Jacobi iteration: converged guesses move into the block, the argmaxes after them are the new guesses."""
        argmax = out.picks()[0]  # [N + 1]: argmax[i] follows verify input i
        m = verdict.num_accepted
        self.accepted += [self.root] + list(draft.tokens[:m])
        self.iterations += 1
        nxt = argmax[m]
        left = self.n - len(self.accepted)
        self.guesses = argmax[m + 1 :][: left - 1] if left > 0 else []
        state = (self.accepted + [nxt] + self.guesses)[: self.n]
        if state != self.states[-1]:
            self.states.append(state)
        if len(self.accepted) == self.n:
            self.blocks.append({"trajectory": self.states, "fixed_point": self.accepted, "iterations": self.iterations})
            self.text += self.accepted
            self.ended = any(t in self.stop_ids for t in self.accepted)
            self.start_block(nxt)

    def finished(self) -> bool:
        """The loop ends this row after a block with a stop token."""
        return self.ended
