"""Issue 23: registry writes lose nothing and leave nothing: SIGKILL mid-write, concurrent writers, umask, corrupt
entries, built-ins re-created from the package."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import torch

from specgen import checkpoints, registry
from specgen.errors import CheckpointError, UsageError

ROOT = Path(__file__).resolve().parents[1]

WRITER = textwrap.dedent("""
    import sys, time, torch
    from specgen import checkpoints, registry
    from specgen.errors import UsageError
    name, count, overwrite, pause = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4])
    state = {"w": torch.full((64, 64), float(len(sys.argv)))}

    def extra(folder):  # the weights are written: says so on stderr (stdout holds the outcomes), then pauses
        if pause:
            print("pausing", file=sys.stderr, flush=True)
            time.sleep(pause)

    for i in range(count):
        try:
            registry.save("target", name, state, {"i": i}, extra=extra, force=overwrite)
            print("saved", flush=True)
        except UsageError as e:
            print("refused", e, flush=True)
        except Exception as e:
            print("FAILED", type(e).__name__, e, flush=True)
""")


def writer(home: Path, name: str, count: int = 1, overwrite: bool = True, pause: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, "SPECGEN_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", WRITER, name, str(count), "1" if overwrite else "0", str(pause)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def hidden(kind_dir: Path) -> list[str]:
    return sorted(p.name for p in kind_dir.iterdir() if p.name.startswith(".")) if kind_dir.is_dir() else []


def test_sigkill_mid_write_leaves_a_temporary_that_the_next_write_removes(specgen_home):
    p = writer(specgen_home, "killed", pause=60)
    kind_dir = specgen_home / "checkpoints" / "target"
    assert p.stderr.readline() == "pausing\n"  # inside the pause: weights written, entry not yet renamed into place
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert hidden(kind_dir) and not (kind_dir / "killed").exists()
    assert "target/killed" not in {e.ref for e in checkpoints.list_entries()}  # the half-written entry is invisible
    registry.save("target", "other", {"w": torch.zeros(2)}, {})
    assert hidden(kind_dir) == []
    assert checkpoints.find("other").installed


def test_live_and_foreign_temporaries_are_kept(specgen_home):
    kind_dir = specgen_home / "checkpoints" / "target"
    kind_dir.mkdir(parents=True)
    host = socket.gethostname()
    mine = kind_dir / f".x.tmp-{host}-{os.getpid()}-abcdefgh"  # a live writer (this process)
    foreign = kind_dir / ".x.tmp-some-other-host-1-abcdefgh"  # another machine sharing the home, recent
    dead = kind_dir / f".x.tmp-{host}-{dead_pid()}-abcdefgh"
    for d in (mine, foreign, dead):
        d.mkdir()
    registry.save("target", "y", {"w": torch.zeros(2)}, {})
    assert mine.is_dir() and foreign.is_dir() and not dead.exists()


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.slow
def test_concurrent_overwriting_writers_never_fail(specgen_home):
    procs = [writer(specgen_home, "shared", count=15) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    lines = [line for out, _ in outs for line in out.splitlines()]
    errors = [err for _, err in outs if err.strip()]
    assert lines.count("saved") == 30, (lines, errors)  # no "Directory not empty", no failure of any kind
    entry = checkpoints.find("shared")
    assert registry.read_state(entry)["w"].shape == (64, 64)
    assert hidden(specgen_home / "checkpoints" / "target") == []


@pytest.mark.slow
def test_concurrent_new_writers_one_wins_the_other_is_told(specgen_home):
    procs = [writer(specgen_home, "once", overwrite=False, pause=1.0) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    lines = sorted(line.split(" ")[0] for out in outs for line in out.splitlines())
    assert lines == ["refused", "saved"], outs
    assert any("already exists" in out for out in outs)
    assert hidden(specgen_home / "checkpoints" / "target") == []


@pytest.mark.parametrize("mask,dir_mode,file_mode", [(0o022, 0o755, 0o644), (0o002, 0o775, 0o664),
                                                      (0o077, 0o700, 0o600)])
def test_entries_follow_the_umask(specgen_home, mask, dir_mode, file_mode):
    old = os.umask(mask)
    try:
        entry = registry.save("target", "perm", {"w": torch.zeros(2)}, {})
    finally:
        os.umask(old)
    assert entry.path.stat().st_mode & 0o777 == dir_mode
    assert (entry.path / "model.safetensors").stat().st_mode & 0o777 == file_mode
    assert (entry.path / "config.json").stat().st_mode & 0o777 == file_mode


def test_overwrite_false_refuses_before_writing(specgen_home):
    registry.save("target", "kept", {"w": torch.ones(2)}, {})
    with pytest.raises(UsageError, match="already exists"):
        registry.save("target", "kept", {"w": torch.zeros(2)}, {}, force=False)
    assert registry.read_state(checkpoints.find("kept"))["w"].tolist() == [1.0, 1.0]


def full_device_save(tensors, path, *a, **k):
    """safetensors' save_file on a full device (its message, as a 200 KB tmpfs SPECGEN_HOME gave it)."""
    from safetensors import SafetensorError

    open(path, "wb").close()
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


def test_a_full_registry_home_is_one_line_naming_the_device_and_leaves_nothing(specgen_home, monkeypatch):
    """safetensors reports a failed write as its own SafetensorError ('... I/O error: No space left on device (os
    error 28)'), no OSError: a full SPECGEN_HOME past the space probe printed that bare."""
    from specgen.errors import RuntimeFailure

    monkeypatch.setattr(registry, "save_file", full_device_save)
    with pytest.raises(RuntimeFailure, match=r"cannot write target/full in .*: No space left on device; nothing was "
                                             r"registered: free some space or write elsewhere"):
        registry.save("target", "full", {"w": torch.ones(64)}, {})
    assert os.listdir(specgen_home / "checkpoints" / "target") == []


def test_a_full_run_folder_names_the_state_file(tmp_path, monkeypatch):
    """A training state written onto a full device: an OSError naming the state file (the CLI's one line with the
    advice), not safetensors' bare SafetensorError."""
    from specgen.tensor_files import save_tensors

    monkeypatch.setattr(registry, "save_file", full_device_save)
    with pytest.raises(OSError, match="No space left on device") as e:
        save_tensors(tmp_path / "state.safetensors", {"w": torch.ones(64)})
    assert e.value.filename == str(tmp_path / "state.safetensors") and os.listdir(tmp_path) == []


def test_corrupt_entries_are_listed_with_a_repair(specgen_home):
    from typer.testing import CliRunner

    from cli.main import app

    good = registry.save("target", "fine", {"w": torch.zeros(2)}, {})
    broken = good.path.parent / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    noweights = registry.save("target", "noweights", {"w": torch.zeros(2)}, {})
    (noweights.path / "model.safetensors").unlink()
    registry.save("target", "notok", {"w": torch.zeros(2)}, {"tokenizer": True})
    cut = registry.save("target", "cut", {"w": torch.zeros(64)}, {}).path / "model.safetensors"
    os.truncate(cut, cut.stat().st_size - 8)  # (was listed "ok": only the files' presence was checked)
    r = CliRunner().invoke(app, ["registry", "list", "--format", "json"])
    rows = {x["ref"]: x for x in json.loads(r.stdout)}
    assert rows["target/fine"]["status"] == "ok"
    status = rows["target/broken"]["status"]
    assert status.startswith("corrupt") and "registry remove" in status
    assert "no model.safetensors" in rows["target/noweights"]["status"]
    assert "tokenizer files are missing" in rows["target/notok"]["status"]
    assert rows["target/cut"]["status"].startswith("corrupt (truncated weights: ")
    with pytest.raises(CheckpointError, match="corrupt entry target/broken.*registry remove"):
        checkpoints.find("broken")
    with pytest.raises(CheckpointError, match=r"corrupt entry target/cut \(truncated weights: "):
        checkpoints.find("cut")  # (was a load failing on the tensors, after the module was built)
    r = CliRunner().invoke(app, ["registry", "remove", "broken"])
    assert r.exit_code == 0 and not broken.exists()


def test_a_builtin_this_build_cannot_make_is_listed_with_why(specgen_home):
    # the CLLM adapter is not shipped: `registry list` said "ok", then every use of the entry refused
    from typer.testing import CliRunner

    from cli.main import app
    from specgen.builtins import BUILTINS

    why = BUILTINS["smollm2-135m-cllm"].unavailable()
    assert why  # (this build does not ship it)
    rows = {x["ref"]: x for x in json.loads(CliRunner().invoke(app, ["registry", "list", "--format", "json"]).stdout)}
    assert rows["target/smollm2-135m-cllm"]["status"] == f"cannot be made here: {why}"
    assert rows["classifier/tiny-image-classifier"]["status"] == "ok"  # shipped, made on first use


def test_processes_starting_at_once_make_a_builtin_once(specgen_home, monkeypatch):
    """torchrun ranks on an empty home: one makes the built-in, the others wait for it and read that entry; none
    replaces it under a process already reading it (a reader in the swap finds no config.json or weights)."""
    from specgen.builtins import BUILTINS, materialize_asset

    made = []

    def slow(progress):  # a conversion that takes a while, as SmolLM2's GGUF does
        made.append(1)
        time.sleep(0.5)
        materialize_asset("vq", "tiny-image-vq", "image/vq", progress)

    monkeypatch.setitem(BUILTINS, "tiny-image-vq", dataclasses.replace(BUILTINS["tiny-image-vq"], materialize=slow))
    with ThreadPoolExecutor(3) as pool:  # each thread its own flock, as each process has
        files = list(pool.map(lambda _: checkpoints.find("tiny-image-vq").path / "model.safetensors", range(3)))
    assert len(made) == 1
    assert len({f.stat().st_ino for f in files}) == 1


def test_a_damaged_builtin_is_recreated_from_the_package(specgen_home):
    entry = checkpoints.find("tiny-image-vq")
    want = registry.read_state(entry)
    (entry.path / "model.safetensors").unlink()
    again = checkpoints.find("tiny-image-vq")
    assert torch.equal(registry.read_state(again)["quantize.embedding.weight"], want["quantize.embedding.weight"])
    (again.path / "config.json").write_text("garbage")
    assert checkpoints.find("tiny-image-vq").meta["kind"] == "vq"


def test_names_are_checked():
    for bad in ("", "a/b", ".x", "a\nb", "x" * 101, "a b", "-x", "m+int8", "m+"):
        with pytest.raises(UsageError):
            registry.check_name(bad)
    for ok in ("smollm2-135m", "t2i-xl", "tiny-image-upsampler-2x", "m-int8", "a.b_c"):
        assert registry.check_name(ok) == ok


# ---- issue 48: one write rule for every command that registers an entry ----------------------------------------
SMALL_BUILTINS = {"xspecmesh-ca-tiny-s1": "heads", "xspecmesh-mlp-tiny-lora": "adapter",
                  "tiny-image-upsampler-2x": "upsampler", "tiny-image-classifier": "classifier"}


def shipped_digest(name: str) -> str:
    from specgen.builtins import ASSETS, BUILTINS

    return registry.weights_digest(registry.Entry("-", name, ASSETS / BUILTINS[name].asset))


def test_training_outputs_never_replace_a_builtin_and_remove_restores_one(specgen_home, tmp_path):
    from specgen.train.checkpoint import check_outputs, publish

    state = {"w": torch.ones(3, dtype=torch.float16)}
    with pytest.raises(UsageError, match="'xspecmesh-ca-tiny-s1' is a built-in entry.*name=NEW"):
        check_outputs([("heads", "xspecmesh-ca-tiny-s1", "")])
    with pytest.raises(UsageError, match="is a built-in entry"):
        publish("upsampler", "tiny-image-upsampler-2x", str(tmp_path / "ship"), state, {}, "x", force=True)
    assert not (tmp_path / "ship").exists()
    publish("heads", "mine", "", state, {}, "mine")
    with pytest.raises(UsageError, match="heads/mine already exists.*--force"):
        check_outputs([("heads", "mine", "")])
    check_outputs([("heads", "mine", "")], force=True)
    (tmp_path / "file").write_text("x")  # a ship folder that cannot be made: refused before training, not after
    with pytest.raises(UsageError, match="ship_dir: .*file is a file, not a folder"):
        check_outputs([("heads", "other", str(tmp_path / "file" / "sub"))])
    # a home written before the rule: the built-in was replaced in place; remove brings the shipped one back
    folder = registry.checkpoints_dir() / "heads" / "xspecmesh-ca-tiny-s1"
    registry.save("heads", "xspecmesh-ca-tiny-s1", state, {"builder": "xspecmesh_heads"}, force=True, builtin=True)
    from typer.testing import CliRunner

    from cli.main import app

    rows = {x["ref"]: x for x in json.loads(CliRunner().invoke(app, ["registry", "list", "--format", "json"]).stdout)}
    assert rows["heads/xspecmesh-ca-tiny-s1"]["status"].startswith("not the shipped weights; `specgen registry remove")
    assert CliRunner().invoke(app, ["registry", "remove", "heads/xspecmesh-ca-tiny-s1"]).exit_code == 0
    assert not folder.exists()
    assert registry.weights_digest(checkpoints.find("xspecmesh-ca-tiny-s1")) == shipped_digest("xspecmesh-ca-tiny-s1")


def test_a_run_that_ships_a_builtin_reinstalls_it_from_its_package_folder(specgen_home, monkeypatch, tmp_path):
    import shutil

    from specgen import builtins
    from specgen.train.checkpoint import check_outputs, publish

    assets = tmp_path / "assets"
    shutil.copytree(builtins.ASSETS / "image" / "upsampler-2x", assets / "image" / "upsampler-2x")
    monkeypatch.setattr(builtins, "ASSETS", assets)
    ship = str(assets / "image" / "upsampler-2x")
    check_outputs([("upsampler", "tiny-image-upsampler-2x", ship)])
    state = registry.read_state(registry.Entry("-", "-", Path(ship)))
    state = {k: v + 1 if v.is_floating_point() else v for k, v in state.items()}
    meta = {k: v for k, v in json.loads((Path(ship) / "config.json").read_text()).items() if k not in ("kind", "name")}
    entry = publish("upsampler", "tiny-image-upsampler-2x", ship, state, meta, "upsampler")
    assert registry.weights_digest(entry) == shipped_digest("tiny-image-upsampler-2x")
    assert entry.meta["asset_sha"] == builtins.asset_fingerprint(builtins.BUILTINS["tiny-image-upsampler-2x"].asset)



def test_a_run_never_ships_into_another_builtins_package_folder(specgen_home, monkeypatch, tmp_path):
    """`train-heads --kind eagle name=mine ship_dir=specgen/assets/image/vq` trained and then wrote the drafter over
    the shipped VQ's model.safetensors and config.json, the files every new home installs tiny-image-vq from."""
    import shutil

    from specgen import builtins
    from specgen.train.checkpoint import check_outputs

    assets = tmp_path / "assets"
    shutil.copytree(builtins.ASSETS / "image" / "vq", assets / "image" / "vq")
    monkeypatch.setattr(builtins, "ASSETS", assets)
    for kind, name in (("draft", "mine"), ("draft", "tiny-image-vq"), ("vq", "other-vq")):
        with pytest.raises(UsageError, match="is the package folder of built-in vq/tiny-image-vq"):
            check_outputs([(kind, name, str(assets / "image" / "vq"))])
    check_outputs([("vq", "tiny-image-vq", str(assets / "image" / "vq"))])  # the run that rebuilds it
    check_outputs([("draft", "mine", str(assets / "image" / "mine"))])  # a new folder next to it


def test_the_mesh_script_checks_its_ship_dir_before_training(specgen_home, monkeypatch, tmp_path):
    """`python -m specgen.train.mesh ... ship_dir=specgen/assets/image/vq` trained for an hour and then wrote the
    mesh GPT over the shipped VQ's files: the script checked its --register name but not its ship_dir."""
    from specgen import builtins
    from specgen.train import mesh

    class Trained(Exception):
        pass

    def train(*a, **k):
        raise Trained

    monkeypatch.setattr(mesh, "train", train)
    argv = ["--config", "recipes/tiny/mesh-gpt.yaml", "--out", str(tmp_path / "run")]
    with pytest.raises(UsageError, match="package folder of built-in vq/tiny-image-vq"):
        mesh.main([*argv, f"ship_dir={builtins.ASSETS / 'image' / 'vq'}"])
    with pytest.raises(UsageError, match=r"\(--register mesh-gpt-tiny\)"):  # the recipe's folder, unnamed
        mesh.main(argv)
    with pytest.raises(Trained):  # the run that rebuilds it
        mesh.main([*argv, "--register", "mesh-gpt-tiny"])


def test_a_run_replaces_a_checkpoint_in_its_ship_dir_only_with_force(specgen_home, tmp_path):
    """`train-upsampler ... name=mine ship_dir=./my-hf-model` trained and then wrote over that folder's
    model.safetensors and config.json unasked; outputs are replaced only with --force, as registry entries are."""
    from specgen.train.checkpoint import check_outputs

    held = tmp_path / "held"
    held.mkdir()
    (held / "model.safetensors").write_bytes(b"x")
    with pytest.raises(UsageError, match="ship_dir .*held already holds model.safetensors; pass --force"):
        check_outputs([("upsampler", "mine", str(held))])
    check_outputs([("upsampler", "mine", str(held))], force=True)
    check_outputs([("upsampler", "mine", str(tmp_path / "new"))])  # a new or empty folder needs none

OPS = st.one_of(
    st.tuples(st.just("import"), st.sampled_from([*SMALL_BUILTINS, "mine"]), st.booleans()),
    st.tuples(st.just("train"), st.sampled_from([*SMALL_BUILTINS, "mine"]), st.booleans()),
    st.tuples(st.just("use"), st.sampled_from(list(SMALL_BUILTINS)), st.booleans()),
    st.tuples(st.just("remove"), st.sampled_from([*SMALL_BUILTINS, "mine"]), st.booleans()))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, max_size=6))
def test_no_sequence_of_imports_trainings_and_removes_changes_a_builtin(tmp_path, monkeypatch, ops):
    """Property: whatever `registry import`, `train-*` (their one write function, `publish`, behind the
    `check_outputs` they run before training) and `registry remove` do, every built-in loads as shipped."""
    import tempfile

    from specgen.importer import import_checkpoint
    from specgen.train.checkpoint import check_outputs, publish

    model = torch.nn.Linear(1, 1)
    with tempfile.TemporaryDirectory(dir=tmp_path) as home:
        monkeypatch.setenv("SPECGEN_HOME", home)
        src, kwargs = Path(home) / "w.safetensors", Path(home) / "kw.json"
        from safetensors.torch import save_file

        from tests.conftest import tiny_model

        tiny = tiny_model(n_layers=1)
        save_file({k: v.clone() for k, v in tiny.state_dict().items()}, str(src))
        kwargs.write_text(json.dumps(tiny.cfg.to_dict()))
        for op, name, force in ops:
            kind = SMALL_BUILTINS.get(name, "draft")  # a text GPT imports as a target or a (text) drafter
            try:
                if op == "import":
                    import_checkpoint(src, name, kind, "transformer", kwargs, force=force)
                elif op == "train":
                    check_outputs([(kind, name, "")], force)
                    publish(kind, name, "", {"w": model.weight.detach().half()}, {}, name, force)
                elif op == "use":
                    checkpoints.find(name)
                else:
                    registry.remove(f"{kind}/{name}")
            except UsageError as e:
                assert "built-in" in str(e) or "already exists" in str(e) or "no installed" in str(e).lower() \
                    or "unknown" in str(e).lower(), e
        for e in registry.installed_entries():  # as stored, before `find` could re-install a stale built-in
            assert e.name not in SMALL_BUILTINS or registry.weights_digest(e) == shipped_digest(e.name), e.ref
        for name, kind in SMALL_BUILTINS.items():
            entry = checkpoints.find(f"{kind}/{name}")
            assert entry.builtin and registry.weights_digest(entry) == shipped_digest(name), name


def test_a_builtins_modality_is_read_from_its_asset_folder_without_materialising_it():
    """`checkpoints.modality_of` takes a built-in's modality from specgen/assets/<modality>/ (each shipped config
    agrees)."""
    from specgen.builtins import ASSETS, BUILTINS

    for b in BUILTINS.values():
        shipped = ASSETS / b.asset / "config.json"
        want = json.loads(shipped.read_text()).get("modality", "text") if b.asset and shipped.is_file() else "text"
        assert checkpoints.modality_of(b.name) == checkpoints.modality_of(f"{b.kind}/{b.name}") == want, b.name
    assert not (registry.checkpoints_dir()).exists()  # nothing materialised
