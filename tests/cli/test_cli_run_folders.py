"""Issue 23: resumable commands refuse a changed config up front (naming the keys, touching nothing), failed fresh
runs leave no folder, outputs never replace earlier files, warnings never precede the error line."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from tests.pcllm_fixtures import save_tiny_text

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line(r, code, needle):
    assert r.exit_code == code, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr


def recorded(cls, **over) -> dict:
    return dataclasses.asdict(cls(**over))


def resumable():
    from specgen.text.trajectories import CollectConfig
    from specgen.train.distill import DistillConfig
    from specgen.train.eagle import EagleTrainConfig
    from specgen.train.heads import HeadsTrainConfig
    from specgen.train.upsampler import UpsamplerTrainConfig

    return [
        ("distill", ["--trajectories", "t", "--model", "tiny-text", "lora_rank=8"], "config.json",
         recorded(DistillConfig, trajectories="t", model="tiny-text", lora_rank=4), "lora_rank=4, now 8"),
        ("train-heads", ["head_kind=mlp"], "config.json", recorded(HeadsTrainConfig), "head_kind='ca', now 'mlp'"),
        ("train-heads", ["--kind", "eagle", "feature_weight=2.0"], "config.json", recorded(EagleTrainConfig),
         "feature_weight=1.0, now 2.0"),
        ("train-upsampler", ["blocks=3"], "config.json", recorded(UpsamplerTrainConfig), "blocks=2, now 3"),
        ("collect-trajectories", ["--model", "tiny-text", "--block-size", "5"], "trajectories.json",
         {"config": recorded(CollectConfig, model="tiny-text", block_size=4)}, "block_size=4, now 5"),
    ]


@pytest.mark.parametrize("case", range(5))
def test_changed_config_is_refused_before_anything_is_touched(tmp_path, case):
    cmd, args, record, old, needle = resumable()[case]
    out = tmp_path / "run"
    out.mkdir()
    (out / record).write_text(json.dumps(old))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    one_line(invoke(cmd, "--out", out, *args), 2, needle)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # config.json is not rewritten


def test_budget_and_naming_keys_may_change_on_resume(tmp_path):
    from specgen.train.distill import RESUME_LOOSE, DistillConfig
    from specgen.train.run_folder import check_resume

    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(recorded(DistillConfig, steps=10)))
    assert check_resume(out, recorded(DistillConfig, steps=20, name="x"), loose=RESUME_LOOSE) is True
    assert check_resume(tmp_path / "fresh", recorded(DistillConfig)) is False
    (out / "config.json").write_text("{broken")
    with pytest.raises(Exception, match="unreadable"):
        check_resume(out, recorded(DistillConfig))


def test_another_ranks_record_write_in_flight_is_no_other_programs_file(tmp_path):
    """A data-parallel run's ranks all check OUT: one may see only another's atomic temporary of config.json (the
    race that failed `torchrun --nproc-per-node 2 ... distill` once with exit 2); control: a file of another program
    is still refused."""
    from specgen.errors import UsageError
    from specgen.paths import atomic_write
    from specgen.train.distill import DistillConfig
    from specgen.train.run_folder import check_resume

    out = tmp_path / "run"
    out.mkdir()
    seen = []

    def midway(tmp):  # the moment the other rank looks: only the temporary is there
        seen.append(check_resume(out, recorded(DistillConfig)))
        tmp.write_text("{}")

    atomic_write(out / "config.json", midway)
    assert seen == [False]
    (out / "config.json").unlink()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="holds other files"):
        check_resume(out, recorded(DistillConfig))


@pytest.mark.parametrize("args,code", [
    (["distill", "--trajectories", "EMPTY", "--model", "tiny-text"], 2),
    (["train-heads", "--kind", "eagle", "target=no-such-target"], 2),
    (["train-heads", "target=no-such-target", "num_sequences=2", "eval_sequences=1"], 2),
    (["train-upsampler", "vq=no-such-vq"], 2),
    (["collect-trajectories", "--model", "no-such-target"], 2),
])
@pytest.mark.parametrize("made", [False, True], ids=["new", "made-empty"])
def test_failed_fresh_runs_leave_no_folder(tmp_path, args, code, made):
    """A failed fresh run leaves --out as it found it: absent, or an empty folder the user made (where its record
    once stayed, and the corrected rerun was refused as a run with a different config)."""
    save_tiny_text()
    (tmp_path / "empty").mkdir()
    out = tmp_path / "run"
    if made:
        out.mkdir()
    r = invoke(args[0], "--out", out, *[str(tmp_path / "empty") if a == "EMPTY" else a for a in args[1:]])
    assert r.exit_code == code, r.output
    assert len([x for x in r.stderr.splitlines() if x.strip()]) == 1, r.stderr
    assert (list(out.iterdir()) == []) if made else not out.exists()


def test_failed_resume_keeps_the_folder(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "train.log").write_text("an earlier run")
    r = invoke("train-upsampler", "--out", out, "vq=no-such-vq")
    assert r.exit_code == 2 and (out / "train.log").read_text().startswith("an earlier run")


@pytest.mark.parametrize("cmd", [["distill", "--trajectories", "t"], ["train-heads"], ["train-heads", "--kind",
                                 "eagle"], ["train-upsampler"], ["collect-trajectories"]], ids=lambda c: " ".join(c[:3]))
@pytest.mark.parametrize("foreign", [{"notes.txt": "mine"}, {"config.json": '{"model_type": "llama", "vocab": 3}'}])
def test_a_folder_of_other_files_is_never_written_into(tmp_path, cmd, foreign):
    out = tmp_path / "hf-model"
    out.mkdir()
    for name, text in foreign.items():
        (out / name).write_text(text)
    r = invoke(cmd[0], "--out", out, *cmd[1:])
    assert r.exit_code == 2 and "use an empty or new" in r.stderr, r.output
    assert {p.name: p.read_text() for p in out.iterdir()} == foreign


def test_pngs_never_replace_earlier_ones(tmp_path):
    from specgen.generate.image import PngWriter

    def run(pixels):
        writer = PngWriter(tmp_path, "ar", ["a", "b"])
        return [writer.add(j, j, pixels[j]) for j in range(2)] + [writer.grid()]

    pixels = torch.zeros(2, 3, 8, 8)
    first = run(pixels)
    stamp = {p: p.read_bytes() for p in first}
    second = run(pixels + 0.5)
    assert not set(first) & set(second) and len(list(tmp_path.glob("*.png"))) == 6
    assert {p: p.read_bytes() for p in first} == stamp
    assert [p.name for p in second] == ["ar-000-a-1.png", "ar-001-b-1.png", "ar-grid-1.png"]
    assert not list(tmp_path.glob("*.tmp"))


def test_png_writers_of_one_pid_never_share_a_temporary(tmp_path, monkeypatch):
    """Two processes of one pid (containers sharing the folder, specgen each one's pid 1) save the same name at once:
    each image lands whole in a file of its own and neither run fails."""
    from PIL import Image

    from specgen.generate.image import PngWriter

    real, saves, other = Image.Image.save, [], []

    def save(image, fp, *args, **kwargs):  # the other process saves while this one is between its write and its link
        real(image, fp, *args, **kwargs)
        saves.append(fp)
        if len(saves) == 1:
            other.append(PngWriter(tmp_path, "ar", ["a"]).add(0, 0, torch.ones(3, 8, 8)))

    monkeypatch.setattr(Image.Image, "save", save)
    mine = PngWriter(tmp_path, "ar", ["a"]).add(0, 0, -torch.ones(3, 8, 8))
    monkeypatch.undo()
    assert {p.name: Image.open(p).getpixel((0, 0)) for p in (mine, *other)} == {
        "ar-000-a.png": (255, 255, 255), "ar-000-a-1.png": (0, 0, 0)}
    assert not list(tmp_path.glob("*.tmp"))


def test_mesh_file_names_are_numbered(tmp_path):
    from specgen.paths import free_stem

    (tmp_path / "m.obj").write_text("x")
    assert free_stem(tmp_path, "m", (".obj", ".png")) == "m-1"
    (tmp_path / "m-1.png").write_text("x")  # a preview alone also takes the name
    assert free_stem(tmp_path, "m", (".obj", ".png")) == "m-2"
    assert free_stem(tmp_path, "n", (".obj",)) == "n"


def test_benchmark_rows_never_replace_a_file(tmp_path):
    from cli._output import write_rows
    from specgen.errors import RuntimeFailure

    out = tmp_path / "rows.jsonl"
    write_rows(out, [{"a": 1}])
    assert out.read_text() == '{"a": 1}\n'
    with pytest.raises(RuntimeFailure, match="meanwhile"):
        write_rows(out, [{"a": 2}])
    assert out.read_text() == '{"a": 1}\n' and [p.name for p in tmp_path.iterdir()] == ["rows.jsonl"]


def test_warnings_never_precede_the_error_line(capsys, monkeypatch):
    import typer

    from cli._errors import command
    from specgen.errors import UsageError

    monkeypatch.delenv("SPECGEN_DEBUG", raising=False)

    @command
    def failing():
        warnings.warn("TypedStorage is deprecated", UserWarning)
        raise UsageError("the real problem")

    @command
    def working():
        warnings.warn("pyarrow says hello", UserWarning)
        return 7

    with pytest.raises(typer.Exit):
        failing()
    assert capsys.readouterr().err == "error: the real problem\n"
    assert working() == 7
    assert capsys.readouterr().err == "warning: UserWarning: pyarrow says hello\n"


def test_image_benchmark_of_one_image_marks_fid_na():
    from specgen.decoding.stats import DecodeStats
    from specgen.eval.image_rows import Image, classifier_columns

    rows = [{"method": "ar", "temperature": 1.0}]
    one = Image([1], DecodeStats(), "0-of-1", features=[0.0, 1.0], correct=True)
    classifier_columns(rows, {("ar", 1.0): [one]}, [[0.0, 0.0], [1.0, 1.0]], None)
    assert rows[0]["clf_fid"] is None and "n/a" in rows[0]["quality_note"]
    assert rows[0]["class_accuracy"] == 1.0


@pytest.mark.slow
def test_one_image_benchmark_runs_and_keeps_earlier_grids(tmp_path):
    out = tmp_path / "bench"
    args = ["benchmark", "--suite", "images", "--limit", "1", "--format", "json", f"out_dir={out}", "methods=[ar]",
            "temperatures=[1.0]"]
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert rows[0]["clf_fid"] is None and rows[0]["class_accuracy"] is not None
    first = (out / "ar-T1-grid.png").read_bytes()
    assert invoke(*args).exit_code == 0
    assert (out / "ar-T1-grid.png").read_bytes() == first and (out / "ar-T1-grid-1.png").is_file()
    assert (out / "speed-quality-T1-1.png").is_file() and not list(out.glob(".*"))
