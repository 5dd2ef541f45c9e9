"""`specgen train-upsampler` end to end on a tiny random VQ: register, resume, 2x -> 4x warm start, bad input."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from specgen import checkpoints, registry
from specgen.models.vq import VQ_CONFIGS, VQModel

runner = CliRunner()
TINY = ["num_crops=8", "eval_crops=4", "channels=8", "blocks=1", "batch_size=2", "disc_channels=8",
        "log_every=1", "eval_every=100", "vq=t-vq", "vq_name=t-vq"]


@pytest.fixture
def tiny_vq(tmp_path):
    torch.manual_seed(0)
    cfg = VQ_CONFIGS["vq-tiny"]
    registry.save("vq", "t-vq", VQModel(cfg).state_dict(), {"builder": "vq", "kwargs": cfg.to_dict(), "image_size": 64})
    return tmp_path


def run(tmp, out, *args):
    return runner.invoke(app, ["train-upsampler", "--out", str(tmp / out), "-q", "--format", "json",
                               f"token_cache={tmp / 'cache'}", *TINY, *args])


@pytest.mark.slow
def test_train_register_resume_and_warm_start(tiny_vq):
    r = run(tiny_vq, "u2", "steps=3", "gan_start=1", "name=t-up2")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)[0]
    assert row["ref"] == "upsampler/t-up2" and row["scale"] == "2x"
    meta = checkpoints.find("t-up2").meta
    assert meta["scale"] == 2 and meta["grid_low"] == 8 and meta["grid_high"] == 16 and meta["vq"] == "t-vq"
    assert meta["metrics"]["perceptual"] in ("vq-features", "lpips")
    assert "up_gan" in (tiny_vq / "u2" / "train.log").read_text()  # the adversarial term switched on at step 1
    pair = checkpoints.load_module(checkpoints.find("t-up2"))
    assert pair.upsample_tokens(torch.zeros(1, 2, 8, dtype=torch.long)).shape == (1, 4, 16)
    # resume: more steps continue from the saved state; another config in the same folder is refused
    r = run(tiny_vq, "u2", "steps=4", "gan_start=1", "name=t-up2")
    assert r.exit_code == 2 and "different config" in r.stderr
    # the finished run registered again under name=NEW (the already-exists refusal's advice: was 'a different
    # config (name=...)') and shipped
    r = run(tiny_vq, "u2", "steps=3", "gan_start=1", "name=t-up2b", f"ship_dir={tiny_vq / 'ship'}")
    assert r.exit_code == 0, r.output
    assert checkpoints.find("t-up2b") and (tiny_vq / "ship" / "model.safetensors").is_file()
    # 4x warm-started from the 2x pair
    r = run(tiny_vq, "u4", "steps=2", "scale=4", "warm_start=t-up2", "name=t-up4")
    assert r.exit_code == 0, r.output
    assert checkpoints.find("t-up4").meta["grid_low"] == 4 and "warm start" in (tiny_vq / "u4" / "train.log").read_text()


@pytest.mark.parametrize("args,needle", [
    (["scale=3"], "power of two"),
    (["kernel=4"], "kernel must be odd"),
    (["crop_size=36"], "multiple of scale"),
    (["perceptual=vgg"], "perceptual must be"),
    (["nonsense=1"], "bad config"),
    (["vq=no-such-vq"], "unknown"),
    (["vq=tiny-image-gpt"], "not a VQ tokenizer"),
])
def test_bad_input(tiny_vq, args, needle):
    r = run(tiny_vq, "bad", "steps=1", *args)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_warm_start_mismatch_and_missing_out(tiny_vq):
    assert run(tiny_vq, "u2", "steps=1", "name=t-up2").exit_code == 0
    r = run(tiny_vq, "again", "steps=1", "warm_start=t-up2")  # a 2x pair cannot warm-start a 2x run
    assert r.exit_code == 2 and "smaller scale" in r.stderr
    r = runner.invoke(app, ["train-upsampler", "steps=1"])
    assert r.exit_code == 2 and "--out" in r.stderr


def test_a_resume_refuses_a_vq_saved_again_since(tiny_vq):
    """The state holds a pair trained on one VQ's tokens and codebook: resumed after the VQ's name was saved again
    with other weights, it went on training against the new VQ in silence (EAGLE's state checks its target's)."""
    assert run(tiny_vq, "u2", "steps=1", "name=").exit_code == 0
    torch.manual_seed(1)
    cfg = VQ_CONFIGS["vq-tiny"]
    registry.save("vq", "t-vq", VQModel(cfg).state_dict(), {"builder": "vq", "kwargs": cfg.to_dict(),
                                                            "image_size": 64}, force=True)
    r = run(tiny_vq, "u2", "steps=1", "name=")
    assert r.exit_code == 2 and "different vq_sha" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output
