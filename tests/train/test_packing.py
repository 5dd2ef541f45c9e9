"""Packing layout, noise schedules, nearest-ratio states and the noise-aware mask on hand-written toy examples."""

from __future__ import annotations

import random

import pytest
import torch

from specgen.train import packing

# prompt [10, 11] (p = 2), n = 2, two blocks; rows of the packed sequence:
#   0 P0  1 P1 | 2 N0a  3 N0b | 4 C0a  5 C0b | 6 N1a  7 N1b | 8 C1a  9 C1b
PROMPT, FIXED, NOISY = [10, 11], [[1, 2], [3, 4]], [[1, 9], [8, 7]]

NOISY_CONTEXT = [  # default variant: noisy_j sees prompt + noisy_<j + own block (causal)
    [1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
    [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 1, 0, 0, 0, 0, 0],
    [1, 1, 0, 0, 1, 1, 0, 0, 0, 0],
    [1, 1, 1, 1, 0, 0, 1, 0, 0, 0],
    [1, 1, 1, 1, 0, 0, 1, 1, 0, 0],
    [1, 1, 0, 0, 1, 1, 0, 0, 1, 0],
    [1, 1, 0, 0, 1, 1, 0, 0, 1, 1],
]
CLEAN_CONTEXT = [row[:] for row in NOISY_CONTEXT]
CLEAN_CONTEXT[6] = [1, 1, 0, 0, 1, 1, 1, 0, 0, 0]  # noisy_1 sees clean_0 instead of noisy_0
CLEAN_CONTEXT[7] = [1, 1, 0, 0, 1, 1, 1, 1, 0, 0]


def toy():
    return packing.pack(PROMPT, NOISY, FIXED)


def test_layout_positions_and_pairs():
    s = toy()
    assert s.tokens.tolist() == [10, 11, 1, 9, 1, 2, 8, 7, 3, 4]
    assert s.positions.tolist() == [0, 1, 2, 3, 2, 3, 4, 5, 4, 5]  # noisy_j and clean_j share positions
    assert s.ar_src.tolist() == [1, 4, 5, 8] and s.ar_tgt.tolist() == [1, 2, 3, 4]
    # block 0 diverges at offset 1, block 1 at offset 0: student rows vs teacher rows at the same offset
    assert s.student.tolist() == [3, 6, 7] and s.teacher.tolist() == [5, 8, 9]
    assert s.num_blocks == 2


def test_stop_token_ends_the_targets():
    s = packing.pack(PROMPT, NOISY, FIXED, stop_ids=(2,))
    assert s.ar_src.tolist() == [1, 4] and s.ar_tgt.tolist() == [1, 2]  # the stop token is the last target
    assert s.student.tolist() == [] and s.teacher.tolist() == []


@pytest.mark.parametrize("variant,window,expected", [
    ("noisy", 16, NOISY_CONTEXT), ("clean", 16, CLEAN_CONTEXT),
    ("window", 2, NOISY_CONTEXT),  # both blocks in one window: noisy context
    ("window", 1, CLEAN_CONTEXT),  # every block its own window: clean context from earlier windows
])
def test_mask_equals_hand_written(variant, window, expected):
    mask = packing.noise_aware_mask(toy().segments, variant, window)
    assert mask.tolist() == [[bool(x) for x in row] for row in expected]


def test_window_mask_mixes_within_and_across_windows():
    fixed = [[1, 2], [3, 4], [5, 6]]
    s = packing.pack([10], [[1, 9], [8, 7], [6, 6]], fixed)
    m = packing.noise_aware_mask(s.segments, "window", 2)
    # noisy_2 (window 1) sees clean_0 and clean_1 (window 0), no noisy block of window 0
    row = m[1 + 4 * 2]  # first row of noisy_2
    assert row[[1, 2]].tolist() == [False, False] and row[[3, 4]].tolist() == [True, True]
    assert row[[5, 6]].tolist() == [False, False] and row[[7, 8]].tolist() == [True, True]


def test_schedules():
    assert packing.noise_schedule("progressive", 6, 4, random.Random(0)) == [0, 0.25, 0.5, 0.75, 0, 0.25]
    assert packing.noise_schedule("reverse", 5, 4, random.Random(0)) == [0.75, 0.5, 0.25, 0, 0.75]
    r = packing.noise_schedule("random", 5, 4, random.Random(1))
    assert r == packing.noise_schedule("random", 5, 4, random.Random(1)) and all(0 <= x < 1 for x in r)
    with pytest.raises(KeyError):  # the recipe layer refuses it first (distill.check_config)
        packing.noise_schedule("cosine", 3, 4, random.Random(0))


def test_nearest_state_by_unconverged_fraction():
    fixed = [1, 2, 3, 4]
    traj = [[1, 7, 7, 7], [1, 2, 7, 7], [1, 2, 3, 7], [1, 2, 3, 4]]  # ratios 0.75, 0.5, 0.25, 0
    assert packing.nearest_state(traj, fixed, 0.0) == fixed
    assert packing.nearest_state(traj, fixed, 0.6) == traj[1]
    assert packing.nearest_state(traj, fixed, 1.0) == traj[0]
    assert packing.nearest_state(traj, fixed, 0.375) == traj[1]  # a tie keeps the earlier (noisier) state


def test_build_sample_uses_the_schedule():
    blocks = [{"prompt_ids": [10], "fixed_point": [1, 2], "trajectory": [[1, 5], [1, 2]]},
              {"prompt_ids": [10], "fixed_point": [3, 4], "trajectory": [[3, 5], [3, 4]]}]
    s = packing.build_sample(blocks, "progressive", 2, random.Random(0))  # ratios 0, 0.5
    assert s.tokens.tolist() == [10, 1, 2, 1, 2, 3, 5, 3, 4]
    assert torch.equal(s.positions, torch.tensor([0, 1, 2, 1, 2, 3, 4, 3, 4]))
