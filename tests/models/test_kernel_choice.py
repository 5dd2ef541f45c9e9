"""KernelChoice: the oneDNN/MKL crossover is measured once per weight shapes and thread count, or pinned."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

from specgen import native
from specgen.errors import UsageError
from specgen.models import kernel_choice, plan_cache
from specgen.models.kernel_choice import ENV, Plan, Timing, time_passes
from specgen.models.packed_linear import PackedLinear, pack_linears
from specgen.models.prompt import prompt_mode
from tests.conftest import needs_native, needs_onednn, tiny_model


@pytest.mark.parametrize("mkl, dnn, want", [
    ((1, 2, 3, 4), (2, 3, 1, 1), 3),  # oneDNN wins from 3 rows
    ((1, 2, 3, 4), (0.5, 1, 1, 1), 1),  # even one row (weights streamed from memory on some machines)
    ((1, 2, 3, 4), (0.5, 3, 1, 1), 3),  # a win at 1 row that does not hold at 2 is not taken
    ((1, 2, 3, 4), (2, 3, 4, 5), 5),  # never: past the last measured count
    ((1, 2, 3, 4), (2, 3, 4, 4), 5),  # a tie is not a win
])
def test_min_rows_is_where_onednn_starts_winning_for_good(mkl, dnn, want):
    assert Timing((1, 2, 3, 4), mkl, dnn).min_rows == want


INF = float("inf")


def measured_as(monkeypatch, timing_pass) -> None:
    """A fresh process's view (nothing measured in memory, no pinned crossover) whose timing pass is `timing_pass`."""
    monkeypatch.setattr(kernel_choice, "time_passes", timing_pass)
    monkeypatch.setattr(kernel_choice, "_MEASURED", {})
    monkeypatch.delenv(ENV, raising=False)


@pytest.mark.parametrize("native_ms, want", [
    ((), None),  # not timed (no compiler, or bfloat16 weights)
    ((3, 3, 3, 3), None),  # never the fastest
    ((0.5, 0.5, 0.5, 0.5), (1, None)),  # from one row on, past the last measured count
    ((2, 0.5, 0.5, 2), (2, 3)),  # a run in the middle: only there
    ((0.5, 3, 0.5, 0.5), (1, 1)),  # the first run only
    ((1, 1, 0.5, 0.5), (3, None)),  # a tie is not a win
])
def test_the_native_loop_takes_its_first_run_of_wins(native_ms, want):
    t = Timing((1, 2, 3, 4), (1, 2, INF, INF), (2, 1, 1, 1), native_ms)
    assert t.native == want and t.plan == Plan(2, want)


def min_rows(lin) -> int:
    """The smallest product a PackedLinear sends to oneDNN (its shared plan's)."""
    return lin._choice.plan().min_rows


def test_a_plan_names_one_kernel_per_row_count():
    plan = Plan(3, (2, 4))
    assert [plan.kernel(r) for r in (1, 2, 4, 5, 100)] == ["mkl", "native", "native", "onednn", "onednn"]
    assert Plan(3).kernel(2) == "mkl" and Plan(1, (1, None)).kernel(10_000) == "native"
    assert Plan(1, (1, None)).uses_onednn is False and Plan(1, (1, 8)).uses_onednn


@needs_onednn
def test_time_passes_times_both_kernels_on_every_row_count(monkeypatch):
    monkeypatch.setenv(ENV, "4")
    model = pack_linears(tiny_model(2))
    lins = [m for m in model.modules() if isinstance(m, PackedLinear)]
    t = time_passes(lins, rows=(1, 3), rounds=1)
    assert t.rows == (1, 3) and len(t.mkl_ms) == len(t.dnn_ms) == 2
    assert all(ms > 0 for ms in t.mkl_ms + t.dnn_ms)
    assert len(t.native_ms) == (2 if native.library("tiled") is not None else 0)
    assert all(ms > 0 for ms in t.native_ms)
    wide = time_passes(lins, rows=(1, kernel_choice.MKL_MAX_ROWS + 1), rounds=1)
    assert wide.mkl_ms[1] == INF and wide.dnn_ms[1] < INF  # MKL is not timed where oneDNN always won


@needs_onednn
@needs_native
def test_products_follow_a_plan_with_the_native_loop_and_drop_unread_copies(monkeypatch):
    measured_as(monkeypatch, lambda *a, **k: Timing((1, 2, 3), (1.0, 2.0, 3.0), (2.0, 3.0, 1.0), (0.5, 1.0, 2.0)))
    torch.manual_seed(0)
    ref = nn.Linear(16, 8)
    lin = pack_linears(copy.deepcopy(ref))
    x = torch.randn(3, 16)
    with torch.inference_mode(), prompt_mode():  # a prefill's products: the plan's
        assert lin._choice.plan() == Plan(3, (1, 2))
        torch.testing.assert_close(lin(x[:2]), ref(x[:2]))
        assert lin._tiled is not None and lin._packed is None  # 1-2 rows: native
        torch.testing.assert_close(lin(x), ref(x))
        assert lin._packed is not None  # 3 rows: oneDNN
        half = copy.deepcopy(lin).to(torch.bfloat16)  # a bfloat16 copy shares the plan
        torch.testing.assert_close(half(x[:1].bfloat16()), copy.deepcopy(ref).to(torch.bfloat16)(x[:1].bfloat16()))
    everywhere = Timing((1, 2), (1.0, 2.0), (2.0, 1.0), (0.5, 0.5))
    measured_as(monkeypatch, lambda *a, **k: everywhere)
    plan_cache.path().unlink()  # another machine's measurement, not the stored one
    lin = pack_linears(copy.deepcopy(ref))
    lin._packed = ("stale", None)
    with torch.inference_mode(), prompt_mode():  # a prefill's products: the plan's
        torch.testing.assert_close(lin(x), ref(x))
    assert lin._choice.plan() == Plan(2, (1, None)) and lin._packed is None  # oneDNN never read: its copy is gone


@needs_onednn
def test_the_crossover_is_measured_once_per_shapes_and_thread_count(monkeypatch):
    calls = []

    def fake(linears, rows=kernel_choice.ROWS, rounds=kernel_choice.ROUNDS):
        calls.append(torch.get_num_threads())
        return Timing((1, 2), (1.0, 2.0), (2.0, 1.0))  # oneDNN from 2 rows

    measured_as(monkeypatch, fake)
    a, b = pack_linears(tiny_model(2)), pack_linears(tiny_model(2))  # same shapes: one measurement
    assert calls == []  # nothing measured before the first product
    with torch.inference_mode():
        a(torch.zeros(1, 3, dtype=torch.long), torch.arange(3)[None])
    assert min_rows(a.layers[0].attention.wqkv) == 2 and min_rows(b.layers[1].feed_forward.w2) == 2
    assert len(calls) == 1
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads != 1 else 2)
        assert min_rows(a.layers[0].attention.wqkv) == 2 and len(calls) == 2  # another thread count: measured again
    finally:
        torch.set_num_threads(threads)


@needs_onednn
def test_products_follow_the_measured_crossover(monkeypatch):
    measured_as(monkeypatch, lambda *a, **k: Timing((1, 2), (1.0, 2.0), (2.0, 1.0)))
    torch.manual_seed(0)
    ref = nn.Linear(16, 8)
    lin = pack_linears(copy.deepcopy(ref))
    with torch.inference_mode(), prompt_mode():  # a prefill's products: the plan's
        assert torch.equal(lin(torch.ones(1, 16)), ref(torch.ones(1, 16))) and lin._packed is None  # 1 row: MKL
        torch.testing.assert_close(lin(torch.ones(2, 16)), ref(torch.ones(2, 16)))
        assert lin._packed is not None  # 2 rows: oneDNN


@needs_onednn
def test_pinned_by_the_environment(monkeypatch):
    monkeypatch.setenv(ENV, "3")
    model = pack_linears(tiny_model(1))
    assert min_rows(model.layers[0].attention.wqkv) == 3
    monkeypatch.setenv(ENV, "zero")
    with pytest.raises(UsageError, match=ENV):
        pack_linears(tiny_model(1))


@needs_onednn
def test_a_copied_layer_shares_the_measurement_and_outlives_its_model(monkeypatch):
    monkeypatch.setattr(kernel_choice, "_MEASURED", {})
    monkeypatch.setenv(ENV, "2")
    model = pack_linears(tiny_model(1))
    head = copy.deepcopy(model.output).to(torch.bfloat16)  # as the bfloat16 draft LM head is made
    assert head._choice is model.output._choice and min_rows(head) == 2
    monkeypatch.delenv(ENV)
    orphan = pack_linears(copy.deepcopy(nn.Linear(8, 8)))  # measured lazily ...
    choice = orphan._choice
    choice._linears = [lambda: None]  # ... but its weights are gone
    assert choice.plan().min_rows == kernel_choice.FALLBACK_MIN_ROWS


@needs_onednn
def test_decode_layout_measures_at_load_not_in_the_first_timed_product(monkeypatch):
    from specgen.models.layout import ENV as LAYOUT_ENV, decode_layout

    calls = []
    measured_as(monkeypatch, lambda *a, **k: calls.append(1) or Timing((1,), (1.0,), (2.0,)))
    monkeypatch.delenv(LAYOUT_ENV, raising=False)
    model = decode_layout(tiny_model(1))
    assert calls == [1]
    with torch.inference_mode():
        model(torch.zeros(1, 3, dtype=torch.long), torch.arange(3)[None])
    assert calls == [1] and min_rows(model.output) == 2  # oneDNN never won: past the last measured count


def test_describe_names_the_crossovers_in_use(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    threads = torch.get_num_threads()
    monkeypatch.setattr(kernel_choice, "_MEASURED", {})
    assert kernel_choice.describe() == ""
    monkeypatch.setattr(kernel_choice, "_MEASURED", {("a", threads): Plan(4), ("b", threads): Plan(2, (1, 2)),
                                                     ("c", threads + 1): Plan(1), ("d", threads): Plan(3, (1, None))})
    assert kernel_choice.describe() == "native 1-2 rows, oneDNN from 2 rows / native from 1 rows / oneDNN from 4 rows"
    monkeypatch.setenv(ENV, "3")
    assert kernel_choice.describe() == "oneDNN from 3 rows (pinned)"


def plan_cache_case(monkeypatch):
    """A fresh process's view (nothing measured in memory) with a counting, fixed measurement."""
    calls = []

    def fake(linears, rows=kernel_choice.ROWS, rounds=kernel_choice.ROUNDS):
        calls.append(1)
        return Timing((1, 2), (1.0, 3.0), (2.0, 1.0))  # oneDNN from 2 rows

    measured_as(monkeypatch, fake)
    return calls


def test_a_stored_plan_is_read_on_the_next_start_and_a_new_machine_measures(monkeypatch):
    lins = [torch.nn.Linear(8, 8)]
    sig = ((8, 8, torch.float32),)
    calls = plan_cache_case(monkeypatch)
    assert kernel_choice.stored_or_measured(lins, sig, 1) == Plan(2)
    monkeypatch.setattr(kernel_choice, "_MEASURED", {})  # a second process
    assert kernel_choice.stored_or_measured(lins, sig, 1) == Plan(2) and len(calls) == 1  # no timing pass
    monkeypatch.setattr(plan_cache, "machine", lambda: "other-cpu-flags")
    kernel_choice.stored_or_measured(lins, sig, 1)
    assert len(calls) == 2  # another CPU (or torch) measures again


def test_a_plan_timed_while_its_thread_lost_the_core_serves_busy_starts_until_a_quiet_one_times_it_again(monkeypatch):
    """Another process on the cores shows as wall time the timing thread did not run: a sleep in the timing pass is
    that exactly. Such a plan is stored as busy: a start that finds the machine busy too reads it (no second timing
    of seconds), a quiet one times it again and replaces it; no quiet reader (`load`) takes it."""
    lins, sig = [torch.nn.Linear(8, 8)], ((8, 8, torch.float32),)
    calls = plan_cache_case(monkeypatch)
    timing = kernel_choice.time_passes
    monkeypatch.setattr(plan_cache, "QUIET_SHARE", 0.9)
    monkeypatch.setattr(kernel_choice, "time_passes", lambda linears: time.sleep(0.05) or timing(linears))
    assert kernel_choice.stored_or_measured(lins, sig, 1) == Plan(2) and len(calls) == 1
    key = plan_cache.key(sig, 1)
    assert plan_cache.read()[key]["busy"] is True and plan_cache.load(key) is None
    monkeypatch.setattr(plan_cache, "quiet_now", lambda: False)  # a busy start
    assert kernel_choice.stored_or_measured(lins, sig, 1) == Plan(2) and len(calls) == 1
    monkeypatch.setattr(plan_cache, "quiet_now", lambda: True)  # a quiet start
    monkeypatch.setattr(kernel_choice, "time_passes", timing)
    monkeypatch.setattr(plan_cache, "QUIET_SHARE", 0.0)  # judged quiet whatever else runs beside this test
    assert kernel_choice.stored_or_measured(lins, sig, 1) == Plan(2) and len(calls) == 2
    assert plan_cache.load(key) == (2, None) and "busy" not in plan_cache.read()[key]


def test_a_spin_that_sleeps_is_not_quiet(monkeypatch):
    """quiet_now's judgement can fail: a thread off its core for most of the spin (here: asleep) is not quiet."""
    monkeypatch.setattr(plan_cache, "QUIET_SHARE", 0.9)
    assert not plan_cache.timed_quietly(lambda: time.sleep(0.05))[1]


def test_a_corrupt_plan_file_is_ignored_and_rewritten(monkeypatch):
    calls = plan_cache_case(monkeypatch)
    plan_cache.path().parent.mkdir(parents=True)
    plan_cache.path().write_text("{not json")
    sig = ((8, 8, torch.float32),)
    assert kernel_choice.stored_or_measured([torch.nn.Linear(8, 8)], sig, 1) == Plan(2) and len(calls) == 1
    assert plan_cache.load(plan_cache.key(sig, 1)) == (2, None)


def test_an_unwritable_plan_folder_measures_with_one_warning(monkeypatch, tmp_path):
    calls = plan_cache_case(monkeypatch)
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(plan_cache, "path", lambda: tmp_path / "file" / "plans" / plan_cache.FILE)  # under a file
    monkeypatch.setattr(plan_cache, "WARNED", set())
    with pytest.warns(UserWarning, match="kernel plans, cost curves and decoded weights are not cached"):
        assert kernel_choice.stored_or_measured([torch.nn.Linear(8, 8)], ((8, 8, torch.float32),), 1) == Plan(2)
    assert len(calls) == 1


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
