"""`specgen env` (issue 47): one screen or one JSON object of the facts that decide how specgen runs, with no model
loaded; the benchmark machine column is made from the same facts."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
FAMILIES = {"text float32", "text int8", "text int4", "image", "mesh"}


def test_env_json_has_every_fact_and_loads_no_model(monkeypatch, specgen_home):
    from specgen import checkpoints

    monkeypatch.setattr(checkpoints, "load_module", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    r = runner.invoke(app, ["env", "--json"])
    assert r.exit_code == 0, r.output
    facts = json.loads(r.stdout)
    assert {"devices", "isa", "threads", "torch", "cuda", "kernels", "native", "caches"} <= set(facts)
    assert facts["devices"][0]["name"] == "cpu" and facts["threads"]["torch"] >= 1
    assert FAMILIES <= set(facts["kernels"]) and all(k["path"] and k["why"] for k in facts["kernels"].values())
    assert set(facts["caches"]) == {"home", "registry", "cost_curves", "decoded_weights",
                                    "native_cache"}
    assert facts["caches"]["home"]["path"] == str(specgen_home)
    assert set(facts["native"]["libraries"]) == {"attention", "glue", "tiled", "qmm"}
    assert not (specgen_home / "checkpoints").exists()  # nothing materialised


def test_env_takes_format_json_as_every_command_does():
    """docs/cli.md: results on stdout with `--format table|json` on every command; env took only --json."""
    r = runner.invoke(app, ["env", "--format", "json"])
    assert r.exit_code == 0, r.output
    assert set(json.loads(r.stdout)) == set(json.loads(runner.invoke(app, ["env", "--json"]).stdout))


def test_env_table_names_each_family_and_cache():
    r = runner.invoke(app, ["env"])
    assert r.exit_code == 0, r.output
    for family in FAMILIES | {"cache registry", "native build", "c compiler", "isa", "threads"}:
        assert family in r.stdout, family


def test_env_refuses_a_missing_device_in_one_line():
    import torch

    if torch.cuda.is_available():
        return
    r = runner.invoke(app, ["env", "--device", "cuda"])
    assert r.exit_code == 2 and r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1


def test_the_benchmark_machine_column_is_made_from_the_same_facts(tmp_path, monkeypatch):
    from cli import benchmark_runs
    from specgen.eval.run_dir import RunDir
    from specgen.machine import VECTOR_ISA, cpuinfo, machine_facts
    from specgen.models import kernel_choice

    monkeypatch.setattr(kernel_choice, "CAPPED_CHUNKED", [False])  # no softcapped model ran (the test below)

    facts = machine_facts()
    cpu = facts["devices"][0]
    if cpuinfo("cpu family"):  # x86 Linux: the kind ("AMD EPYC" is a Zen 4 and a Zen 5 VM here)
        assert cpu["model"].endswith(f"(family {cpuinfo('cpu family')} model {cpuinfo('model')})")
    machine = benchmark_runs.machine_of(RunDir(tmp_path, "text", {}))  # a run folder without machine files: this one
    # env's CPU model and widest vector ISA: the rows of an AVX2-only CPU read as an AVX-512 one's
    isa = next((f" {name}" for flag, name in VECTOR_ISA if flag in facts["isa"]), "")
    assert machine.startswith(f"{cpu['model']}, {cpu['arch']}{isa}, {cpu['cpus']} cpus, torch threads "
                              f"{facts['threads']['torch']}")
    assert machine.endswith(f"step kernels {facts['kernels']['step_kernels']['path']}")


def test_the_machine_column_says_a_softcapped_model_attended_chunked(monkeypatch):
    """A Gemma 2's capped scores take no attention.c (it has no cap): the column said "step kernels native C" of a
    run whose attention was torch's chunked path. A capped model's cached forward on the CPU now says so; an uncapped
    one (the control) leaves the column as it was."""
    import torch

    from specgen.machine import label, machine_facts
    from specgen.models import kernel_choice
    from tests.conftest import GEMMA2, tiny_model

    monkeypatch.setattr(kernel_choice, "CAPPED_CHUNKED", [False])
    for over, said in (({}, False), (GEMMA2, True)):
        model = tiny_model(0, **over)
        with torch.inference_mode():
            model(torch.tensor([[1, 2, 3]]), torch.arange(3)[None], model.new_cache())
        assert label(machine_facts()).endswith(", softcapped attention torch chunked") is said, over


def test_env_refuses_an_empty_device_as_every_command_does():
    """`--device ""` (an unset shell variable in quotes) was read as cpu; generate's --device "" is refused so."""
    r = runner.invoke(app, ["env", "--device", ""])
    assert r.exit_code == 2 and r.stdout == "", r.output
    assert r.stderr.strip().splitlines() == ["error: an empty device (an unset shell variable?); use cpu, cuda, "
                                             "cuda:N, auto, or leave it out for the default"]


def test_env_refuses_json_with_format_table():
    """`--json --format table` gave JSON, --format table ignored unsaid; --json with --format json is one request."""
    for args in (["--json", "--format", "table"], ["-f", "table", "--json"]):
        r = runner.invoke(app, ["env", *args])
        assert r.exit_code == 2 and r.stdout == "", r.output
        assert r.stderr.strip().splitlines() == ["error: --json is --format json and contradicts --format table; "
                                                 "give one of them"]
    r = runner.invoke(app, ["env", "--json", "--format", "json"])
    assert r.exit_code == 0 and "devices" in json.loads(r.stdout), r.output


def test_env_table_shows_paths_as_they_are(tmp_path, monkeypatch):
    """Table cells went through Rich markup: a cache folder named `home [a]` showed as `home` (and `:smile:` as an
    emoji), naming a folder that is not the one in use."""
    home = tmp_path / "home [a] :smile:"
    monkeypatch.setenv("SPECGEN_HOME", str(home))
    r = runner.invoke(app, ["env"])
    assert r.exit_code == 0, r.output
    assert str(home) in r.stdout
