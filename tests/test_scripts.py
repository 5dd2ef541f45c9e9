"""Every script in scripts/ (the GPU check's steps among them) still imports against today's specgen."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_script_imports(fresh_interpreter):
    assert [line for line in fresh_interpreter["scripts"] if line.startswith("scripts/")] == []


def test_a_script_importing_a_name_that_went_is_reported(fresh_interpreter):
    """The control: a folder holding one stale script, read in the same interpreter after scripts/."""
    assert [line.split(":")[0] for line in fresh_interpreter["scripts"] if not line.startswith("scripts/")] == [
        "stale/stale.py"]


@pytest.mark.slow
def test_the_graphs_step_runs_on_the_cpu_with_graphs_equal_to_eager():
    """The GPU check's main step end to end at tiny sizes (`--smoke`, which measures nothing): every row exact."""
    out = subprocess.run([sys.executable, "scripts/gpu_graphs.py", "--smoke", "--only", "text"], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| text |")]
    assert len(rows) >= 4 and all(r[5].strip() in ("1.0", "") for r in rows)


def test_the_graphs_step_ends_with_issue_46s_goals(monkeypatch, capsys):
    """One line a goal from the rows: met, not met, or "-" where its row is missing (a step cut short); a row whose
    name only begins like the goal's (batch 16 after batch 1) is not taken for it."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_graphs

    gpu_graphs.goals([{"suite": "text", "row": "ar --graphs on, batch 16", "vs_off": 20.0, "vs_b1": 5.0},
                      {"suite": "text", "row": "ar --graphs on", "vs_off": 9.0},
                      {"suite": "image", "row": "adt-tree --graphs on", "vs_ar": 0.9, "drafter_share": 0.1}])
    lines = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ")[1:] for line in
             capsys.readouterr().out.splitlines() if line.startswith("| ") and (">=" in line or "<=" in line)}
    assert lines["text ar --graphs on: vs_off >= 8.0"] == ["9.00", "yes"]
    assert lines["text ar --graphs on, batch 16: vs_b1 >= 12.0"] == ["5.00", "no"]
    assert lines["image adt-tree --graphs on: drafter_share <= 0.2"] == ["0.10", "yes"]
    assert lines["mesh xspecmesh criterion=rejection --graphs on: vs_ar >= 1.5"] == ["-", "-"]
    assert len(lines) == len(gpu_graphs.GOALS)


@pytest.mark.slow
def test_the_profile_step_reports_each_case_on_the_cpu():
    """The GPU check's profile step at tiny sizes (`--device cpu`, which measures nothing): every case's step line and
    its top kernels, a kernel's share of the step at most 1."""
    out = subprocess.run([sys.executable, "scripts/gpu_profile.py", "--device", "cpu", "--top", "3"],
                         capture_output=True, text=True, cwd=ROOT, check=True).stdout
    cases = [line for line in out.splitlines() if " ms a step " in line]
    assert [c.split(":")[0] for c in cases] == [
        "text AR, batch 1", "text AR, batch 16", "text AR, batch 16, one-launch products",
        "text pcllm-mr n 4 + lookup 16, batch 1", "image ADT-Tree, batch 1"]
    shares = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("  ") and "share" not in line]
    assert len(shares) == 15 and all(0 < s <= 1 for s in shares)


def test_the_sync_counts_kernel_line_counts_fewer_kernels_with_the_native_ops(monkeypatch):
    """`gpu_sync_count.py`'s first line (kernels inside a captured bf16 step) on a 2-layer model: the list attention
    and the one-pass norms launch fewer kernels than the torch paths they replace (`SPECGEN_NATIVE=0`)."""
    import dataclasses

    from specgen import native
    from specgen.native import cuda_ops

    if native.library("attention") is None:
        pytest.skip("no C compiler: the native kernels are not built here")
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_graphs
    import gpu_sync_count

    cfg = dataclasses.replace(gpu_graphs.SMOLLM2, n_layers=2, vocab_size=512)
    native_kernels, layers = gpu_sync_count.graph_kernels("cpu", cfg)
    monkeypatch.setattr(native, "library", lambda name: None)  # as SPECGEN_NATIVE=0
    monkeypatch.setattr(cuda_ops, "available", lambda: False)
    torch_kernels, _ = gpu_sync_count.graph_kernels("cpu", cfg)
    assert layers == 2 and native_kernels < torch_kernels


@pytest.mark.slow
def test_the_gpu_checks_test_step_runs_the_gpu_tests_when_a_test_module_cannot_import(tmp_path):
    """A bare GPU machine lacks some of the project's wheels (trimesh, which tests/mesh/ imports): gpu_check.sh's
    gpu-tests step still runs every gpu test (here each skips: no CUDA), not one collection error for them all."""
    if (ROOT / ".whl").exists():
        pytest.skip("the script would install the checkout's .whl/ wheels first")
    bin_dir, fake = tmp_path / "bin", tmp_path / "site" / "trimesh"
    bin_dir.mkdir()
    fake.mkdir(parents=True)
    for name, body in (("python3", f'exec {sys.executable} "$@"'), ("nvidia-smi", "true")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (fake / "__init__.py").write_text("raise ImportError('No module named trimesh (as on a bare GPU machine)')\n")
    env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"), "ONLY": "gpu-tests",
                        "PYTHONPATH": f"{tmp_path / 'site'}:{ROOT}"}
    subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, timeout=300)
    log = (tmp_path / "out" / "gpu-tests.log").read_text()
    # pytest's last summary line (Triton 3.9's nanobind may print leak notes after it, at exit)
    summary = ([ln for ln in log.splitlines() if re.search(r"\d+ (passed|skipped|failed|errors?)\b|Interrupted", ln)]
               or [log[-300:]])[-1]
    assert "skipped" in summary and "Interrupted" not in summary, summary


def test_the_sync_count_prints_each_suites_rows_before_the_next_suite_loads(monkeypatch, capsys):
    """A suite that cannot load there (the mesh models without trimesh) loses its own rows, not the others'."""
    from specgen.decoding.stats import DecodeStats

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_sync_count

    def missing(device):
        raise ImportError("No module named 'trimesh'")

    for name, cases in (("text_cases", lambda d: {"text ar": lambda: DecodeStats(steps=1)}),
                        ("image_cases", lambda d: {"image ar": lambda: DecodeStats(steps=1)}),
                        ("mesh_cases", missing), ("graph_kernels", lambda d: (1, 1)),
                        ("emulate_captures", lambda: None)):
        monkeypatch.setattr(gpu_sync_count, name, cases)
    monkeypatch.setattr(sys, "argv", ["gpu_sync_count.py", "--device", "cpu"])
    with pytest.raises(ImportError):
        gpu_sync_count.main()
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[3:]]
    assert rows == ["text", "image"]
