"""Benchmark run folders: shards (--shard, torchrun) merge into the single-process rows, runs resume after a kill,
and bad run folders, shard specs and --out files are one line each."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specgen.eval.run_dir import LAUNCHER_POLL_S
from tests.cli.test_cli_image import tiny_image  # noqa: F401
from tests.cli.test_cli_text import invoke, tiny_target  # noqa: F401
from tests.models.test_quantized_cli import long_tiny_target  # noqa: F401


def bench(limit: int = 5, tokens: int = 8, batch: str = "1,2", *extra: str) -> list[str]:
    """`budget=fixed`: n-gram's default `auto` sizes drafts by measured step times, so its TPF differs per process."""
    return ["benchmark", "--suite", "humaneval", "--model", "tiny-long", "--methods", "ar,ngram,jacobi", "--limit",
            str(limit), "--max-new-tokens", str(tokens), "--batch-size", batch, "warmup=false",
            "options.ngram.budget=fixed", *extra]


ARGS = bench()
# columns that do not depend on timing: a merged run must reproduce them exactly
EXACT = ["method", "batch_size", "model", "lossless", "prompts", "new_tokens", "tpf", "tau", "nfe", "exact_match_vs_ar",
         "exact_match_vs_own_ar", "exact_match_vs_ar_b1", "nll_base", "pass_at_1"]


def exact(rows: list[dict]) -> list[dict]:
    return [{k: r.get(k) for k in EXACT} for r in rows]


def rows_of(result) -> list[dict]:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def records(run: Path) -> list[str]:
    """Item keys of every complete record line in the run folder (duplicates kept, to count them)."""
    keys = []
    for f in sorted(run.glob("records-*.jsonl")):
        for line in f.read_text().splitlines(keepends=True):
            if line.endswith("\n"):
                keys.append(json.loads(line)["item"])
    return keys


@pytest.fixture
def single(long_tiny_target):  # noqa: F811
    return rows_of(invoke(*ARGS, "--format", "json"))


def test_two_shards_merge_into_the_single_process_rows(long_tiny_target, tmp_path):  # noqa: F811
    args = bench(3)  # 3 prompts: both shards still get batch-1 and batch-2 items
    single = rows_of(invoke(*args, "--format", "json"))
    run = tmp_path / "run"
    first = invoke(*args, "--run-dir", run, "--shard", "0/2", "--format", "json")
    assert first.exit_code == 0 and first.stdout == "" and "shard 0/2 is done" in first.stderr, first.output
    merged = rows_of(invoke(*args, "--run-dir", run, "--shard", "1/2", "--format", "json"))  # the last shard merges
    assert exact(merged) == exact(single)
    assert sorted(records(run)) == sorted(set(records(run)))  # every item once
    copy = tmp_path / "copied"  # a folder copied from a cluster reports the same rows
    os.system(f"cp -r {run} {copy}")
    assert rows_of(invoke("benchmark", "report", str(copy), "--format", "json")) == merged
    table = invoke("benchmark", "report", str(copy))
    assert table.exit_code == 0 and "batched" in table.stdout and "ngram" in table.stdout


@pytest.mark.slow
def test_torchrun_two_gloo_ranks_give_the_single_process_rows(single, tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "cli.main",
           *map(str, ARGS), "--run-dir", str(run), "--format", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert exact(json.loads(done.stdout)) == exact(single)  # rank 0 alone prints, after every rank is done
    assert {f.name for f in run.glob("records-*")} == {"records-0-of-2.jsonl", "records-1-of-2.jsonl"}


@pytest.mark.slow
def test_a_torn_record_is_redone_and_every_item_counts_once(single, tmp_path):
    run = tmp_path / "run"
    assert invoke(*ARGS, "--run-dir", run, "--shard", "0/2").exit_code == 0
    file = run / "records-0-of-2.jsonl"
    lines = file.read_text().splitlines(keepends=True)
    assert len(lines) == 3 + 3  # prompts 0, 2, 4 at batch 1; ar, ngram, jacobi at batch 2
    file.write_text(lines[0] + lines[1][: len(lines[1]) // 2])  # killed while writing the second record
    r = invoke(*ARGS, "--run-dir", run, "--shard", "1/2")
    assert r.exit_code == 0 and "items have no record yet" in r.stderr
    report = invoke("benchmark", "report", str(run))
    assert report.exit_code == 2 and "the run is not finished: 11 of its items" in report.output  # 2 prompts + 3 rows x 3 prompts
    merged = rows_of(invoke(*ARGS, "--run-dir", run, "--shard", "0/2", "--format", "json"))  # resume
    assert exact(merged) == exact(single)
    assert sorted(records(run)) == sorted(set(records(run))) and len(records(run)) == 5 + 2 * 3
    assert file.read_text().endswith("\n")


def test_a_record_line_nested_past_the_recursion_limit_is_skipped_as_corrupt(tmp_path):
    """read_lines skips a corrupt line; one nested deeper than Python's recursion limit raised json's RecursionError,
    so resuming or reporting the run failed (one 'RecursionError' line, exit 1) instead of redoing its item."""
    from specgen.errors import UsageError
    from specgen.eval.run_dir import RunDir
    from specgen.shard import Shard

    run = RunDir.open(tmp_path / "run", "text", {"a": 1})
    run.append(Shard(), {"item": "i0", "runs": {}})
    with open(tmp_path / "run" / "records-0-of-1.jsonl", "a") as f:
        f.write("[" * 100_000 + "]" * 100_000 + "\n")
    run.append(Shard(), {"item": "i1", "runs": {}})
    with pytest.warns(UserWarning, match="records-0-of-1.jsonl line 2 is no record of this run: it is not JSON"):
        assert sorted(run.records()) == ["i0", "i1"]
    (tmp_path / "run" / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UsageError, match=r"run.json is unreadable \(RecursionError\)"):
        RunDir.existing(tmp_path / "run")


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """Where the first test asking for a `finished` run measures it; the others copy it."""
    return tmp_path_factory.mktemp("measured") / "run"


FINISHED = bench(3, 8, "1,2", "execute=false")  # records: prompts 0, 1, 2 at batch 1, then ar, ngram, jacobi at B 2


@pytest.fixture
def finished(measured, request, tmp_path) -> Path:
    """A copy of a finished run folder of FINISHED."""
    if not measured.exists():
        request.getfixturevalue("long_tiny_target")
        assert invoke(*FINISHED, "--run-dir", measured).exit_code == 0
    shutil.copytree(measured, tmp_path / "run")
    return tmp_path / "run"


def edit_line(run: Path, line: int, edit) -> Path:
    """Line `line` (from 0) of the run's records file edited (`edit` changes its record) or replaced (a str)."""
    file = run / "records-0-of-1.jsonl"
    lines = file.read_text().splitlines(keepends=True)
    if isinstance(edit, str):
        lines[line] = edit + "\n"
    else:
        rec = json.loads(lines[line])
        edit(rec)
        lines[line] = json.dumps(rec) + "\n"
    file.write_text("".join(lines))
    return file


# (line, edit, why the line is no record): a record no summary can read, edited or another run's
UNREADABLE = {
    "another config's (a row fewer)": (0, lambda r: r["runs"].pop("jacobi"), "its runs lack row 'jacobi'"),
    "runs a list at batch 1": (1, lambda r: r.update(runs=[]), "its runs are a list, not an object of Runs"),
    "a run without a field": (0, lambda r: r["runs"]["ar"].pop("tokens"), "runs.ar lacks 'tokens'"),
    "a run with a field no run has": (0, lambda r: r["runs"]["ar"].update(bogus=1), "runs.ar has 'bogus', no field"),
    "a string for a list": (0, lambda r: r["runs"]["ngram"].update(tokens="abc"),
                            "runs.ngram.tokens is a string, not list[int]"),
    "a string in a list": (2, lambda r: r["runs"]["ar"]["tokens"].insert(1, "x"),
                           "runs.ar.tokens[1] is a string, not int"),
    "null for a number": (0, lambda r: r["runs"]["ar"].update(forwards=None), "runs.ar.forwards is null, not int"),
    "a boolean for a number": (0, lambda r: r["runs"]["ar"].update(steps=True), "runs.ar.steps is a boolean, not int"),
    "a number for a string": (0, lambda r: r["runs"]["ar"].update(shard=0), "runs.ar.shard is an integer, not str"),
    "a list for a run": (0, lambda r: r["runs"].update(ar=[1, 2]), "runs.ar is a list, not Run"),
    "another suite's run": (0, lambda r: r["runs"].update(ar={"tokens": [1], "stats": {}, "shard": "0-of-1"}),
                            "runs.ar has 'stats', no field of Run"),
    "batched without indices": (3, lambda r: r.pop("indices"), "it lacks 'indices'"),
    "batched without wall": (4, lambda r: r.pop("wall"), "it lacks 'wall'"),
    "batched wall a string": (5, lambda r: r.update(wall="1s"), "wall is a string, not float"),
    "batched runs an object": (3, lambda r: r.update(runs={}), "runs is an object, not list[Run]"),
    "batched runs fewer than indices": (3, lambda r: r["runs"].pop(), "it has 2 runs for 3 indices"),
    "batched run without a number": (4, lambda r: r["runs"][1].update(seconds=None),
                                     "runs[1].seconds is null, not float"),
    "a zero time": (0, lambda r: r["runs"]["ar"].update(seconds=0), "runs.ar.seconds is 0, not > 0"),
    "a negative time": (1, lambda r: r["runs"]["jacobi"].update(seconds=-0.5), "runs.jacobi.seconds is -0.5, not > 0"),
    "batched wall zero": (5, lambda r: r.update(wall=0.0), "wall is 0.0, not > 0"),
    "JSON of another shape": (0, "[1, 2]", "it is JSON without an item and its runs"),
    "a table row, not a record": (3, '{"method": "ar", "tokens_per_s": 3.0}',
                                  "it is JSON without an item and its runs"),
    "not JSON": (0, "{garbage", "it is not JSON"),
}


@pytest.mark.parametrize("line, edit, why", UNREADABLE.values(), ids=UNREADABLE)
def test_a_record_no_summary_can_read_is_named_in_the_one_line_of_a_report(finished, line, edit, why):
    """A record line with its item and runs was taken as read: one a summary could not read (edited, another
    config's: its runs lack a row) failed `benchmark report` with 'error: KeyError: 'jacobi'', exit 1, or reported
    its wrong numbers. It is no record, as a torn or foreign line is: its item is missing, named in one line."""
    file = edit_line(finished, line, edit)
    r = invoke("benchmark", "report", str(finished))
    assert r.exit_code == 2 and r.stdout == "" and len(r.output.strip().splitlines()) == 1, r.output
    assert "error: the run is not finished: " in r.output
    assert f"; {file} line {line + 1} is no record of this run: {why}" in r.output


def test_a_resume_measures_again_the_item_of_a_record_no_summary_can_read(finished, long_tiny_target):  # noqa: F811
    before = rows_of(invoke("benchmark", "report", str(finished), "--format", "json"))
    file = edit_line(finished, 0, lambda r: r["runs"].pop("jacobi"))
    r = invoke(*FINISHED, "--run-dir", finished, "--format", "json")  # the run's command again
    assert r.exit_code == 0 and exact(json.loads(r.stdout)) == exact(before), r.output
    assert r.stderr.splitlines() == [f"warning: UserWarning: {file} line 1 is no record of this run: its runs lack "
                                     "row 'jacobi' (another config's record?) (skipped: a run of the folder measures "
                                     "its item again)"]
    assert records(finished).count("b1/p0") == 2  # the unreadable line stays; the item counts once
    assert exact(rows_of(invoke("benchmark", "report", str(finished), "--format", "json"))) == exact(before)


# an edit of the finished run's run.json, and what the one error line says of it
RUN_FILES = {
    "a list for the suite": (lambda d: d.update(suite=["humaneval"]), "run.json is not a specgen run file of format 1"),
    "no suite": (lambda d: d.pop("suite"), "run.json is not a specgen run file of format 1"),
    "a list for the plan": (lambda d: d.update(resolved=[]), "run.json is not a specgen run file of format 1"),
    "a plan without prompts": (lambda d: d["resolved"].pop("prompts"),
                               "run.json is not a specgen run file: its resolved plan: it lacks 'prompts'"),
    "a number for a row": (lambda d: d["resolved"]["rows"].update({"1": 5}),
                           "its resolved plan: rows.1 is an integer, not tuple[str, str, bool]"),
    "a row of two": (lambda d: d["resolved"]["rows"].update({"1": ["ngram", "tiny-long"]}),
                     "its resolved plan: rows.1 has 2 values, not the 3 of tuple[str, str, bool]"),
    "a prompt missing": (lambda d: d["resolved"]["prompts"].pop("1"),
                         "its resolved plan: prompts is not numbered 0 to 1"),
}


@pytest.mark.parametrize("edit, why", RUN_FILES.values(), ids=RUN_FILES)
def test_a_run_file_no_report_can_read_is_one_line(finished, edit, why):
    """A run.json of the right format with a suite of another type, or a resolved plan of another shape, failed
    `benchmark report` with 'TypeError: unhashable type', 'KeyError: 'prompts'' and the like, exit 1."""
    doc = json.loads((finished / "run.json").read_text())
    edit(doc)
    (finished / "run.json").write_text(json.dumps(doc))
    r = invoke("benchmark", "report", str(finished))
    assert r.exit_code == 2 and r.stdout == "" and len(r.output.strip().splitlines()) == 1, r.output
    assert why in r.output


# an edit of the finished run's machine file, and what the one error line says of it
MACHINE_FILES = {
    "a string for the cost curve": (lambda d: d.update(cost="x"), "cost is a string, not list[float]"),
    "a string in the cost rows": (lambda d: d["cost_rows"].insert(0, "1"), "cost_rows[0] is a string, not int"),
    "a number for the label": (lambda d: d.update(machine=5), "machine is an integer, not str"),
    "a list of skipped rows": (lambda d: d.update(skipped=["llamacpp"]), "skipped is a list, not dict[str, str]"),
    "a string for a capture count": (lambda d: d.update(timed_captures={"ar": "2"}),
                                     "timed_captures.ar is a string, not int"),
    "null for the bandwidth": (lambda d: d.update(bandwidth_gbs=None), "bandwidth_gbs is null, not float"),
}


@pytest.mark.parametrize("edit, why", MACHINE_FILES.values(), ids=MACHINE_FILES)
def test_a_machine_file_no_report_can_read_is_one_line(finished, edit, why):
    """A machine file with a cost curve, label, skipped rows or counts of another type failed `benchmark report` with
    a TypeError, exit 1; as a run.json of another shape, it is refused in one line naming the file."""
    file = finished / "machine-0-of-1.json"
    doc = json.loads(file.read_text())
    edit(doc)
    file.write_text(json.dumps(doc))
    r = invoke("benchmark", "report", str(finished))
    assert r.exit_code == 2 and r.stdout == "" and len(r.output.strip().splitlines()) == 1, r.output
    assert f"{file} is not a specgen machine file: {why}" in r.output


def test_a_finished_shards_torn_machine_file_is_written_again_by_a_rerun(finished, long_tiny_target):  # noqa: F811
    """A finished shard measured nothing and loaded nothing on a rerun, so a torn (or removed) machine file stayed
    so: its cost curve and labels were gone from every report. A rerun now writes it again, measuring no item."""
    file = finished / "machine-0-of-1.json"
    whole = json.loads(file.read_text())
    file.write_text("{torn")
    count = len(records(finished))
    r = invoke(*FINISHED, "--run-dir", finished, "--format", "json")
    assert r.exit_code == 0 and rows_of(r), r.output
    assert json.loads(file.read_text()).keys() == whole.keys() and len(records(finished)) == count  # nothing redone


def test_a_record_write_the_device_refuses_names_the_records_file(tmp_path, monkeypatch):
    """On a run folder's device filling mid-run the error was 'No space left on device' naming no file (os.write's
    OSError has none), and a short write (the device's last bytes) went unnoticed: the next record was appended onto
    the torn line. The rest of a short write is written (its failure is the device's error), naming the file."""
    import errno

    from specgen.eval import run_dir
    from specgen.eval.run_dir import RunDir
    from specgen.shard import Shard

    run = RunDir.open(tmp_path / "run", "text", {"a": 1})
    run.append(Shard(), {"item": "i0", "runs": {}})
    real, room = os.write, [40]

    def nearly_full(fd, data):  # 40 bytes fit, then the device is full
        if not room[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real(fd, bytes(data[: room[0]]))
        room[0] -= n
        return n

    monkeypatch.setattr(run_dir.os, "write", nearly_full)
    with pytest.raises(OSError, match="No space left on device") as e:
        run.append(Shard(), {"item": "i1", "runs": {"ar": "x" * 100}})
    assert e.value.filename == str(tmp_path / "run" / "records-0-of-1.jsonl")
    assert sorted(run.records()) == ["i0"]


@pytest.mark.slow
def test_a_killed_run_resumes_where_it_stopped(long_tiny_target, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "cli.main", *bench(12, 24, "1", "execute=false"), "--run-dir", str(run)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=Path(__file__).parents[2])
    deadline = time.time() + 120
    while not records(run) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    before = records(run)
    assert 1 <= len(before) < 12
    done = subprocess.run(cmd + ["--format", "json"], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(records(run)) == sorted(f"b1/p{i}" for i in range(12))  # every item exactly once
    assert records(run)[: len(before)] == before  # finished items were kept, not redone
    assert [r["prompts"] for r in json.loads(done.stdout)] == [12, 12, 12]


@pytest.mark.parametrize("extra, needle", [
    (["--shard", "3/2"], "0 <= I < N"),
    (["--shard", "x"], "--shard takes I/N"),
    (["--shard", "0/2"], "needs --run-dir"),
    (["--append"], "--append adds rows to the --out file"),
])
def test_bad_shard_options_are_one_line(long_tiny_target, extra, needle):  # noqa: F811
    r = invoke(*ARGS, *extra)
    assert r.exit_code == 2 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output


@pytest.mark.parametrize("text", ["1 /2", " 1/2", "+1/2", "\u0661/\u0662", "1/2/3", "1/"])
def test_a_shard_is_ascii_digits_only(text):
    """int() also reads spaces, signs and other scripts' digits: '1 /2' and '\u0661/\u0662' were shard 1 of 2."""
    from specgen.errors import UsageError
    from specgen.shard import Shard, parse_shard

    assert parse_shard("1/2") == Shard(1, 2)
    with pytest.raises(UsageError, match="--shard takes I/N"):
        parse_shard(text)


def test_a_changed_config_or_another_folder_is_refused(long_tiny_target, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    assert invoke(*ARGS, "--run-dir", run, "--shard", "0/2", "execute=false").exit_code == 0
    r = invoke(*bench(6), "--run-dir", run, "--shard", "1/2", "execute=false")
    assert r.exit_code == 2 and "another config: --limit (5 -> 6)" in r.output and len(r.output.splitlines()) == 1
    assert sorted(p.name for p in run.iterdir()) == ["machine-0-of-2.json", "records-0-of-2.jsonl", "run.json",
                                                    "shard-0-of-2.lock"]
    doc = json.loads((run / "run.json").read_text())
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "run.json").write_text(json.dumps({**doc, "suite": "images"}))
    r = invoke(*ARGS, "--run-dir", tmp_path / "images")
    assert r.exit_code == 2 and "holds a images run, not humaneval" in r.output
    for folder, needle in [(tmp_path, "not a benchmark run folder"), (run, "not finished")]:
        r = invoke("benchmark", "report", str(folder))
        assert r.exit_code == 2 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "run.json").write_text("{not json")
    r = invoke("benchmark", "report", str(tmp_path / "bad"))
    assert r.exit_code == 2 and "unreadable" in r.output
    r = invoke("benchmark", "report")
    assert r.exit_code == 2 and "usage: specgen benchmark report RUN_DIR" in r.output


def test_out_never_replaces_a_file_and_append_adds(long_tiny_target, tmp_path):  # noqa: F811
    out = tmp_path / "rows.jsonl"
    out.write_text("kept\n")
    args = bench(1, 8, "1", "execute=false")
    r = invoke(*args, "--out", out)
    assert r.exit_code == 2 and "already exists" in r.output and out.read_text() == "kept\n"
    assert invoke(*args, "--out", out, "--append").exit_code == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "kept" and [json.loads(x)["method"] for x in lines[1:]] == ["ar", "ngram", "jacobi"]


IMAGES = ["benchmark", "--suite", "images", "--model", "t-gpt", "--limit", "3", "methods=[ar,adt-tree,lantern]",
          "temperatures=[0.0,1.0]", "batch_sizes=[1,2]", "classifier=tiny-image-classifier"]
IMAGE_EXACT = ["method", "temperature", "lossless", "images", "tau", "d_bar", "nfe", "tpf", "exact_match_vs_ar", "nll",
               "clf_fid", "class_accuracy", "classes"]


@pytest.mark.slow
def test_image_shards_and_torchrun_ranks_give_the_single_process_rows(tiny_image, tmp_path):  # noqa: F811
    pick = lambda rows: [{k: r.get(k) for k in IMAGE_EXACT} for r in rows]  # noqa: E731
    single = rows_of(invoke(*IMAGES, f"out_dir={tmp_path / 'one'}", "--format", "json"))
    assert single[0]["clf_fid"] is not None and len(single) == 12  # 3 methods x 2 temperatures x 2 batch sizes
    run = tmp_path / "run"
    assert invoke(*IMAGES, f"out_dir={tmp_path / 'two'}", "--run-dir", run, "--shard", "1/2").exit_code == 0
    merged = rows_of(invoke(*IMAGES, f"out_dir={tmp_path / 'two'}", "--run-dir", run, "--shard", "0/2",
                            "--format", "json"))
    assert pick(merged) == pick(single)
    assert (tmp_path / "two" / "adt-tree@b2-T1-grid.png").is_file()
    assert pick(rows_of(invoke("benchmark", "report", str(run), "--format", "json"))) == pick(single)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "cli.main", *IMAGES,
           f"out_dir={tmp_path / 'three'}", "--run-dir", str(tmp_path / "ranks"), "--format", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert pick(json.loads(done.stdout)) == pick(single)


@pytest.mark.slow
def test_mesh_shards_give_the_single_process_rows(tmp_path):
    args = ["benchmark", "--suite", "meshes", "--limit", "3", "--max-new-tokens", "120", "rows=[ar,ca+lora]",
            "deltas=[0.3]", "topk_accept=[]", "tree_k=[]", "depths=[]", "batch_sizes=[1,2]", "--format", "json"]
    keep = ["row", "rule", "meshes", "scored", "cd", "hd", "valid_rate", "scr", "mean_tokens", "nfe", "cd_vs_ar"]
    pick = lambda rows: [{k: r.get(k) for k in keep} for r in rows]  # noqa: E731
    single = rows_of(invoke(*args))
    assert [r["row"] for r in single] == ["ar", "ca+lora", "ca+lora p>0.3", "ar@b2", "ca+lora@b2", "ca+lora p>0.3@b2"]
    run = tmp_path / "run"
    assert invoke(*args, "--run-dir", run, "--shard", "0/2").stdout == ""
    assert pick(rows_of(invoke(*args, "--run-dir", run, "--shard", "1/2"))) == pick(single)
    assert pick(rows_of(invoke("benchmark", "report", str(run), "--format", "json"))) == pick(single)


def gone(pid: int) -> bool:
    """Whether process `pid` ended (a zombie too: an orphan's new parent may not have reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    def parent(stat: Path) -> int:
        try:
            return int(stat.read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError):
            return 0
    return [int(stat.parent.name) for stat in Path("/proc").glob("[0-9]*/stat") if parent(stat) == pid]


def exit_within(pids: list[int], seconds: float) -> list[int]:
    """Those of `pids` still running after `seconds` (polled: a liveness check, not a measure of speed)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(map(gone, pids)):
        time.sleep(0.2)
    return [p for p in pids if not gone(p)]


RANK = """
import os, sys
from pathlib import Path
from cli.benchmark_runs import merged_rows
from specgen.eval.run_dir import LauncherGone, RunDir
from specgen.shard import Shard
sink = RunDir.open(Path(sys.argv[1]), "humaneval", {})
print("waiting", flush=True)
try:
    merged_rows(sink, lambda s: [], Shard(1, 2), os.getppid(), False)
except LauncherGone as e:
    print(e, flush=True)
"""


def test_a_rank_waiting_for_the_others_exits_when_its_launcher_is_killed(tmp_path):
    """A launcher rank done with its items waits for the others (gloo, timeout a week); the rendezvous needs the
    launcher (torchrun's agent holds the store), so with the launcher SIGKILLed alone (it cannot stop its ranks) the
    rank waited out the week. Here the rank (RANK 1 of 2) waits on a rendezvous port nothing listens on, as when the
    store died with the launcher; its launcher, a stand-in for torchrun, is killed: the rank says so and ends."""
    import socket

    with socket.socket() as sock:  # a free port: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "rank.out"
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    start = (f"import subprocess, sys, time; rank = subprocess.Popen([sys.executable, '-c', {RANK!r}, "
             f"{str(tmp_path / 'run')!r}], stdout=open({str(out)!r}, 'w'), stderr=subprocess.STDOUT); "
             "print(rank.pid, flush=True); time.sleep(600)")
    launcher = subprocess.Popen([sys.executable, "-c", start], stdout=subprocess.PIPE, text=True, env=env,
                                cwd=Path(__file__).parents[2])
    try:
        rank = int(launcher.stdout.readline())
        deadline = time.monotonic() + 120
        while "waiting" not in out.read_text() and not gone(rank) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2 * LAUNCHER_POLL_S)  # the rank waits, looking for its launcher
        assert not gone(rank), out.read_text()
    finally:
        launcher.kill()
        launcher.wait()
    left = exit_within([rank], 60)
    if left:
        os.kill(rank, signal.SIGKILL)
    assert not left, "the rank still waits 60 s after its launcher died"
    assert out.read_text().splitlines()[-1] == (
        f"the launcher that started this rank (pid {launcher.pid}) died before every rank was done; the items measured "
        f"are recorded in {tmp_path / 'run'}: rerun the same command to measure the rest (items with a record are "
        "skipped) and print the table")


@pytest.mark.slow
def test_torchrun_ranks_end_when_the_launcher_alone_is_killed(long_tiny_target, tmp_path):  # noqa: F811
    """torchrun SIGKILLed alone (its ranks go on): rank 0, whose items were recorded, waits for rank 1, which still
    measures. Each says in its one line that the launcher died, once done (rank 1's records are complete), and
    rerunning the same command prints the table from the records."""
    run = tmp_path / "run"
    args = [*map(str, bench(24, 64, "1")), "execute=false", "--run-dir", str(run), "--format", "json"]
    assert invoke(*args, "--shard", "0/2").exit_code == 0  # rank 0's items: it only waits
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "cli.main", *args]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                cwd=Path(__file__).parents[2])
    rank1 = run / "records-1-of-2.jsonl"
    deadline = time.monotonic() + 120
    while not (rank1.is_file() and rank1.read_text()) and time.monotonic() < deadline and launcher.poll() is None:
        time.sleep(0.1)
    ranks = children(launcher.pid)
    launcher.kill()  # SIGKILL: it cannot stop its ranks
    launcher.wait()
    assert len(ranks) == 2 and len(rank1.read_text().splitlines()) < 12, launcher.stderr.read()[-2000:]
    left = exit_within(ranks, 60)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "ranks still wait 60 s after their launcher died"
    err = launcher.stderr.read()  # (the ranks wrote into the launcher's pipe; all of them are gone)
    assert err.count(f"error: the launcher that started this rank (pid {launcher.pid}) died before every rank was "
                     "done") == 2, err[-2000:]
    assert len(rank1.read_text().splitlines()) == 12  # the measuring rank finished its items first
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0 and [r["prompts"] for r in json.loads(done.stdout)] == [24] * 3, done.stderr[-2000:]


def test_launcher_ranks_each_take_their_own_gpu(monkeypatch):
    """Under torchrun a bare `cuda` (or `auto` on a GPU node) is this rank's local GPU, so ranks do not share GPU 0."""
    import torch

    from cli import benchmark_runs

    monkeypatch.setattr("specgen.devices.device_name", lambda d: "cpu" if d == "cpu" else "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert benchmark_runs.process_device("auto") == "cuda:2" and benchmark_runs.process_device("cpu") == "cpu"
    monkeypatch.delenv("LOCAL_RANK")
    assert benchmark_runs.process_device("auto") == "cuda"  # one process: torch's current GPU


def test_launcher_ranks_without_a_rendezvous_are_refused_up_front(long_tiny_target, tmp_path,  # noqa: F811
                                                                  monkeypatch):
    """RANK/WORLD_SIZE set by hand (no torchrun: no MASTER_ADDR/MASTER_PORT) measured the whole shard, then failed
    at the final barrier ('ValueError: ... MASTER_ADDR expected'), exit 1, on every rerun."""
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    r = invoke(*ARGS, "--run-dir", tmp_path / "run")
    assert r.exit_code == 2 and "MASTER_ADDR" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "run").exists()


def test_a_gpu_nodes_run_reports_on_a_cpu_machine(long_tiny_target, tmp_path):  # noqa: F811
    """report checked the recorded config against this machine: a run measured with device cuda (every
    recipes/full recipe) or more threads than here failed 'device 'cuda': no CUDA GPU is available ... use --device
    cpu', an option report refuses; slurm-benchmark.sh's report job, which asks for no GPU, failed on every recipe."""
    run = tmp_path / "run"
    rows = rows_of(invoke(*bench(2, 8, "1"), "execute=false", "--run-dir", run, "--format", "json"))
    doc = json.loads((run / "run.json").read_text())
    doc["config"].update(device="cuda", threads=len(os.sched_getaffinity(0)) + 8)  # the node's
    (run / "run.json").write_text(json.dumps(doc))
    assert rows_of(invoke("benchmark", "report", str(run), "--format", "json")) == rows


def test_of_shards_that_finish_at_once_one_prints_the_table(tmp_path, capsys):
    """Two array tasks finishing together both found every record and both printed (and wrote --out: the second
    failed on the file the first had just made, blocking a Slurm `afterok` report): one prints, the other says who."""
    from cli.benchmark_runs import merged_rows
    from specgen.eval.run_dir import RunDir
    from specgen.shard import Shard

    sink, rows = RunDir.open(tmp_path / "run", "humaneval", {"limit": 2}), [{"method": "ar"}]
    assert merged_rows(sink, lambda s: rows, Shard(1, 2), None, False) == rows
    assert merged_rows(sink, lambda s: rows, Shard(0, 2), None, False) is None
    assert "the table was printed by shard 1/2" in capsys.readouterr().err
    assert merged_rows(sink, lambda s: rows, Shard(0, 1), None, False) == rows  # one shard: every rerun prints
