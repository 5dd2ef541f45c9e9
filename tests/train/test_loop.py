"""The shared training loop (specgen/train/loop.py): cadence, resume (also after a kill), gradient accumulation,
time budget, and DDP with 2 gloo processes (rank 0's weights everywhere, gradients averaged)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specgen.train.checkpoint import StaleStateError
from specgen.train.loop import Loop, LoopOptions, StateFile
from tests.train.loop_fixtures import Regression

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """A StateFile stand-in that remembers at which steps it was written (and writes nothing)."""

    def __init__(self) -> None:
        self.saved: list[int] = []

    def load(self, task):
        return None

    def save(self, task, meta):
        self.saved.append(meta["step"])


def weights(task) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in task.model.state_dict().items()}


def test_cadence_of_log_eval_and_checkpoint():
    lines, ckpt, task = [], Recorder(), Regression()
    p = Loop(LoopOptions(steps=10, log_every=3, eval_every=4, ckpt_every=5), lines.append).run(task, ckpt)
    assert p.step == 10 and task.evals == [4, 8, 10]
    assert [r["step"] for r in p.history] == [4, 8, 10]
    assert [ln.split()[1] for ln in lines if ln.startswith("step ")] == ["3/10", "6/10", "9/10", "10/10"]
    assert ckpt.saved == [4, 5, 8, 10]  # every ckpt_every, with every evaluation, at the end
    ckpt = Recorder()
    Loop(LoopOptions(steps=10, stop_after=7, eval_every=4)).run(Regression(), ckpt)
    assert ckpt.saved == [4, 7]  # a stop before the end is checkpointed too


def test_a_resumed_loss_scaled_run_goes_on_at_its_loss_scale(tmp_path):
    """fp16 (`distill --dtype float16`, CUDA) scales the loss by a factor that grows and backs off with the run: a
    resume that started again from the initial scale skipped other overflowing steps than the uninterrupted run,
    ending with other weights. A CPU GradScaler stands in for CUDA's (accelerate makes none on the CPU)."""
    def loop(**kw) -> Loop:
        lp = Loop(LoopOptions(steps=6, **kw))
        lp.acc.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
        return lp

    whole = loop()
    whole.run(Regression(), StateFile(tmp_path / "a.safetensors"))
    loop(stop_after=3).run(Regression(), StateFile(tmp_path / "b.safetensors"))
    rest = loop()
    rest.run(Regression(), StateFile(tmp_path / "b.safetensors"))
    assert rest.acc.scaler.get_scale() == whole.acc.scaler.get_scale() == 2.0**16  # doubled at each of 6 steps


def test_resume_equals_an_uninterrupted_run(tmp_path):
    """Stopped at step 6 (its dropout having drawn from the global RNG), resumed to 10: the same weights, optimiser
    moments and history as 10 steps at once, bit for bit; another schedule is refused."""
    whole = Regression()
    pw = Loop(LoopOptions(steps=10, eval_every=5)).run(whole, StateFile(tmp_path / "a.safetensors"))
    part = Regression()
    Loop(LoopOptions(steps=10, eval_every=5, stop_after=6)).run(part, StateFile(tmp_path / "b.safetensors"))
    torch.manual_seed(123)  # whatever happened in between: the state restores the RNG
    rest = Regression()
    pr = Loop(LoopOptions(steps=10, eval_every=5)).run(rest, StateFile(tmp_path / "b.safetensors"))
    assert pr.resumed and pr.step == 10 and pr.history == pw.history
    for k, v in weights(whole).items():
        assert torch.equal(v, weights(rest)[k]), k
    a, b = load_file(str(tmp_path / "a.safetensors")), load_file(str(tmp_path / "b.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(StaleStateError):
        Loop(LoopOptions(steps=10)).run(Regression(), StateFile(tmp_path / "b.safetensors", {"config": {"x": 1}}))


def test_gradient_accumulation_equals_one_big_batch():
    """2 micro-batches of b = one batch of 2b (the same rows: shard k of a step's draw), within fp tolerance."""
    big, acc = Regression(batch_size=8, dropout=0.0), Regression(batch_size=4, dropout=0.0)
    Loop(LoopOptions(steps=6)).run(big)
    Loop(LoopOptions(steps=6, grad_accum=2)).run(acc)
    for k, v in weights(big).items():
        torch.testing.assert_close(weights(acc)[k], v, rtol=1e-5, atol=1e-6)
    assert not torch.equal(weights(big)["1.weight"], Regression(dropout=0.0).model[1].weight)  # it trained


def test_mixed_precision_autocasts_and_keeps_float32_weights():
    """bf16 autocast (accelerate) after a float32 run in the same process: it trains, the weights stay float32, and
    its steps differ from float32's (the matmuls really ran in bfloat16)."""
    ref, bf16 = Regression(dropout=0.0), Regression(dropout=0.0)
    Loop(LoopOptions(steps=4)).run(ref)
    loop = Loop(LoopOptions(steps=4, mixed_precision="bf16"))
    assert loop.acc.mixed_precision == "bf16"
    loop.run(bf16)
    w, w_ref = bf16.model[1].weight, ref.model[1].weight
    assert w.dtype == torch.float32 and not torch.equal(w, Regression(dropout=0.0).model[1].weight)
    assert not torch.equal(w, w_ref) and torch.allclose(w, w_ref, atol=0.05)
    Loop(LoopOptions(steps=1))  # and back


def test_time_budget_stops_checkpointed(tmp_path):
    p = Loop(LoopOptions(steps=10, max_minutes=1e-9)).run(Regression(), StateFile(tmp_path / "s.safetensors"))
    assert p.stopped_early and p.step == 1  # the budget is checked after a step: every session makes progress
    cpu_budget = LoopOptions(steps=10, max_minutes=1e-9, budget="cpu")
    p = Loop(cpu_budget).run(Regression(), StateFile(tmp_path / "s.safetensors"))
    assert p.stopped_early and p.step == 2  # CPU time is summed over sessions: the resumed run is over budget at once
    assert (tmp_path / "s.safetensors").is_file()


def _free_port() -> int:
    """A port nobody listens on now (consecutive launches on one fixed port can hit its TIME_WAIT)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _script(out: Path, steps: int, *extra: str, env: dict | None = None, ddp: bool = False, **kw):
    cmd = [sys.executable, "-m", "tests.train.loop_fixtures", str(out), str(steps), *extra]
    if ddp:
        port = str(_free_port())
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port, *cmd[1:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_weights(tmp_path):
    """SIGKILL mid-run (after a few checkpoints), rerun the same command: the weights of an uninterrupted run."""
    whole, part = tmp_path / "whole", tmp_path / "part"
    whole.mkdir(), part.mkdir()
    assert _script(whole, 12).wait(60) == 0
    proc = _script(part, 12, "1", "0.3")
    deadline = time.time() + 60
    while time.time() < deadline and not (part / "state.safetensors").is_file():
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert not (part / "weights-rank0.safetensors").exists()  # it really died before the end
    assert _script(part, 12).wait(60) == 0
    log = (part / "log-rank0.txt").read_text()
    assert "resumed at step" in log and "resumed at step 0/" not in log
    a, b = load_file(str(whole / "weights-rank0.safetensors")), load_file(str(part / "weights-rank0.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_two_gloo_processes_average_gradients(tmp_path):
    """torchrun with 2 processes: DDP engages (2 processes in the log), both ranks end with identical weights, and
    those equal one process accumulating the same 2 shards per step (the average of the ranks' gradients)."""
    ddp, one = tmp_path / "ddp", tmp_path / "one"
    ddp.mkdir(), one.mkdir()
    for _ in range(3):
        proc = _script(ddp, 6, ddp=True)
        _, err = proc.communicate(timeout=120)
        # again (up to twice) only when a rank died of SIGABRT before any result: a rare abort inside gloo on a 2-core
        # VM (2026-11-26: once in ~15 runs; later twice in a row inside a full suite run, then 1 in 22 alone); a wrong
        # result still fails below
        if proc.returncode == 0 or "Signal 6 (SIGABRT)" not in err or (ddp / "weights-rank0.safetensors").exists():
            break
        shutil.rmtree(ddp)
        ddp.mkdir()
    assert proc.returncode == 0, err[-2000:]
    assert _script(one, 6, "2").wait(60) == 0
    assert "2 process(es)" in (ddp / "log-rank0.txt").read_text()
    r0, r1 = (load_file(str(ddp / f"weights-rank{r}.safetensors")) for r in (0, 1))
    single = load_file(str(one / "weights-rank0.safetensors"))
    for k in r0:
        assert torch.equal(r0[k], r1[k]), k
        torch.testing.assert_close(r0[k], single[k], rtol=1e-5, atol=1e-6)
    start = Regression(dropout=0.0).model.state_dict()
    assert not torch.equal(r0["1.weight"], start["1.weight"])


@pytest.mark.slow
def test_two_processes_resume_from_rank_0s_state(tmp_path):
    """2 gloo processes stopped at step 3 and relaunched end where an uninterrupted 2-process run does."""
    whole, part = tmp_path / "whole", tmp_path / "part"
    whole.mkdir(), part.mkdir()
    for out, extra in ((whole, ()), (part, ("1", "0", "3")), (part, ())):
        proc = _script(out, 6, *extra, ddp=True)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
    assert "resumed at step 3/6" in (part / "log-rank0.txt").read_text()
    for r in (0, 1):
        a = load_file(str(whole / f"weights-rank{r}.safetensors"))
        b = load_file(str(part / f"weights-rank{r}.safetensors"))
        assert all(torch.equal(a[k], b[k]) for k in a)
