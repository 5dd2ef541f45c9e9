"""`specgen train-heads --kind eagle` end to end on a tiny random image target, and its usage errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from specgen import checkpoints, registry
from tests.image_fixtures import one_thread, register_tiny_image_target

runner = CliRunner()
_threads = pytest.fixture(autouse=True)(one_thread)
QUICK = ["samples_per_class=2", "eval_samples_per_class=1", "steps=2", "batch_size=2", "gen_batch=8",
         "eval_every=1", "ckpt_every=1", "log_every=1"]


def test_train_heads_eagle_end_to_end(tmp_path):
    register_tiny_image_target("tiny-img")
    out = tmp_path / "run"
    r = runner.invoke(app, ["train-heads", "--kind", "eagle", "--out", str(out), "--format", "json", "-q",
                            "target=tiny-img", "name=tiny-img-eagle", f"data_cache={tmp_path / 'cache'}", *QUICK])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout.splitlines()[0])[0]
    assert row["ref"] == "draft/tiny-img-eagle" and row["parent"] == "target/tiny-img"
    assert 0.0 <= row["metrics"]["top1_vs_target_top1"] <= 1.0
    entry = checkpoints.find("draft/tiny-img-eagle")
    registry.check_pair(entry, checkpoints.find("tiny-img"))
    drafter = checkpoints.load_module(entry)
    assert drafter.cfg.n_layers == 1 and entry.meta["builder"] == "eagle"
    assert (out / "state.safetensors").is_file() and (out / "train.log").is_file()
    # rerun resumes from the finished state (no new training steps) and re-registers its own entry; from another
    # run folder, only with --force
    again = ["train-heads", "--kind", "eagle", "--out", str(out), "--format", "json", "-q", "target=tiny-img",
             "name=tiny-img-eagle", f"data_cache={tmp_path / 'cache'}", *QUICK]
    other = runner.invoke(app, [*again[:4], str(tmp_path / "other"), *again[5:]])
    assert other.exit_code == 2 and "draft/tiny-img-eagle already exists" in other.stderr, other.output
    r2 = runner.invoke(app, again)
    assert r2.exit_code == 0, r2.output
    assert "resumed at step 2/2" in (out / "train.log").read_text()
    # the refusal's other way on, name=NEW (was: 'a different config'), and a ship_dir (was: the CLI let it pass,
    # then after the samples 'state.safetensors was written by a different config')
    r3 = runner.invoke(app, [*again[:-len(QUICK) - 2], "name=tiny-img-eagle2", f"ship_dir={tmp_path / 'ship'}",
                             f"data_cache={tmp_path / 'cache'}", *QUICK])
    assert r3.exit_code == 0, r3.output
    assert checkpoints.find("draft/tiny-img-eagle2") and (tmp_path / "ship" / "model.safetensors").is_file()


def test_drafter_of_another_target_is_a_usage_error(tmp_path):
    register_tiny_image_target("img-a", seed=0)
    register_tiny_image_target("img-b", seed=1)
    r = runner.invoke(app, ["train-heads", "--kind", "eagle", "--out", str(tmp_path / "a"), "-q",
                            "target=img-a", "name=eagle-a", f"data_cache={tmp_path / 'c'}", *QUICK])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["train-heads", "--kind", "eagle", "--out", str(tmp_path / "b"), "-q",
                            "target=img-b", "init=eagle-a", f"data_cache={tmp_path / 'c'}", *QUICK])
    assert r.exit_code == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "trained for target/img-a, not target/img-b" in err[0]
    assert not [e for e in checkpoints.list_entries("draft") if e.installed and e.name != "eagle-a"]
    assert not (tmp_path / "b").exists()  # nothing written for the refused run


def test_bad_targets_and_overrides(tmp_path):
    register_tiny_image_target("tiny-img")
    r = runner.invoke(app, ["train-heads", "--kind", "eagle", "--out", str(tmp_path / "x"), "-q", "target=nope-gpt"])
    assert r.exit_code == 2 and "unknown checkpoint 'nope-gpt'" in r.stderr
    r = runner.invoke(app, ["train-heads", "--kind", "eagle", "--out", str(tmp_path / "x"), "-q", "bogus_key=1"])
    assert r.exit_code == 2 and "bad config" in r.stderr
    r = runner.invoke(app, ["train-heads", "--kind", "eagle", "--out", str(tmp_path / "x"), "-q",
                            "target=tiny-img", "steps=0"])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1


def test_generations_of_another_gen_batch_are_not_read_from_the_cache(tmp_path):
    """The data cache's key left out gen_batch, which changes the samples (the rows of a batch draw from one
    generator in turn): a run with gen_batch=1 after one with 4 trained on the 4's data, other than its own."""
    import torch

    from specgen.train.eagle import EagleTrainConfig, generations

    model = checkpoints.load_module(register_tiny_image_target("tiny-img")).eval()

    def data(gen_batch, cache):
        cfg = EagleTrainConfig(target="tiny-img", data_cache=cache, gen_batch=gen_batch)
        with torch.no_grad():
            return generations(model, 1, cfg, 1, "d", lambda s: None)["tokens"]

    cache = str(tmp_path / "cache")
    first = data(4, cache)
    own = data(1, "")  # what gen_batch=1 samples without a cache
    assert not torch.equal(first, own)  # else this test proves nothing
    assert torch.equal(data(1, cache), own) and torch.equal(data(4, cache), first)
