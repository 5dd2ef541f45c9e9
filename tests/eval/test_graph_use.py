"""What `specgen benchmark` records of captured steps: each model's `describe()` and the captures timed items made in
the machine file, one warning line for the latter, the warm-up rule; nothing new where no step is captured (a CPU).
Captured steps run on the CPU here as static steps (`graphs.attach(..., capture=False)`) or the replay emulation."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from specgen.eval.graph_use import WARM_RUNS, GraphUse, timed_note
from specgen.eval.run_dir import Grid, RunDir
from specgen.eval.text_rows import Run
from specgen.models import graphs
from specgen.shard import Shard
from tests.cli.test_cli_image import tiny_image  # noqa: F401 - the fixture
from tests.cli.test_cli_mesh import tiny  # noqa: F401 - the fixture
from tests.cli.test_cli_text import invoke, tiny_target  # noqa: F401 - the fixture
from tests.models.test_graphs import traced
from tests.pcllm_fixtures import write_prompts

BENCH = ["benchmark", "--suite", "text", "--model", "tiny-text", "--max-new-tokens", "8", "--format", "json",
         "--limit", "3", "nll=false"]


class Steps:
    """A StepGraphs as GraphUse reads it: `captures` made so far."""

    def __init__(self) -> None:
        self.captures = 0

    def describe(self) -> dict:
        return {"graphs": self.captures, "graph_mb": 0.0, "replays": 0, "eager_calls": 0, "captures": self.captures}


def use_of(tmp_path, models: dict, shard: Shard = Shard()) -> GraphUse:
    return GraphUse(models, RunDir.open(tmp_path / "run", "text", {}), shard)


def test_a_row_warms_until_a_run_captures_nothing(tmp_path):
    steps = Steps()
    made = {"a": [3, 1, 0, 9], "b": [0, 9], "c": [1] * 9}  # captures each run of a row makes
    runs = []

    def run(row: str, item: int) -> None:
        runs.append((row, item))
        steps.captures += made[row][sum(r == row for r, _ in runs) - 1]

    use_of(tmp_path, {"target": SimpleNamespace(graphs=steps)}).warm_up(["a", "b", "c"], range(10), run)
    assert runs == [("a", 0), ("a", 1), ("a", 2), ("b", 0), *(("c", i) for i in range(WARM_RUNS))]
    cpu = []  # no captured steps: one run a row (allocations, first-use work)
    use_of(tmp_path, {"target": SimpleNamespace(graphs=None)}).warm_up(["a", "b"], range(10),
                                                                      lambda r, i: cpu.append((r, i)))
    assert cpu == [("a", 0), ("b", 0)]


def test_one_warm_call_warms_rows_then_every_grids_batches_then_rows_again(tmp_path):
    """`GraphUse.warm`, the one call every suite makes: where steps are captured, the batched (B, row) pairs each
    grid has left run on the shard's first B items until they capture nothing, then the rows warm again; a CPU runs
    each row once and no batch."""
    steps, runs = Steps(), []

    def run(row: str, item: int) -> None:
        runs.append((row, item))
        steps.captures += runs.count((row, item)) == 1 and item == 0  # the first run of a row captures

    def batch(tag: str):
        def go(b: int, row: str, mine: list[int]) -> None:
            runs.append((tag, b, row, tuple(mine)))
            steps.captures += runs.count((tag, b, row, tuple(mine))) == 1
        return go

    grids = [(Grid(3, ("a", "b"), (1, 2), f"T{t}/i{{}}", f"T{t}/", run=Run), batch(f"T{t}")) for t in (0, 1)]
    use_of(tmp_path, {"target": SimpleNamespace(graphs=steps)}).warm(["a", "b"], range(3), run, grids)
    assert runs == [("a", 0), ("a", 1), ("b", 0), ("b", 1),
                    *((f"T{t}", 2, row, (0, 1)) for t in (0, 1) for row in "ab" for _ in range(2)),
                    ("a", 0), ("b", 0)]
    cpu = []
    use_of(tmp_path, {"target": SimpleNamespace(graphs=None)}).warm(["a", "b"], range(3),
                                                                    lambda r, i: cpu.append((r, i)), grids)
    assert cpu == [("a", 0), ("b", 0)] and len(runs) == 14  # no batch ran


def test_timed_captures_are_counted_kept_over_a_resume_and_summed_over_shards(tmp_path):
    steps = Steps()
    use = use_of(tmp_path, {"target": SimpleNamespace(graphs=steps), "drafter": None}, Shard(0, 2))
    use.write({"machine": "m"})
    written = []
    done = use.after_item(lambda: written.append(json.loads((tmp_path / "run" / "machine-0-of-2.json").read_text())))
    with use.timing("ar"):
        pass
    done()
    with use.timing("ngram@b2"):
        steps.captures += 2
    done()
    assert [w.get("timed_captures") for w in written] == [{}, {"ngram@b2": 2}]  # rewritten after the item's record
    assert written[1]["step_graphs"] == {"target": steps.describe()} and written[1]["machine"] == "m"
    again = use_of(tmp_path, {"target": SimpleNamespace(graphs=Steps())}, Shard(0, 2))  # a resumed shard
    with again.timing("ngram@b2"):
        again.models["target"].graphs.captures += 1
    assert again.facts()["timed_captures"] == {"ngram@b2": 3}
    assert timed_note({"0-of-2": {"timed_captures": {"ar": 1}}, "1-of-2": {}}) .startswith(
        "warning: timed items made 1 capture of decode steps (ar 1); their times include them")
    assert timed_note({"0-of-2": {"timed_captures": {"ar": 1, "x": 4}}, "1-of-2": {"timed_captures": {"ar": 4}}}
                      ).startswith("warning: timed items made 9 captures of decode steps (ar 5, x 4)")
    assert timed_note({"0-of-1": {"machine": "m"}}) == "" and use_of(tmp_path / "cpu", {}).facts() == {}


@pytest.fixture
def static_steps(monkeypatch, request):
    """Text models load with captured steps on the CPU: static ones, or through the replay emulation (`traced`)."""
    monkeypatch.setattr("specgen.text.target.attach", lambda module, mode: graphs.attach(module, "on", capture=False))
    if request.param == "traced":
        monkeypatch.setattr(graphs.StepGraphs, "captured", traced)
        monkeypatch.setattr("specgen.text.target.attach", lambda module, mode: graphs.attach(module, "on", True))


def machine_file(run) -> dict:
    return json.loads((run / "machine-0-of-1.json").read_text())


@pytest.mark.parametrize("static_steps", ["static", "traced"], indirect=True)
def test_a_run_records_its_steps_and_warns_once_of_timed_captures(static_steps, tiny_target, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    r = invoke(*BENCH, "--prompts", str(write_prompts(tmp_path)), "--methods", "ar,ngram", "--batch-size", "1,2",
               "warmup=false", "--run-dir", str(run))
    assert r.exit_code == 0, r.output
    info = machine_file(run)
    steps = info["step_graphs"]["tiny-text"]
    assert set(steps) == {"graphs", "graph_mb", "replays", "eager_calls", "captures"} and steps["captures"] > 0
    assert steps["replays"] > steps["captures"] and steps["graph_mb"] == 0.0  # no CUDA pool on the CPU
    timed = info["timed_captures"]
    # no warm-up, and no discarded run at batch 2: its timed items capture the two-row buckets
    assert timed and set(timed) <= {"ar", "ngram", "ar@b2", "ngram@b2"} and "ar@b2" in timed
    warning = [line for line in r.stderr.splitlines() if line.startswith("warning: timed items made")]
    assert len(warning) == 1 and f"made {sum(timed.values())} capture" in warning[0] and "ar@b2 " in warning[0]
    report = invoke("benchmark", "report", str(run), "--format", "json")
    assert report.exit_code == 0 and report.stderr.count("warning: timed items made") == 1, report.output


@pytest.mark.parametrize("static_steps", ["static"], indirect=True)
def test_the_warm_up_captures_what_the_timed_items_meet(static_steps, tiny_target, tmp_path):  # noqa: F811
    """Once the cost curve is stored (its measuring decodes, which capture too, are then not run), the timed items of
    a run without warm-up capture; with it, none does, batched rows included (their B-row buckets warmed first)."""
    args = [*BENCH, "--prompts", str(write_prompts(tmp_path)), "--methods", "ar,ngram,jacobi", "--batch-size", "1,2"]
    for name, warm in (("first", "false"), ("cold", "false"), ("warm", "true")):
        r = invoke(*args, f"warmup={warm}", "--run-dir", str(tmp_path / name))
        assert r.exit_code == 0, r.output
    cold, warm = machine_file(tmp_path / "cold"), machine_file(tmp_path / "warm")
    made = cold["step_graphs"]["tiny-text"]["captures"]
    assert cold["timed_captures"] and made == sum(cold["timed_captures"].values()) and "ar@b2" in cold["timed_captures"]
    assert warm["timed_captures"] == {} and warm["step_graphs"]["tiny-text"]["captures"] > 0


def test_a_cpu_run_records_nothing_new(tiny_target, tmp_path):  # noqa: F811
    r = invoke(*BENCH, "--prompts", str(write_prompts(tmp_path)), "--methods", "ar,ngram", "warmup=false",
               "--run-dir", str(tmp_path / "run"))
    assert r.exit_code == 0, r.output
    assert not {"step_graphs", "timed_captures"} & machine_file(tmp_path / "run").keys()
    assert "warning: timed items" not in r.stderr


def static_attach(module, mode: str = "auto"):
    return graphs.attach(module, "on", capture=False)


def test_image_and_mesh_runs_record_every_model_with_steps(tiny_image, tiny, tmp_path, monkeypatch):  # noqa: F811
    """Each model decoded with captured steps, targets and drafters or heads alike, has its facts in the machine file;
    their timed captures are counted by row."""
    monkeypatch.setattr("specgen.generate.image.attach", static_attach)
    monkeypatch.setattr("specgen.generate.mesh.attach", static_attach)
    r = invoke("benchmark", "--suite", "images", "--model", "t-gpt", "--limit", "1", "--format", "json", "out_dir=",
               "methods=[ar,adt-tree]", "temperatures=[0.0]", "quality=false", "--run-dir", str(tmp_path / "img"))
    assert r.exit_code == 0, r.output
    info = machine_file(tmp_path / "img")
    assert set(info["step_graphs"]) == {"target float32", "drafter float32"}
    assert all(g["captures"] > 0 for g in info["step_graphs"].values())
    assert set(info["timed_captures"]) <= {"ar", "adt-tree"}
    r = invoke("benchmark", "--suite", "meshes", "--model", "tiny-mesh", "--limit", "1", "--format", "json",
               "max_new_tokens=12", "num_heads=2", "heads={ca: tiny-heads}", "rows=[ar,ca]", "deltas=[]",
               "topk_accept=[]", "tree_k=[]", "depths=[]", "sweep_row=ca", "--run-dir", str(tmp_path / "mesh"))
    assert r.exit_code == 0, r.output
    info = machine_file(tmp_path / "mesh")
    assert set(info["step_graphs"]) == {"ar float32 backbone", "tiny-heads float32 backbone",
                                        "tiny-heads float32 heads"}
    assert all(g["captures"] > 0 for g in info["step_graphs"].values())
    assert set(info["timed_captures"]) <= {"ar", "ca"}
