"""pcLLM training sequences `prompt | noisy_0 | clean_0 | ...` for one forward: schedules, states, packing, mask."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

#: schedule name -> noise ratio t_i of block i for window w (w >= 1: config_checks)
SCHEDULES: dict[str, Callable[[int, int, random.Random], float]] = {
    "progressive": lambda i, w, rng: i % w / w, "reverse": lambda i, w, rng: (w - 1 - i % w) / w,
    "random": lambda i, w, rng: rng.random()}
MASKS = ("noisy", "clean", "window")


def noise_schedule(name: str, num_blocks: int, window: int, rng: random.Random) -> list[float]:
    """Scheduled noise ratio t_i of each of `num_blocks` blocks (`name`: one of SCHEDULES)."""
    return [SCHEDULES[name](i, window, rng) for i in range(num_blocks)]


def first_mismatch(state: list[int], fixed: list[int]) -> int:
    """Index of the first token that differs from the fixed point (len when none does)."""
    return next((i for i, (a, b) in enumerate(zip(state, fixed)) if a != b), len(fixed))


def nearest_state(trajectory: list[list[int]], fixed: list[int], ratio: float) -> list[int]:
    """The trajectory state whose noise ratio, its fraction of unconverged tokens (n - first mismatch) / n (Jacobi
    Forcing's definition), is nearest `ratio` (ties: the earlier state)."""
    n = len(fixed)
    best = min(range(len(trajectory)), key=lambda k: (abs((n - first_mismatch(trajectory[k], fixed)) / n - ratio), k))
    return list(trajectory[best])


@dataclass(frozen=True)
class Packed:
    """One packed training sequence and what its single forward must compute."""

    tokens: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    segments: tuple[tuple[str, int, int, int], ...]  # (kind "prompt"|"noisy"|"clean", block, start, length)
    ar_src: torch.Tensor  # [A] rows whose logits predict ...
    ar_tgt: torch.Tensor  # [A] ... these tokens (AR loss)
    student: torch.Tensor  # [C] noisy rows (consistency loss, student) ...
    teacher: torch.Tensor  # [C] ... and the clean rows at the same offset (teacher, detached)
    num_blocks: int


def pack(prompt: list[int], states: list[list[int]], fixed: list[list[int]],
         stop_ids: tuple[int, ...] = ()) -> Packed:
    """Interleave noisy/clean blocks after the prompt with shared positions; list the AR and consistency pairs.

    AR pairs: the last prompt row predicts clean_0[0]; clean row k predicts the next answer token
    (across block boundaries); nothing after the first stop token is a target. Consistency pairs:
    for block j with first mismatch d, offsets k >= d (the unconverged tail; the converged prefix
    has the teacher's context already), student row noisy_j[k], teacher row clean_j[k]; the last
    offset predicts the next block's first token; offsets predicting past a stop token are dropped.
    """
    if not fixed or len(states) != len(fixed):
        raise ValueError("pack needs one noisy state per block and at least one block")
    n = len(fixed[0])
    if any(len(b) != n for b in fixed) or any(len(s) != n for s in states):
        raise ValueError("every block and state must have the same size n")
    p = len(prompt)
    answer = [t for b in fixed for t in b]
    eos = next((i for i, t in enumerate(answer) if t in stop_ids), len(answer))  # index of the stop token
    tokens, positions, segments = list(prompt), list(range(p)), [("prompt", -1, 0, p)]
    for j, (noisy, clean) in enumerate(zip(states, fixed)):
        for kind, blk in (("noisy", noisy), ("clean", clean)):
            segments.append((kind, j, len(tokens), n))
            tokens += blk
            positions += range(p + j * n, p + (j + 1) * n)
    clean_row = lambda a: p + (2 * (a // n) + 1) * n + a % n  # row of answer token a in its clean block
    ar_src = [p - 1] + [clean_row(a) for a in range(0, min(eos, len(answer) - 1))]
    ar_tgt = [answer[a] for a in range(0, min(eos, len(answer) - 1) + 1)]
    student, teacher = [], []
    for j, (noisy, clean) in enumerate(zip(states, fixed)):
        for k in range(first_mismatch(noisy, clean), n):
            if j * n + k + 1 > eos:  # predicts a token after the stop token
                break
            student.append(p + 2 * j * n + k)
            teacher.append(p + (2 * j + 1) * n + k)
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long)
    return Packed(as_long(tokens), as_long(positions), tuple(segments), as_long(ar_src), as_long(ar_tgt),
                  as_long(student), as_long(teacher), len(fixed))


def noise_aware_mask(segments: tuple[tuple[str, int, int, int], ...], variant: str = "noisy",
                     window: int = 16) -> torch.Tensor:
    """Boolean [T, T] attention mask (row = query may attend to column) for a packed layout (variant: MASKS)."""
    total = sum(s[3] for s in segments)
    mask = torch.zeros(total, total, dtype=torch.bool)
    for kind, j, start, length in segments:
        rows = slice(start, start + length)
        mask[rows, start : start + length] = torch.ones(length, length, dtype=torch.bool).tril()  # own, causal
        if kind == "prompt":
            continue
        for kind2, j2, start2, length2 in segments:
            # earlier blocks: clean rows read clean ones; noisy rows read noisy ones ("noisy"), clean ones ("clean"),
            # or noisy ones inside their own window and clean ones before it ("window")
            own_window = j2 // window == j // window
            noisy_context = kind == "noisy" and (variant == "noisy" or variant == "window" and own_window)
            if kind2 == "prompt" or (j2 < j and kind2 == ("noisy" if noisy_context else "clean")):
                mask[rows, start2 : start2 + length2] = True
    return mask


def build_sample(record_blocks: list[dict], schedule: str, window: int, rng: random.Random,
                 max_blocks: int = 0, stop_ids: tuple[int, ...] = (), start: int = 0) -> Packed:
    """A packed sample from one prompt's block records (sorted by block), noisy states chosen by the schedule.

    With `max_blocks`, only blocks start .. start + max_blocks - 1 are packed; the fixed points of the
    blocks before `start` join the prompt as clean context (shorter sequences, every position covered).
    """
    prefix = list(record_blocks[0]["prompt_ids"]) + [t for b in record_blocks[:start] for t in b["fixed_point"]]
    blocks = record_blocks[start : start + max_blocks] if max_blocks else record_blocks[start:]
    ratios = noise_schedule(schedule, start + len(blocks), window, rng)[start:]  # t_i by absolute block index
    fixed = [list(b["fixed_point"]) for b in blocks]
    states = [nearest_state(b["trajectory"], f, t) for b, f, t in zip(blocks, fixed, ratios)]
    return pack(prefix, states, fixed, stop_ids)
