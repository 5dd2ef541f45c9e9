"""`specgen benchmark --suite text` on a tiny target: any prompt set, rows per category (reported again from the run
folder), peer rows (run or skipped with one line), a prompt longer than the context refused before the model loads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specgen.eval.text_bench import records_of
from tests.cli.test_cli_text import invoke, tiny_target  # noqa: F401 - the fixture

BENCH = ["benchmark", "--suite", "text", "--model", "tiny-text", "--max-new-tokens", "8", "--format", "json",
         "warmup=false", "nll=false"]


def one_line(r, code: int = 2) -> str:
    assert r.exit_code == code and len(r.output.strip().splitlines()) == 1, r.output
    return r.output


def write(tmp_path, rows: list[dict]):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rows_per_category_and_peer_rows(tiny_target, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp fails: as without the package
    path = write(tmp_path, [{"prompt": "HELLO WORLD", "category": "A"}, {"prompt": "ONE TWO ONE", "category": "B"},
                            {"messages": [{"role": "user", "content": "HI THERE"}], "category": "A"}])
    r = invoke(*BENCH, "--prompts", str(path), "--methods", "ar,ngram,hf-lookup,hf-assisted,llamacpp-lookup",
               "--run-dir", str(tmp_path / "run"))
    assert r.exit_code == 0, r.output
    report = invoke("benchmark", "report", str(tmp_path / "run"), "--format", "json")
    assert report.exit_code == 0 and json.loads(report.stdout) == json.loads(r.stdout), report.output
    assert "llamacpp-lookup row skipped: llama-cpp-python is not installed" in r.stderr
    assert "docs/precision.md)\n" in r.stderr  # the reason's parenthesis closed once
    assert "hf-assisted row skipped: no draft model is registered for target/tiny-text" in r.stderr
    rows = json.loads(r.stdout)
    by = {(row["category"], row["method"]): row for row in rows}
    assert set(by) == {(c, m) for c in ("all", "A", "B") for m in ("ar", "ngram", "hf-lookup")}
    assert [by[(c, "ar")]["prompts"] for c in ("all", "A", "B")] == [3, 2, 1]
    assert by[("all", "ngram")]["exact_match_vs_ar"] == 1.0 and "exact_match_vs_ar" in by[("all", "hf-lookup")]
    assert "pass_at_1" not in by[("all", "ar")]  # no tests to run outside HumanEval


def test_stdin_and_assisted_with_a_named_draft(tiny_target):  # noqa: F811
    r = invoke(*BENCH, "--prompts", "-", "--methods", "ar,hf,hf-assisted", "options.hf-assisted.draft=tiny-text",
               input="HELLO WORLD\nABC ABC ABC\n")
    assert r.exit_code == 0, r.output
    rows = {row["method"]: row for row in json.loads(r.stdout)}
    assert set(rows) == {"ar", "hf", "hf-assisted"} and rows["ar"]["prompts"] == 2
    assert "category" not in rows["ar"]  # one category: no per-category rows


def test_transformers_rows_run_in_the_targets_dtype(tiny_target):  # noqa: F811
    """`--dtype bfloat16`: the `hf` row loads the weights in bfloat16 too (what a user would run beside it), not the
    float32 original: its weights read per token are AR's."""
    r = invoke(*BENCH, "--prompts", "-", "--methods", "ar,hf", "--dtype", "bfloat16", input="HELLO WORLD\n")
    assert r.exit_code == 0, r.output
    rows = {row["method"]: row for row in json.loads(r.stdout)}
    assert rows["hf"]["weight_mb_per_token"] == rows["ar"]["weight_mb_per_token"]


def test_a_command_line_is_dry_run_without_a_recipe(tiny_target, tmp_path):  # noqa: F811
    """`benchmark --suite text --prompts F --dry-run` was refused ('--dry-run checks a recipe: give it with --config
    FILE'): the command line is checked as a recipe of no keys would be, with its options."""
    path = write(tmp_path, [{"prompt": "HELLO WORLD"}, {"prompt": "ONE TWO ONE"}])
    r = invoke("benchmark", "--suite", "text", "--model", "tiny-text", "--prompts", str(path), "--methods", "ar,ngram",
               "--dry-run", "--format", "json")
    assert r.exit_code == 0, r.output
    rows = {row["check"]: row for row in json.loads(r.stdout)}
    assert rows["recipe"]["detail"] == "the command line: for `specgen benchmark` (TextBenchConfig, suite text)"
    assert rows["prompts"]["ok"] and rows["prompts"]["detail"].startswith("2 prompts") and "method ngram" in rows
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": \n')
    r = invoke("benchmark", "--suite", "text", "--prompts", str(bad), "--dry-run")
    assert r.exit_code == 1 and "line 1: invalid JSON" in r.stdout, r.output
    r = invoke("benchmark", "--model", "tiny-text", "--methods", "ar", "--limit", "2", "--dry-run")  # humaneval's
    assert r.exit_code == 1 and "suite humaneval" in r.stdout and "context of 256 tokens" in r.stdout, r.output


def test_a_prompt_longer_than_the_context_is_refused_before_loading(tiny_target, tmp_path, monkeypatch):  # noqa: F811
    import cli.benchmark_runs

    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(cli.benchmark_runs, "load_text_model", no_load)
    path = write(tmp_path, [{"prompt": "SHORT"}, {"prompt": "LONG " * 60}])  # 300 tokens; the context is 256
    out = one_line(invoke(*BENCH, "--prompts", str(path), "--methods", "ar"))
    assert "prompt 1: prompt of 300 tokens + max-new-tokens 8 does not fit target/tiny-text's context" in out


def test_a_run_refused_as_its_models_load_leaves_no_run_folder(tiny_target, tmp_path):  # noqa: F811
    """A prompt past the context (found as the models load, after the run folder opened) left a folder holding
    run.json and a lock: a half-written run. The folders it made go; an empty one stays empty; a started run's stays."""
    path = write(tmp_path, [{"prompt": "SHORT"}, {"prompt": "LONG " * 60}])  # 300 tokens; the context is 256
    for run in (tmp_path / "runs" / "new", tmp_path / "empty"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        out = one_line(invoke(*BENCH, "--prompts", str(path), "--methods", "ar", "--run-dir", str(run)))
        assert "prompt 1: prompt of 300 tokens" in out
    assert not (tmp_path / "runs").exists() and list((tmp_path / "empty").iterdir()) == []
    from specgen.eval.run_dir import RunDir
    from specgen.shard import Shard

    RunDir.open(tmp_path / "started", "text", {"a": 1})
    RunDir.open(tmp_path / "started", "text", {"a": 1}).discard()  # another process's run: kept
    recorded = RunDir.open(tmp_path / "recorded", "text", {"a": 1})
    recorded.append(Shard(), {"item": "b1/p0", "runs": {}})
    recorded.discard()  # an item recorded: kept, to resume
    assert (tmp_path / "started" / "run.json").is_file() and (tmp_path / "recorded" / "run.json").is_file()


def test_bad_prompt_sets_are_one_line(tiny_target, tmp_path):  # noqa: F811
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "A"}\n{"prompt": \n')
    assert "bad.jsonl line 2: invalid JSON" in one_line(invoke(*BENCH, "--prompts", str(bad), "--methods", "ar"))
    path = write(tmp_path, [{"turns": []}])
    assert "field 'turns' is not" in one_line(invoke(*BENCH, "--prompts", str(path), "--methods", "ar"))
    assert "--prompts is for --suite text" in one_line(invoke("benchmark", "--suite", "humaneval", "--prompts",
                                                              str(path)))
    unknown = one_line(invoke(*BENCH, "--prompts", str(path), "--methods", "ar,hf-lookup", "options.hf-lookup.n=4"))
    assert "hf-lookup row: unknown option(s) n; options: prompt_lookup_num_tokens, max_matching_ngram_size" in unknown
    missing = one_line(invoke(*BENCH, "--prompts", str(path), "--prompt-field", "question", "--methods", "ar"))
    assert "no field 'question'" in missing


def test_a_run_folder_keeps_its_prompt_set(tiny_target, tmp_path):  # noqa: F811
    """report read the prompt file again (for the prompts' count and categories), so a folder copied home, or one
    reported from another folder, failed 'prompt file not found'; a resume with an edited prompt file mixed two
    prompt sets (and their categories) into one table, exit 0."""
    path = write(tmp_path, [{"prompt": "HELLO WORLD", "category": "A"}, {"prompt": "ONE TWO ONE", "category": "B"}])
    run = tmp_path / "run"
    r = invoke(*BENCH, "--prompts", str(path), "--methods", "ar", "--run-dir", str(run), "--limit", "1")
    assert r.exit_code == 0, r.output
    path.rename(tmp_path / "moved.jsonl")  # the report needs no prompt file
    write(tmp_path, [{"prompt": "HELLO THERE", "category": "A"}, {"prompt": "ONE TWO ONE", "category": "B"}])
    records_of.cache_clear()  # a process reads a prompt file once; the edit is read by the next command's process
    assert "other inputs: prompts.0 (['A', " in one_line(invoke(*BENCH, "--prompts", str(path), "--methods", "ar",
                                                 "--run-dir", str(run), "--limit", "1"))
    path.unlink()
    report = invoke("benchmark", "report", str(run), "--format", "json")
    assert report.exit_code == 0 and json.loads(report.stdout) == json.loads(r.stdout), report.output


def test_a_report_needs_no_registry_model_of_a_row(tiny_target, tmp_path, monkeypatch):  # noqa: F811
    """A `method@MODEL` row's model was looked up in this machine's registry again: the report of a folder copied
    from the node that had MODEL said 'row ngram@tiny-text: 'tiny-text' is not a registry model, and a variant row
    needs options...' (exit 2)."""
    path = write(tmp_path, [{"prompt": "HELLO WORLD"}, {"prompt": "ONE TWO ONE"}])
    r = invoke(*BENCH, "--prompts", str(path), "--methods", "ar,ngram@tiny-text", "--run-dir", str(tmp_path / "run"))
    assert r.exit_code == 0, r.output
    monkeypatch.setattr("specgen.registry.installed_meta", lambda name: None)  # another machine's registry
    report = invoke("benchmark", "report", str(tmp_path / "run"), "--format", "json")
    assert report.exit_code == 0 and json.loads(report.stdout) == json.loads(r.stdout), report.output
    # out_dir=DIR is an images run's: a text run's refusal said "its one override is out_dir=DIR" of out_dir=DIR
    out = one_line(invoke("benchmark", "report", str(tmp_path / "run"), f"out_dir={tmp_path / 'x'}"))
    assert "a text run writes no files: out_dir=DIR is for an images run's grids and plots" in out


def test_a_row_skipped_when_a_run_started_stays_skipped_on_resume(tiny_target, tmp_path, monkeypatch):  # noqa: F811
    """A peer row skipped by a shard's first process (no package, no draft) that a resumed process could run (the
    package installed since) was measured on the items left only, and every table of the folder failed 'KeyError:
    hf-assisted' (exit 1): the earlier records lack the row. The shard's earlier skips are kept."""
    from specgen.eval.hf_rows import HfAssisted

    path, run = write(tmp_path, [{"prompt": "HELLO WORLD"}, {"prompt": "ONE TWO ONE"}]), tmp_path / "run"
    args = [*BENCH, "--prompts", str(path), "--methods", "ar,hf-assisted", "--run-dir", str(run)]
    monkeypatch.setattr(HfAssisted, "draft_name", staticmethod(lambda setup: None))
    assert invoke(*args).exit_code == 0
    records = run / "records-0-of-1.jsonl"
    records.write_text(records.read_text().splitlines(keepends=True)[0])  # killed after its first prompt
    monkeypatch.setattr(HfAssisted, "draft_name", staticmethod(lambda setup: "tiny-text"))  # runs now
    r = invoke(*args)
    assert r.exit_code == 0 and [row["method"] for row in json.loads(r.stdout)] == ["ar"], r.output
    assert "hf-assisted row skipped: no draft model" in r.stderr and "when this shard's run started" in r.stderr
    assert invoke("benchmark", "report", str(run)).exit_code == 0


def test_a_dry_run_checks_where_the_run_writes(tiny_target, tmp_path):  # noqa: F811
    """`--dry-run` of a job's own line passed `--shard 5/2`, `--shard 0/2` without `--run-dir`, an existing `--out`
    and a `--run-dir` of foreign files, each of which the job then refused: they are checks of the dry run now."""
    path = write(tmp_path, [{"prompt": "HELLO WORLD"}])
    (tmp_path / "rows.jsonl").write_text("")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    line = ["benchmark", "--suite", "text", "--model", "tiny-text", "--prompts", str(path), "--methods", "ar",
            "--dry-run", "--format", "json"]
    for extra, check, why in ((["--shard", "5/2", "--run-dir", str(tmp_path / "r")], "shard", "0 <= I < N"),
                              (["--shard", "0/2"], "shard", "needs --run-dir"),
                              (["--out", str(tmp_path / "rows.jsonl")], "out", "already exists"),
                              (["--run-dir", str(tmp_path / "foreign")], "run-dir", "no specgen run")):
        r = invoke(*line, *extra)
        rows = {row["check"]: row for row in json.loads(r.stdout)}
        assert r.exit_code == 1 and not rows[check]["ok"] and why in rows[check]["detail"], (extra, r.output)
    r = invoke(*line, "--shard", "1/2", "--run-dir", str(tmp_path / "new"), "--out", str(tmp_path / "new.jsonl"))
    rows = {row["check"]: row for row in json.loads(r.stdout)}
    assert r.exit_code == 0 and rows["shard"]["ok"] and rows["run-dir"]["ok"] and rows["out"]["ok"], r.output
    assert not (tmp_path / "new").exists() and not (tmp_path / "new.jsonl").exists()  # a dry run writes nothing


def test_a_dry_run_compares_the_config_of_the_run_it_would_resume(tiny_target, tmp_path):  # noqa: F811
    """`--dry-run --run-dir D` on D holding a run of another config said ok ('resumed if its config is this one'),
    and the job then refused the folder (`limit (1 -> 2)`): the dry run compares the configs as the run does."""
    path = write(tmp_path, [{"prompt": "HELLO WORLD"}, {"prompt": "ONE TWO ONE"}])
    run = tmp_path / "run"
    line = [*BENCH, "--prompts", str(path), "--methods", "ar", "--run-dir", str(run)]
    assert invoke(*line, "--limit", "1").exit_code == 0
    r = invoke(*line, "--limit", "2", "--dry-run")
    rows = {row["check"]: row for row in json.loads(r.stdout)}
    assert r.exit_code == 1 and not rows["resume"]["ok"], r.output
    assert "--limit (1 -> 2)" in rows["resume"]["detail"], r.output
    r = invoke(*line, "--limit", "1", "--dry-run")
    rows = {row["check"]: row for row in json.loads(r.stdout)}
    assert r.exit_code == 0 and rows["resume"]["ok"] and rows["run-dir"]["ok"], r.output
    r = invoke("benchmark", "--suite", "meshes", "--limit", "1", "--run-dir", str(run), "--dry-run", "--format", "json")
    rows = {row["check"]: row for row in json.loads(r.stdout)}
    assert r.exit_code == 1 and "holds a text run" in rows["resume"]["detail"], r.output


def test_a_dry_run_of_another_commands_recipe_refuses_the_benchmarks_own_options(tmp_path):
    """A trainer's recipe dry-runs (its command named), but `--run-dir`, `--shard` and `--out` reported ok, which only
    a benchmark suite takes (`benchmark --config` refuses that recipe): each is a FAIL row now, exit 1; a suite's
    recipe keeps them."""
    recipe = Path(__file__).parents[2] / "recipes" / "full" / "eagle-llamagen-c2i-b.yaml"
    for option in (["--run-dir", str(tmp_path / "run")], ["--shard", "1/2", "--run-dir", str(tmp_path / "run")],
                   ["--out", str(tmp_path / "rows.jsonl")]):
        r = invoke("benchmark", "--config", str(recipe), "--dry-run", "--format", "json", *option)
        rows = {row["check"]: row for row in json.loads(r.stdout)}
        assert r.exit_code == 1 and "train-heads" in rows["recipe"]["detail"], r.output
        assert not rows[option[0][2:]]["ok"] and "benchmark suite's option" in rows[option[0][2:]]["detail"]
    r = invoke(*BENCH, "--methods", "ar", "--run-dir", str(tmp_path / "run"), "--dry-run")
    assert {row["check"]: row for row in json.loads(r.stdout)}["run-dir"]["ok"], r.output
