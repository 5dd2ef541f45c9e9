"""The training scripts' shared logger writes timestamped lines to the file and to stderr."""

from pathlib import Path

import pytest

from specgen.errors import UsageError
from specgen.train.script import file_logger

ROOT = Path(__file__).resolve().parents[2]


def test_file_logger(tmp_path, capsys):
    log = file_logger(tmp_path / "run.log")
    log("step 1 loss 2.0")
    log("done")
    lines = (tmp_path / "run.log").read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == ["step 1 loss 2.0", "done"]
    assert "done" in capsys.readouterr().err


def test_registering_scripts_take_force(tmp_path):
    """An existing name was refused with 'pass --force to replace it', which these scripts did not accept."""
    import torch

    from specgen import checkpoints, registry
    from specgen.train import image_gpt

    registry.save("target", "taken", {"w": torch.zeros(1)}, {})
    quick = ["--out", str(tmp_path / "run"), "name=taken", "ship_dir=", "num_crops=16", "eval_crops=8", "steps=1",
             "batch_size=4", "samples_per_class=1", f"token_cache={tmp_path / 'tok'}", "n_layers=1"]
    assert image_gpt.main([*quick, "--force"]) == 0
    assert checkpoints.find("target/taken").meta["created_by"] == "python -m specgen.train.image_gpt"
    # rerun into its folder (resumed: a max_minutes stop registered, then "run again to continue"), the run replaces
    # what it wrote itself, its ship_dir's files too, without --force; from another folder, not
    shipped = ["--out", str(tmp_path / "shipped"), "name=taken", f"ship_dir={tmp_path / 'ship'}", *quick[4:]]
    assert image_gpt.main([*shipped, "--force"]) == 0 and (tmp_path / "ship" / "model.safetensors").is_file()
    assert image_gpt.main(shipped) == 0
    with pytest.raises(UsageError, match="ship_dir .* already holds model.safetensors; pass --force"):
        image_gpt.main(["--out", str(tmp_path / "other"), *shipped[2:]])
    with pytest.raises(UsageError, match="target/taken already exists"):
        image_gpt.main(["--out", str(tmp_path / "other"), *quick[2:]])


def test_the_mesh_script_names_its_own_rename_option(tmp_path, capsys):
    """Its refusal of an existing name said '(name=NEW)', a recipe key that names nothing there (--register does)."""
    import torch

    from specgen import registry
    from specgen.train import mesh

    registry.save("target", "taken", {"w": torch.zeros(1)}, {})
    with pytest.raises(UsageError, match=r"target/taken already exists.*\(--register NEW\)$"):
        mesh.main(["--config", str(ROOT / "recipes/tiny/mesh-gpt.yaml"), "--out", str(tmp_path), "--register", "taken",
                   "ship_dir="])  # no ship folder: the recipe's is mesh-gpt-tiny's, refused under another name
