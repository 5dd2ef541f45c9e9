"""Heads training (both stages) on a tiny backbone: losses go down, outputs registered and loadable."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from specgen import registry
from specgen.config import load_config
from specgen.errors import UsageError
from specgen.methods.xspecmesh import load_mesh
from specgen.train.heads import HeadsTrainConfig, HeadsTrainer, check_config, save_outputs
from tests.mesh.mesh_fixtures import register_tiny

TINY = ["target=tiny-mesh", "num_sequences=8", "eval_sequences=4", "label_batch=12", "max_tokens=24", "batch_size=4",
        "num_heads=2", "inner_dim=16", "stage1_lr=3e-3", "lora_rank=4"]


def tiny_config(*overrides: str) -> HeadsTrainConfig:
    """Heads training on the tiny registered backbone, in seconds."""
    register_tiny("tiny-mesh", None)
    return load_config(HeadsTrainConfig, None, TINY + list(overrides))


@pytest.mark.slow
def test_heads_training_loss_decreases_and_resumes(tmp_path):
    old = torch.get_num_threads()
    cfg = tiny_config("name=t-ca", "stage1_epochs=6", "stage1_min_lr=1e-3", "stage2_epochs=2")
    trainer = HeadsTrainer(cfg, tmp_path)
    result = trainer.train()
    s1 = result["stage1"]
    assert s1[-1]["train_loss"] < s1[0]["train_loss"] - 0.05
    assert s1[-1]["eval_mhd"] < s1[0]["eval_mhd"]
    assert len(result["stage2"]) == 2 and result["lora"]
    refs = [e.ref for e in save_outputs(trainer, result)]
    assert refs == ["heads/t-ca-s1", "adapter/t-ca-lora", "heads/t-ca"]
    loaded = load_mesh(None, "t-ca")
    assert loaded.adapter.name == "t-ca-lora" and loaded.target.name == "tiny-mesh"
    assert loaded.heads.meta["parent_digest"] == registry.weights_digest(loaded.target)
    # shipping into a package folder: the same three entries in registry layout; shipping and the thread count
    # are not training settings, so the finished run resumes (without training again) and yields the same heads
    ship = tmp_path / "assets"
    shipped = dataclasses.replace(cfg, ship_dir=str(ship), num_threads=cfg.num_threads + 1)
    save_outputs(HeadsTrainer(shipped, tmp_path), result, force=True)
    assert sorted(p.name for p in ship.iterdir()) == ["t-ca", "t-ca-lora", "t-ca-s1"]
    assert json.loads((ship / "t-ca" / "config.json").read_text())["adapter"] == "t-ca-lora"
    again = HeadsTrainer(shipped, tmp_path).train()
    for k, v in result["heads_s2"].items():
        torch.testing.assert_close(again["heads_s2"][k], v)
    # labels record what made them: the same folder with more sequences is refused, not reused
    more = HeadsTrainer(dataclasses.replace(cfg, num_sequences=16), tmp_path)
    with pytest.raises(UsageError, match="num_sequences 8, not 16"):
        more.labels()
    torch.set_num_threads(old)


def test_stage2_kl_backbone_loss_reuses_stage1(tmp_path):
    """backbone_loss=kl: zero at the start of stage 2 (the LoRA starts as the identity), and a finished
    stage 1 is reused when only stage-2 settings and the name change."""
    import shutil

    from specgen.train.heads import BACKBONE_LOSSES
    from specgen.train.lora import apply_lora, lora_disabled

    old = torch.get_num_threads()
    cfg = tiny_config("name=t-ce", "stage1_epochs=3", "stage2_epochs=1", "stages=1")
    first = HeadsTrainer(cfg, tmp_path / "ce").train()
    (tmp_path / "kl").mkdir()
    for f in ("labels.safetensors", "stage1.safetensors"):
        shutil.copy(tmp_path / "ce" / f, tmp_path / "kl" / f)
    kl_cfg = dataclasses.replace(cfg, name="t-kl", backbone_loss="kl", stages=2)
    trainer = HeadsTrainer(kl_cfg, tmp_path / "kl")
    pcs, tokens = trainer.labels()
    apply_lora(trainer.model.decoder, ("wqkv", "w1"), 4, 8.0)
    for p in trainer.model.parameters():  # a nonzero update: KL > 0; disabled, the model is its base again
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    t = tokens[:2, : int((tokens[:2] >= 0).sum(1).max())]
    logits, _, _ = trainer.model.forward_train(pcs[:2], t)
    assert float(BACKBONE_LOSSES["kl"](trainer.model, pcs[:2], t, logits).detach()) > 0
    with lora_disabled(trainer.model):
        base, _, _ = trainer.model.forward_train(pcs[:2], t)
    assert float(BACKBONE_LOSSES["kl"](trainer.model, pcs[:2], t, base).detach()) < 1e-6
    result = HeadsTrainer(kl_cfg, tmp_path / "kl").train()
    assert result["stage1"] == first["stage1"]  # resumed, not retrained
    assert result["stage2"][0]["eval_backbone"] >= 0 and result["lora"]
    with pytest.raises(UsageError, match="backbone_loss"):
        check_config(dataclasses.replace(cfg, backbone_loss="mse"))
    torch.set_num_threads(old)


def test_soft_targets_are_the_label_distribution_and_train(tmp_path):
    """head_targets=soft: the target rows are the filtered, tempered distributions the labels were drawn
    from, cross-entropy against a one-hot row is the hard loss, and training with them lowers the loss."""
    from specgen.decoding.sampling import SamplingParams, logits_to_probs
    from specgen.train.heads import soft_cross_entropy
    from specgen.train.mesh import sequence_loss

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 40, generator=g)
    tokens = torch.tensor([[3, 7, 1, -1, -1], [0, 39, 2, 5, 6]])
    one_hot = torch.nn.functional.one_hot(tokens.clamp_min(0), 40).float()
    torch.testing.assert_close(soft_cross_entropy(logits, one_hot, tokens), sequence_loss(logits, tokens))
    params = SamplingParams(0.5, 10, 0.9)
    probs = logits_to_probs(logits, params)
    assert ((probs > 0).sum(-1) <= 10).all()  # top-k filtered, like the labels
    old = torch.get_num_threads()
    cfg = tiny_config("name=t-soft", "stage1_epochs=6", "stage1_min_lr=1e-3", "stage2_epochs=1", "head_targets=soft")
    result = HeadsTrainer(cfg, tmp_path).train()
    s1 = result["stage1"]
    assert s1[-1]["eval_mhd"] < s1[0]["eval_mhd"]  # eval is the hard-label loss in both modes
    assert result["lora"] and len(result["stage2"]) == 1
    with pytest.raises(UsageError, match="head_targets"):
        check_config(dataclasses.replace(cfg, head_targets="dense"))
    torch.set_num_threads(old)


def test_skip_known_offsets_trains_on_the_remaining_targets(tmp_path):
    """skip_known_offsets (beyond the paper): stage 1 trains and lowers its eval loss (on the same masked targets)."""
    old = torch.get_num_threads()
    cfg = tiny_config("name=t-skip", "stage1_epochs=4", "stage1_min_lr=1e-3", "stages=1", "skip_known_offsets=true")
    result = HeadsTrainer(cfg, tmp_path).train()
    s1 = result["stage1"]
    assert s1[-1]["eval_mhd"] < s1[0]["eval_mhd"] and "stage2" not in result
    torch.set_num_threads(old)


@pytest.mark.parametrize("option,key", [pytest.param("token_input=true", "tok.", marks=pytest.mark.slow),
                                        ("res_layers=2", "heads.0.more.0."),
                                        pytest.param("history=4", "heads.0.wkv_h.", marks=pytest.mark.slow)])
def test_variant_heads_train_register_and_decode(tmp_path, option, key):
    """Heads beyond the paper's defaults (token_input: beyond the paper; res_layers: Medusa's deeper
    heads): both stages lower the loss, the registered heads keep the setting, and `load_mesh` decodes
    with them (for token_input the loop feeds E(x_{s*}) to the heads)."""
    from specgen.decoding.sampling import SamplingParams
    from specgen.mesh.procedural import generate_mesh
    from specgen.methods.xspecmesh import XSpecMeshOptions
    from specgen.mesh.pointcloud import point_cloud

    old = torch.get_num_threads()
    cfg = tiny_config("name=t-var", "stage1_epochs=6", "stage1_min_lr=1e-3", "stage2_epochs=1", option)
    trainer = HeadsTrainer(cfg, tmp_path)
    result = trainer.train()
    s1 = result["stage1"]
    assert s1[-1]["eval_mhd"] < s1[0]["eval_mhd"]
    assert any(k.startswith(key) for k in result["heads_s1"])
    save_outputs(trainer, result)
    loaded = load_mesh(None, "t-var")
    field, value = option.split("=")
    assert str(getattr(loaded.decoder.heads.cfg, field)).lower() == value
    g = generate_mesh(3)
    pc = torch.from_numpy(point_cloud(g.vertices, g.faces, 256, 0))
    gens = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    res = loaded.decoder.generate_batch([pc], SamplingParams(1.0, 50, 0.95), 30, XSpecMeshOptions(delta=0.01),
                                       *zip(gens))[0]
    assert 1 <= len(res.tokens) <= 30 and res.stats.steps >= 1
    torch.set_num_threads(old)


def test_a_truncated_labels_file_is_one_line_naming_it(tmp_path):
    """A damaged OUT/labels.safetensors failed with a bare 'SafetensorError: ... incomplete metadata' naming no file."""
    from specgen.errors import CheckpointError

    (tmp_path / "labels.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(CheckpointError, match="corrupt labels file .*labels.safetensors.*delete it"):
        HeadsTrainer(tiny_config("name=t-bad"), tmp_path).labels()


def test_an_empty_name_is_refused_by_name():
    """name= said "invalid name (+ -s1/-lora: ...) '-lora'", a name the user never gave."""
    with pytest.raises(UsageError, match="^name= is empty: train-heads --kind xspecmesh registers heads/NAME"):
        check_config(dataclasses.replace(tiny_config(), name=""))


def test_heads_whose_backbone_or_adapter_was_removed_name_it_as_theirs():
    """Heads whose parent backbone or LoRA adapter is no longer installed said "unknown checkpoint 'NAME'; did you
    mean ...", a name the user never gave."""
    from specgen import checkpoints

    e = checkpoints.find("heads/xspecmesh-ca-tiny")
    meta = {k: v for k, v in e.meta.items() if k not in ("name", "kind")}
    registry.save("heads", "orphan", registry.read_state(e), {**meta, "parent": "gone-mesh"}, force=True)
    registry.save("heads", "orphan2", registry.read_state(e), {**meta, "adapter": "gone-lora"}, force=True)
    with pytest.raises(UsageError, match="^heads/orphan was trained for 'gone-mesh', which is not installed"):
        load_mesh(heads="orphan")
    with pytest.raises(UsageError, match="^heads/orphan2 merges the adapter 'gone-lora', which is not installed"):
        load_mesh(heads="orphan2")


@pytest.mark.parametrize("target", ["heads/xspecmesh-ca-tiny", "adapter/xspecmesh-ca-tiny-lora"])
def test_heads_or_an_adapter_as_the_target_is_one_line(tmp_path, target):
    """target=HEADS (a mesh entry, so past the modality check) failed "AttributeError: 'XSpecMeshHeads' object has
    no attribute 'dec_cfg'" (exit 1) after loading it."""
    with pytest.raises(UsageError, match=f"^{target} is not a target entry; pass target=<mesh backbone>"):
        HeadsTrainer(dataclasses.replace(tiny_config(), target=target), tmp_path)
