"""Distillation on a tiny random target: losses go down, resume is exact, bad inputs are refused, DDP on gloo."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specgen import checkpoints, registry
from specgen.errors import IncompatibleError, RuntimeFailure, UsageError
from specgen.text.target import load_text_model
from specgen.text.trajectories import load_records
from specgen.train.distill import OBJECTIVES, DistillConfig, check_config, distill, group_records
from tests.pcllm_fixtures import collect_tiny, save_tiny_text, write_prompts

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def traj(tmp_path):
    save_tiny_text()
    out = tmp_path / "traj"
    collect_tiny(out, write_prompts(tmp_path))
    return out


def config(traj, **kw):
    base = dict(model="tiny-text", trajectories=str(traj), name="tiny-pc", block_size=4, window=4, steps=30,
                lr=3e-3, warmup_steps=2, lora_rank=4, lora_alpha=8, ckpt_every=10, log_every=10, ar_weight=1.0)
    base.update(kw)
    return DistillConfig(**base)


def eval_losses(model_name, traj, objective):
    tm = load_text_model(model_name)
    groups = group_records(load_records(traj))
    cfg = config(traj, objective=objective)
    total = {"pc": 0.0, "ar": 0.0}
    with torch.no_grad():
        for i, g in enumerate(groups):
            out = OBJECTIVES[objective](tm.module, g, cfg, random.Random(i), "cpu", tm.tokenizer.stop_ids)
            for k in total:
                total[k] += float(out[k]) / len(groups)
    return total


@pytest.mark.parametrize("objective,finetune,lr,w,steps", [("pcllm", "lora", 3e-3, 1.0, 40),
                                                           ("cllm", "full", 1e-3, 0.1, 80)])
def test_losses_decrease(traj, tmp_path, objective, finetune, lr, w, steps):
    before = eval_losses("tiny-text", traj, objective)
    summary = distill(config(traj, objective=objective, finetune=finetune, steps=steps, lr=lr, ar_weight=w),
                      tmp_path / "run")
    after = eval_losses("tiny-pc", traj, objective)
    assert after["pc"] < 0.95 * before["pc"], (before, after)
    assert after["pc"] + w * after["ar"] < before["pc"] + w * before["ar"]
    if objective == "pcllm":
        assert after["ar"] < before["ar"]
    refs = summary["entries"]
    assert ("target/tiny-pc" in refs) and (("adapter/tiny-pc-lora" in refs) == (finetune == "lora"))
    if finetune == "lora":  # the adapter entry loads as base + merged adapter = the merged target
        a, m = load_text_model("adapter/tiny-pc-lora").module, load_text_model("target/tiny-pc").module
        torch.testing.assert_close(a.layers[0].attention.wqkv.weight, m.layers[0].attention.wqkv.weight)


def test_resume_after_interruption_is_exact(traj, tmp_path):
    whole = distill(config(traj, steps=20, register=False), tmp_path / "whole")
    first = distill(config(traj, steps=20, max_minutes=1e-9, register=False), tmp_path / "part")  # stops after step 1
    assert not first["finished"] and first["steps"] == 1
    assert not [p for p in (tmp_path / "part").iterdir() if p.name.startswith(".")]  # no partial checkpoint
    resumed = distill(config(traj, steps=20, register=False), tmp_path / "part")
    assert resumed["steps"] == 20
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "whole" / "state.safetensors"))
    b = load_file(str(tmp_path / "part" / "state.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    assert [h["loss"] for h in whole["history"]] == pytest.approx([h["loss"] for h in resumed["history"]], rel=1e-4)



def test_resume_on_other_trajectories_is_refused(traj, tmp_path):
    """A stopped run resumed after the trajectory folder changed (collected further, or again) went on training on
    other prompts per step, ending with weights neither data set gives; its state now records the records' digest."""
    first = distill(config(traj, steps=20, max_minutes=1e-9, register=False), tmp_path / "part")
    assert not first["finished"]
    shards = sorted((traj / "shards").glob("*.parquet"))
    assert len(shards) > 1
    shards[-1].unlink()  # fewer prompts now
    with pytest.raises(UsageError, match="holds other trajectories than the run in the state was trained on"):
        distill(config(traj, steps=20, register=False), tmp_path / "part")

def test_refuses_other_target_and_block_size(traj, tmp_path):
    save_tiny_text("other-text", seed=5, eos="^")  # another target with another tokenizer (eos differs)
    with pytest.raises(IncompatibleError, match=r"target/tiny-text \(tokenizer \w+\).*target/other-text \(tokenizer"):
        distill(config(traj, model="other-text"), tmp_path / "r")
    with pytest.raises(IncompatibleError, match="block_size=8 but .* block size 4"):
        distill(config(traj, block_size=8), tmp_path / "r")
    with pytest.raises(UsageError, match="objective"):
        check_config(config(traj, objective="dpo"))


def test_an_empty_name_is_refused_by_name_and_allowed_without_registering():
    """name= said "invalid name (+ -lora: ...) '-lora'" (a name the user never gave), even with register=false,
    which registers nothing."""
    with pytest.raises(UsageError, match="^name= is empty: distill registers target/NAME and adapter/NAME-lora"):
        check_config(config("traj", name=""))
    check_config(config("traj", name="", register=False))


def test_refuses_a_model_named_with_a_dtype_suffix(traj, tmp_path):
    """model=tiny-text+bf16 trained on the bfloat16-rounded weights and registered target/NAME merged onto them (in
    float32, recorded nowhere), while the adapter named the full-precision target as its parent."""
    with pytest.raises(UsageError, match=r"model=tiny-text\+bf16 loads target/tiny-text in bfloat16, which would"):
        distill(config(traj, model="tiny-text+bf16"), tmp_path / "r")


def test_init_adapter_must_belong_to_the_model(traj, tmp_path):
    distill(config(traj, steps=3), tmp_path / "a")
    save_tiny_text("other-text", seed=5)
    with pytest.raises(IncompatibleError, match="trained for target/tiny-text, not target/other-text"):
        distill(config(traj, model="other-text", init_adapter="tiny-pc-lora"), tmp_path / "b")
    with pytest.raises(UsageError, match="^init_adapter=target/tiny-pc: target/tiny-pc is not a LoRA adapter"):
        distill(config(traj, name="tiny-pc3", init_adapter="target/tiny-pc"), tmp_path / "d")  # was: 'no drafter of'
    cont = distill(config(traj, steps=3, name="tiny-pc2", init_adapter="tiny-pc-lora"), tmp_path / "c")
    assert cont["steps"] == 3 and checkpoints.find("adapter/tiny-pc2-lora").meta["init_adapter"] == "tiny-pc-lora"


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_init_adapter_holding_nan_is_refused(traj, tmp_path, finetune):
    """A NaN adapter continued by a LoRA run trained on from NaN losses (the full run's merge refused it already)."""
    from safetensors.torch import save_file
    distill(config(traj, steps=1), tmp_path / "a")
    entry = checkpoints.find("adapter/tiny-pc-lora")
    state = registry.read_state(entry)
    first = min(state)
    save_file({**state, first: torch.full_like(state[first], float("nan"))}, str(entry.path / registry.WEIGHTS))
    with pytest.raises(IncompatibleError, match="^adapter/tiny-pc-lora .*holds NaN or infinite values"):
        distill(config(traj, steps=1, name="tiny-pc2", finetune=finetune, init_adapter="tiny-pc-lora"),
                tmp_path / "b")


@pytest.mark.slow
def test_two_process_gloo(traj, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29533",
           "-m", "cli.main", "distill", "--out", str(tmp_path / "ddp"), "--trajectories", str(traj), "--model",
           "tiny-text", "--name", "tiny-ddp", "--steps", "6", "block_size=4", "window=4", "lora_rank=4",
           "log_every=2", "ckpt_every=3", "--quiet", "--format", "json"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads(r.stdout)  # rank 0's row alone (rank 1 printed one too: no losses, nothing registered)
    assert row["registered"] == "adapter/tiny-ddp-lora, target/tiny-ddp" and row["loss"] is not None
    log = (tmp_path / "ddp" / "train.log").read_text()
    assert "2 process(es)" in log and "step 6/6" in log
    assert checkpoints.find("target/tiny-ddp").meta["metrics"]["steps"] == 6


@pytest.mark.parametrize("targets,needle", [(["wqkv", "nosuch"], "lora_targets: nosuch is no Linear layer"),
                                            ([], "lora_targets is empty")])
def test_refuses_lora_targets_the_model_lacks(traj, tmp_path, targets, needle):
    """A misspelt name was silently dropped beside a real one, and none matching was a ValueError (exit 1)."""
    with pytest.raises(UsageError, match=needle):
        distill(config(traj, lora_targets=targets), tmp_path / "r")


def test_refuses_a_trajectories_record_that_is_no_object(traj, tmp_path):
    """Valid JSON of another shape (a list) failed with AttributeError: 'list' object has no attribute 'get'."""
    (traj / "trajectories.json").write_text("[1, 2]")
    with pytest.raises(RuntimeFailure, match="trajectories.json: not a JSON object"):
        distill(config(traj), tmp_path / "r")


def test_refuses_an_adapter_as_the_model(traj, tmp_path):
    """model=ADAPTER trained and registered target/NAME without tokenizer files (a corrupt entry) and NAME-lora with
    an adapter as its parent (unloadable); the documented way on is init_adapter with the adapter's target."""
    distill(config(traj, steps=1), tmp_path / "a")
    collect_tiny(tmp_path / "traj-a", write_prompts(tmp_path), model="tiny-pc-lora")  # as the adapter decodes
    with pytest.raises(UsageError, match="adapter/tiny-pc-lora is no target.*model=target/tiny-text init_adapter="):
        distill(config(tmp_path / "traj-a", steps=1, model="tiny-pc-lora", name="on-adapter"), tmp_path / "b")
    home = registry.checkpoints_dir()
    assert not (home / "target" / "on-adapter").exists() and not (home / "adapter" / "on-adapter-lora").exists()


def test_refuses_a_quantized_model(traj, tmp_path):
    """model=NAME+int8 failed on its packed weights ('lora_targets ... is no Linear layer of the model (it has )')."""
    with pytest.raises(UsageError, match="is quantized \\(int8\\); distill its float model, model=target/tiny-text"):
        distill(config(traj, model="tiny-text+int8"), tmp_path / "r")
