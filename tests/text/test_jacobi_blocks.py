"""Block Jacobi trajectories on the batched loop: batch-independent, fixed points = greedy AR, ends after a stop block."""

from __future__ import annotations

import random

from tests.conftest import decode
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.methods.text import EmptyDrafter
from specgen.text.trajectories import jacobi_trajectories_batch
from tests.conftest import tiny_model


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(64) for _ in range(rng.randrange(3, 15))] for _ in range(n)]


def test_trajectories_do_not_depend_on_the_batch_and_converge_to_greedy_ar():
    target = ModelTarget(tiny_model(2))
    ps = prompts(7)
    alone = [jacobi_trajectories_batch(target, [p], 4, 22, (), [k])[0] for k, p in enumerate(ps)]
    assert jacobi_trajectories_batch(target, ps, 4, 22, (), list(range(7)), batch_size=3) == alone
    for p, blocks in zip(ps, alone):
        assert len(blocks) == 6  # whole blocks covering 22 tokens
        fixed = [t for b in blocks for t in b["fixed_point"]]
        assert fixed == decode(target, EmptyDrafter(), p, 24, SamplingParams()).tokens
        for b in blocks:  # a trajectory starts from guesses and ends at the block's fixed point
            assert all(len(s) == 4 for s in b["trajectory"]) and b["trajectory"][-1] == b["fixed_point"]
            assert 1 <= b["iterations"] <= 4


def test_a_block_with_a_stop_token_is_finished_and_ends_the_row():
    target = ModelTarget(tiny_model(3))
    p = prompts(1, 1)[0]
    ar = decode(target, EmptyDrafter(), p, 40, SamplingParams()).tokens
    stop = ar[5]  # inside the second block of 4
    (blocks,) = jacobi_trajectories_batch(target, [p], 4, 40, (stop,), [0])
    assert len(blocks) == ar.index(stop) // 4 + 1 and [t for b in blocks for t in b["fixed_point"]] == ar[: 4 * len(blocks)]
