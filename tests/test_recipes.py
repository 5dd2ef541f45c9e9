"""Every `--config` command quoted in the docs and the pipeline scripts loads: its recipe exists and parses, and its
`key=value` overrides fit the command's config (`specgen.eval.dry_run.check_recipe`, no weights loaded).

One-off benchmark sweeps live as overrides of a kept recipe in docs/results/*.md (issue 26 item 3), so a renamed
key or a moved recipe breaks a quoted command silently unless something loads them all; mesh benchmark commands
also build their rows (`variants`), which checks every row's heads and XSpecMesh options.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from specgen.eval.dry_run import check_recipe

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "logs" not in p.parts)]
SCRIPTS = sorted((ROOT / "recipes").glob("*/run-*.sh"))
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SPAN = re.compile(r"`([^`]+)`")
SHELL_STOP = {">", ">>", "|", "&", "&&", ";", "2>&1", "||"}


def command_lines(text: str) -> list[str]:
    """Shell lines (continuations joined) of fenced blocks, plus inline code spans (which may wrap lines)."""
    out = []
    for block in FENCE.findall(text):
        out += block.replace("\\\n", " ").splitlines()
    out += [s.replace("\n", " ") for s in SPAN.findall(FENCE.sub("", text))]
    return out


def config_commands(text: str, shell: bool = False) -> list[tuple[str, list[str]]]:
    """(recipe, overrides) of every `specgen ... --config RECIPE key=value ...` command in a page (or a shell script)."""
    found = []
    for line in text.replace("\\\n", " ").splitlines() if shell else command_lines(text):
        line = line.split(" #", 1)[0]
        start = line.find("specgen ")
        if start < 0 or not re.search(r"(^|\s)(--config|-c)\s", line):
            continue
        try:
            argv = shlex.split(line[start:])
        except ValueError:  # an unbalanced quote: not a whole command
            continue
        recipe, overrides, i = None, [], 2
        while i < len(argv) and argv[i] not in SHELL_STOP and not argv[i].startswith((">", "2>")):
            a = argv[i]
            if a in ("--config", "-c"):
                recipe, i = argv[i + 1], i + 2
            elif a.startswith("-"):  # another option: skip its value if it takes one
                takes = i + 1 < len(argv) and not argv[i + 1].startswith("-") and "=" not in argv[i + 1]
                i += 2 if takes and argv[i + 1] not in SHELL_STOP else 1
            else:
                if "=" in a and "$" not in a:  # a shell variable's value is the script's business
                    overrides.append(a)
                i += 1
        if recipe and re.fullmatch(r"recipes/[a-z]+/[a-z0-9_.\-]+\.yaml", recipe):  # not `...`, `X.yaml` or `$R/...`
            found.append((recipe, overrides))
    return found


def cases():
    out = []
    for page in [*DOCS, *SCRIPTS]:
        for n, (recipe, overrides) in enumerate(config_commands(page.read_text(), page.suffix == ".sh")):
            out.append(pytest.param(recipe, overrides, id=f"{page.relative_to(ROOT)}:{n}:{Path(recipe).name}"))
    return out


def distinct(cases):
    """Each command once (the same command quoted on several pages is one check), under the id it first has."""
    first = {}
    for case in cases:
        first.setdefault((case.values[0], tuple(case.values[1])), case)
    return list(first.values())


CASES = cases()


def test_the_results_docs_and_pipelines_quote_commands():
    pages = {c.id.split(":")[0] for c in CASES}
    assert {"docs/results/mesh.md", "docs/results/text.md", "recipes/small/run-mesh-lossless.sh"} <= pages
    mesh = [c for c in CASES if c.id.startswith("docs/results/mesh.md")]
    assert len(mesh) >= 18  # table 3 + every sweep that was once its own recipe


@pytest.mark.parametrize("recipe,overrides", distinct(CASES))
def test_quoted_config_command_loads(recipe, overrides):
    rows = check_recipe(ROOT / recipe, overrides)
    checks = {r["check"]: r for r in rows}
    assert checks["recipe"]["ok"] and checks["config"]["ok"], rows
    assert all(r["ok"] for r in rows if r["check"].startswith(("method", "rows", "suite"))), rows
    if checks.get("suite", {}).get("detail") == "meshes":
        from specgen.config import load_config
        from specgen.eval.mesh_bench import MeshBenchConfig, variants

        labels = [v.label for v in variants(load_config(MeshBenchConfig, ROOT / recipe, overrides))]
        assert labels[0] == "ar" and len(set(labels)) == len(labels), labels


def test_overrides_are_parsed_like_the_shell():
    text = """```bash
specgen benchmark --config recipes/tiny/bench-meshes.yaml \\
  'rows=[ar,ca+lora]' 'options={sampling: tree, top_k_tree: 1}' --out runs/x.jsonl \\
  > "$LOGS/x.log" 2>&1
```
and `specgen benchmark --config
recipes/small/bench-meshes.yaml limit=64` inline; `specgen benchmark --suite meshes --limit 32` has no recipe."""
    assert config_commands(text) == [
        ("recipes/tiny/bench-meshes.yaml", ["rows=[ar,ca+lora]", "options={sampling: tree, top_k_tree: 1}"]),
        ("recipes/small/bench-meshes.yaml", ["limit=64"])]


def test_the_slurm_array_job_names_the_run_s_shard_count(tmp_path):
    """slurm-benchmark.sh's array task ran --shard ID/$SLURM_ARRAY_TASK_COUNT: a failed shard resubmitted alone (its
    header's `sbatch --array=I`) sees a count of 1 and was refused ('--shard 2/1: ... 0 <= I < N'). A fake sbatch
    keeps the job scripts; the first (the array task) runs with a fake specgen that records its arguments."""
    import subprocess

    bin_dir, venv = tmp_path / "bin", tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/bash\nn=$(ls {tmp_path}/job-* 2>/dev/null | wc -l)\n'
                                    f'printf "%s\\n" "$@" > {tmp_path}/opts-$n\ncat > {tmp_path}/job-$n.sh\necho $n\n')
    (venv / "bin" / "specgen").write_text(f'#!/bin/bash\necho "$@" > {tmp_path}/args\n')
    (venv / "bin" / "activate").write_text(f'PATH={venv}/bin:$PATH\n')
    for f in (bin_dir / "sbatch", venv / "bin" / "specgen"):
        f.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RECIPE": "r.yaml", "RUN_DIR": str(tmp_path / "run"), "SHARDS": "4",
           "VENV": str(venv)}
    subprocess.run(["bash", str(ROOT / "recipes/full/slurm-benchmark.sh")], env=env, check=True, capture_output=True)
    export = next(o for o in (tmp_path / "opts-0").read_text().splitlines() if o.startswith("--export="))
    passed = dict(kv.split("=", 1) for kv in export.removeprefix("--export=ALL,").split(","))  # what the task sees
    task = {"PATH": env["PATH"], **passed, "SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "1"}  # resubmitted
    subprocess.run(["bash", str(tmp_path / "job-0.sh")], env=task, check=True, capture_output=True)
    assert "--shard 2/4" in (tmp_path / "args").read_text()


def test_the_slurm_array_job_s_logs_leave_the_run_folder_to_the_run(tmp_path):
    """slurm-benchmark.sh made its log folder inside RUN_DIR before any task ran, so every array task found a folder
    of files and no run.json and was refused (`--run-dir ... holds files of no specgen run (slurm)`)."""
    import subprocess

    from specgen.eval.run_dir import RunDir

    (tmp_path / "sbatch").write_text("#!/bin/bash\ncat > /dev/null\necho 1\n")
    (tmp_path / "sbatch").chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "RECIPE": "r.yaml", "RUN_DIR": str(tmp_path / "run/")}
    subprocess.run(["bash", str(ROOT / "recipes/full/slurm-benchmark.sh")], env=env, check=True, capture_output=True)
    RunDir.check_place(tmp_path / "run")  # what each task's `specgen benchmark --run-dir` checks first
    assert (tmp_path / "run.slurm").is_dir()  # the logs beside it
