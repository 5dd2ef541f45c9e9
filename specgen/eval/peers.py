"""What the text benchmark's peer rows (other libraries' own decoding, `hf_rows`, `llamacpp_row`) share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specgen.decoding.stops import Stops
from specgen.eval.text_rows import Run
from specgen.text.target import TextModel


@dataclass(frozen=True)
class PeerSetup:
    """What every peer row is built from: greedy decoding of the same prompt ids at the benchmark's threads, each
    ending where specgen's rows end (`stops`: the tokenizer's stop ids and the run's stop strings)."""

    name: str  # the row (`llamacpp-lookup:n4`): named in its messages
    original: TextModel  # the float32 target: the weights transformers rows load, its context and vocabulary
    options: dict  # the row's options: its method's, updated by a variant row's
    max_new_tokens: int
    stops: Stops
    threads: int
    device: str
    dtype: torch.dtype = torch.float32  # transformers' rows: the run's float precision (`text_bench.peer_dtype`)


class Peer(Protocol):
    """A peer row, built once per benchmark (`__init__(setup)`) unless `unavailable(setup)` says why it cannot run."""

    OPTIONS: tuple[str, ...]  # the options it takes (others are refused before any model loads: `check_methods`)
    module: torch.nn.Module | None  # the weights one forward reads (the roofline); None where they are not torch's
    lossless: bool  # greedy on the target's own weights: its tokens should equal specgen's AR

    @staticmethod
    def unavailable(setup: PeerSetup) -> str | None: ...

    def run(self, prompt: list[int]) -> Run: ...

    def batch(self, prompts: list[list[int]], batch: int) -> tuple[list[Run], float]: ...


class OneAtATime:
    """A peer whose decoding takes one sequence: a batch is its prompts one after another."""

    def batch(self, prompts: list[list[int]], batch: int) -> tuple[list[Run], float]:
        runs = [self.run(p) for p in prompts]
        return runs, sum(r.seconds for r in runs)
