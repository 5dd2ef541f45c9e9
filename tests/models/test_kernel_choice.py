"""Which kernel a CPU product runs: tiled.c at every row count (bfloat16 prompts, and steps on AMX: oneDNN), nothing
measured at load."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

from specgen.models import kernel_choice, plan_cache
from specgen.models.layout import decode_layout
from specgen.models.packed_linear import PackedLinear, pack_linears
from specgen.models.prompt import prompt_mode
from specgen.models.tiled_weight import TiledWeight
from tests.conftest import needs_onednn, needs_tiled, tiny_model

pytestmark = [needs_tiled, needs_onednn]


def test_a_float32_model_runs_every_product_on_its_tiles_prompts_too():
    """float32 weights are held as tiles only, and a prompt prefill runs them as a step does: one copy, one kernel."""
    model = decode_layout(tiny_model(2), "packed")
    lins = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert lins and all(type(lin.weight) is TiledWeight for lin in lins)
    with torch.inference_mode():
        for prompt in (False, True):
            with prompt_mode() if prompt else torch.inference_mode():
                model(torch.tensor([[3, 1, 4, 1, 5]]), torch.arange(5)[None])
    assert all(lin._packed is None for lin in lins)


def test_a_bfloat16_model_steps_on_float32_tiles_and_prefills_on_onednn(monkeypatch):
    monkeypatch.setattr(kernel_choice, "amx_bf16", lambda: False)  # with AMX: oneDNN slices (test_tiled_linear.py)
    torch.manual_seed(0)
    ref = nn.Linear(24, 40).to(torch.bfloat16)
    lin = pack_linears(nn.Sequential(ref))[0]
    x = torch.randn(5, 24).bfloat16()
    with torch.inference_mode():
        step = lin(x)
        assert lin._tiled is not None and lin._tiled[1][0].dtype == torch.float32 and lin._packed is None
        want = (x.float() @ ref.weight.float().t() + ref.bias.float()).bfloat16()  # float32 sums, rounded once
        torch.testing.assert_close(step, want, rtol=0, atol=0.02)
        assert torch.equal(torch.cat([lin(x[i:i + 1]) for i in range(5)]), step)  # rows alone: the same bits
        with prompt_mode():
            torch.testing.assert_close(lin(x), step, rtol=2e-2, atol=2e-2)
        assert lin._packed is not None


def test_a_spin_that_sleeps_is_not_quiet(monkeypatch):
    """timed_quietly's judgement (what a stored cost curve needs) can fail: a thread off its core is not quiet."""
    monkeypatch.setattr(plan_cache, "QUIET_SHARE", 0.9)
    assert not plan_cache.timed_quietly(lambda: time.sleep(0.05))[1]


@pytest.mark.slow
def test_real_processes_on_every_core_make_a_timing_unfit_to_store(monkeypatch):
    """As many busy processes as cores take a share of the timing thread's core whatever the scheduler (~0.6 measured
    with two on two cores): `timed_quietly` must judge a timing of real products under them not quiet."""
    monkeypatch.setattr(plan_cache, "QUIET_SHARE", 0.9)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.5)  # both running
        w = torch.randn(512, 512)
        _, quiet = plan_cache.timed_quietly(lambda: [w @ w for _ in range(400)])
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert not quiet
