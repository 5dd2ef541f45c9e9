"""Every script in scripts/ (the GPU check's steps among them) still imports against today's specgen."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

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
    assert lines["mesh xspecmesh criterion=rejection vertex_lookup --graphs on: vs_ar >= 1.5"] == ["-", "-"]
    assert lines["image adt-tree, again: vs_ar >= 2.0"] == ["-", "-"]  # the second pass's row, not the first's
    assert len(lines) == len(gpu_graphs.GOALS)


@pytest.mark.slow
def test_the_int4_step_breakdown_stubs_each_part_of_the_straight_run():
    """precision.md's int4 step split runs against today's straight run (it looked products up by a key that had
    changed): the whole forward and one line a stubbed part, each with its milliseconds."""
    out = subprocess.run([sys.executable, "scripts/int4_step_breakdown.py", "--reps", "2"], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    lines = [re.split(r"\s{2,}", line.strip())[0] for line in out.splitlines()[1:]]
    assert lines == ["whole forward", "quantized products stubbed", "+ attention core stubbed", "+ SwiGLU gate stubbed"]
    assert "121 quantized products on qmm.c" in out or "on torch" in out


@pytest.mark.slow
def test_the_profile_step_reports_each_case_on_the_cpu():
    """The GPU check's profile step at tiny sizes (`--device cpu`, which measures nothing): every case's step line, its
    top kernels (a kernel's share of the step at most 1) and its top Python functions by their own time."""
    out = subprocess.run([sys.executable, "scripts/gpu_profile.py", "--device", "cpu", "--top", "3"],
                         capture_output=True, text=True, cwd=ROOT, check=True).stdout
    cases = [line for line in out.splitlines() if " ms a step " in line]
    assert [c.split(":")[0] for c in cases] == [
        "text AR, batch 1", "text AR, batch 16",
        "text pcllm-mr n 4 + lookup 16, batch 1", "image AR, batch 1", "image ADT-Tree, batch 1",
        "image EAGLE-2, batch 1", "image EAGLE-2 (run_ahead 4), batch 1", "mesh AR, batch 1",
        "mesh XSpecMesh (lossless, vertex lookup), batch 1",
        "mesh XSpecMesh (lossless, vertex lookup, candidate tree 9,2,1,1), batch 1",
        "mesh XSpecMesh (lossless, vertex lookup, run_ahead 4), batch 1",
        "mesh AR's prefill, a step = a mesh", "mesh XSpecMesh's prefill, a step = a mesh"]
    rows, part = {"kernel": [], "python": []}, None
    for line in out.splitlines():
        if line.startswith("  kernel ") or line.startswith("  python function"):
            part = line.split()[0]
        elif line.startswith("  ") and part:
            rows[part].append(float(line.split()[-1]))  # a kernel's share of the step; a function's ms a step
    # --top 3 a case; a share printed to 2 decimals reads 0.00 for a short kernel (seen with another test beside it)
    assert len(rows["kernel"]) == 3 * len(cases) and all(0 <= s <= 1 for s in rows["kernel"])
    assert len(rows["python"]) == 3 * len(cases) and all(ms >= 0 for ms in rows["python"])
    # the captures run through the replay emulation on the CPU, so every decoding case has replays to launch alone;
    # a prefill alone replays none (its chunks are the prompts' own: none for a mesh's one start position)
    alone = [re.search(r"replays alone ([\d.]+|-) ms a step", c).group(1) for c in cases]
    assert all(float(ms) > 0 for ms in alone[:-2]) and alone[-2:] == ["-", "-"]


def test_the_profiles_replays_alone_launch_each_graph_as_often_as_its_run(monkeypatch):
    """`gpu_profile.replays_alone`: every (graph, times) pair replayed that many times, the time per decode step; None
    where the run replayed nothing (no captures)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_profile

    class Graph:
        def __init__(self) -> None:
            self.replays = 0

        def replay(self) -> None:
            self.replays += 1

    a, b = Graph(), Graph()
    ms = gpu_profile.replays_alone([(a, 3), (b, 5)], steps=4, device="cpu")
    assert (a.replays, b.replays) == (3, 5) and ms >= 0
    assert gpu_profile.replays_alone([], steps=4, device="cpu") is None


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


def growth_kernels(levels: int, lines=None) -> int:
    """The CUDA kernels of a captured EAGLE tree growth (`gpu_sync_count.cuda_kernels`) of `levels` drafter levels
    of 4 nodes: 3 CFG sequences of a tiny image model at different prefixes and depths."""
    import gpu_sync_count

    from specgen.methods.eagle_grow import Children, GrowPlan, static_growth
    from specgen.models.eagle import EagleNet
    from tests.image_fixtures import tiny_image_target

    model = tiny_image_target(0)
    net = EagleNet.from_target(model).eval()
    children = Children(model.output, 2, 3.0)
    c = net.cfg
    k = torch.zeros(1, 7, c.n_kv_heads, 64, c.hd)
    ints = torch.tensor([[3, 4, 5], [4, 2, 4], [3, 0, 2], [12, 0, 12], [4, 5, 6], [7, 8, 9]])
    plan = GrowPlan((4,) * (levels + 1), 12)
    return gpu_sync_count.cuda_kernels(lambda: static_growth(
        net, children, (k, k.clone()), plan, 2, 64, torch.zeros(6, 1, c.dim), ints, torch.arange(6)), lines)


def test_a_captured_growth_level_launches_its_forward_and_two_kernels(monkeypatch):
    """A drafter level of a captured tree growth: its forward (the one-layer drafter's 13 kernels, the head's product
    and `top_children`: CFG, log-softmax, top-k and path scores in one, written into the growth's record) and 2
    kernels of tree work (the beam in one, writing the next level's parents and gathering its input features; its
    attention lists); a growth no per-level part to join at its end. At 11e6fa0 a level was 43 (its mask, attention
    plan and ancestry rebuilt a level), at 0ac17ce 30, at e62da52 19 (its parents copied, its nodes joined: 49 at 2
    levels), at 02b57a5 18 (its features gathered apart: 43)."""
    from collections import Counter

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    lines = Counter()
    two, three = growth_kernels(2), growth_kernels(3, lines)
    assert three - two <= 15 + 2 and two <= 42, (two, three)
    assert sum(lines.values()) == three  # --by-op's lines: every kernel, each once


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


def test_the_gpu_check_compiles_the_hf_peer_beside_the_tests_and_waits_for_it_before_the_graphs_step(tmp_path):
    """The `hf-compiled` peer's compile runs in its own process while the gpu tests run, and the graphs step (which
    times rows) starts only after it ends; a run without the graphs step, or whose graphs step has no text suite
    (`SUITES`), starts no such process."""
    if (ROOT / ".whl").exists():
        pytest.skip("the script would install the checkout's .whl/ wheels first")
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    # a fake python3: logs its arguments when it starts and ends (the warm-up takes a while)
    fake = f'echo "start $*" >>{calls}; case "$*" in *hf-warm*) sleep 1 ;; esac; echo "end $*" >>{calls}'
    for name, body in (("python3", fake), ("nvidia-smi", "true")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    for only, suites, warmed in (("gpu-tests graphs", "", True), ("gpu-tests profile", "", False),
                                 ("gpu-tests graphs", "image,mesh", False)):
        calls.write_text("")
        env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"), "ONLY": only,
                            "SUITES": suites}
        subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, timeout=60)
        lines = calls.read_text().splitlines()
        at = {what: next((i for i, ln in enumerate(lines) if ln.startswith(what)), None)
              for what in ("start scripts/gpu_graphs.py --only hf-warm", "end scripts/gpu_graphs.py --only hf-warm",
                           "start -m pytest", "start scripts/gpu_graphs.py --only text")}
        starts_warm, ends_warm, tests, graphs = at.values()
        if warmed:
            assert starts_warm is not None and tests < ends_warm < graphs, lines  # beside the tests, done before
        else:
            assert starts_warm is None and tests is not None, lines
            assert not suites or any(f"gpu_graphs.py --only {suites} " in ln for ln in lines), lines


def test_the_sync_count_prints_each_suites_rows_before_the_next_suite_loads(monkeypatch, capsys):
    """A suite that cannot load there (the mesh models without trimesh) loses its own rows, not the others'."""
    from specgen.decoding.stats import DecodeStats

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_sync_count

    def missing(device):
        raise ImportError("No module named 'trimesh'")

    for name, cases in (("text_cases", lambda d: {"text ar": lambda: DecodeStats(steps=1)}),
                        ("image_cases", lambda d: {"image ar": lambda: DecodeStats(steps=1)}),
                        ("mesh_cases", missing), ("graph_kernels", lambda d, cfg=None: (1, 1)),
                        ("emulate_captures", lambda: None)):
        monkeypatch.setattr(gpu_sync_count, name, cases)
    monkeypatch.setattr(sys, "argv", ["gpu_sync_count.py", "--device", "cpu"])
    with pytest.raises(ImportError):
        gpu_sync_count.main()
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[3:]]
    assert rows == ["text", "image"]


def test_the_sync_count_counts_the_replays_of_the_counted_run_alone(monkeypatch):
    """`replays/step`: the captured steps a run runs (`StepGraphs.run`, a graph launch each on a GPU), not its
    warm-up's."""
    from specgen.decoding.stats import DecodeStats
    from specgen.models import graphs

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_sync_count

    monkeypatch.setattr(graphs.StepGraphs, "run", lambda self, *args: ())

    def run():
        for _ in range(3):
            graphs.StepGraphs.run(None, "key", {}, None, "what")
        return DecodeStats(steps=2)

    assert gpu_sync_count.count(run).replays == 3


def test_the_sync_counts_by_op_prints_one_cases_ops_by_line_and_refuses_an_unknown_case(monkeypatch, capsys):
    """`--by-op CASE`: that case alone, its eager ops a step by source line; a case no suite has is one line."""
    from specgen.decoding.stats import DecodeStats

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_sync_count

    def two_steps():
        torch.ones(3).add_(1)  # one eager op (the tensor's making another), over 2 steps
        return DecodeStats(steps=2)

    for name, cases in (("text_cases", lambda d: {"text ar": two_steps}), ("image_cases", lambda d: {}),
                        ("mesh_cases", lambda d: {}), ("graph_kernels", lambda d, cfg=None: (1, 1)),
                        ("emulate_captures", lambda: None)):
        monkeypatch.setattr(gpu_sync_count, name, cases)
    monkeypatch.setattr(sys, "argv", ["gpu_sync_count.py", "--device", "cpu", "--by-op", "text ar"])
    gpu_sync_count.main()
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "eager: 1.0 a step" and "add_" in out[-2] and out[-1] == "graph: 0.0 a step"
    monkeypatch.setattr(sys, "argv", ["gpu_sync_count.py", "--device", "cpu", "--by-op", "text nope"])
    with pytest.raises(SystemExit, match="--by-op 'text nope': no such case"):
        gpu_sync_count.main()


def emulated_sync_count(monkeypatch):
    """`gpu_sync_count` with captured steps through the CPU replay emulation (`emulate_captures`), undone after the
    test."""
    from specgen.methods import xspecmesh_pool
    from specgen.models import graphs
    from tests.models.test_graphs import Traced

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_sync_count

    # emulate_captures replaces these: restored after the test
    monkeypatch.setattr(Traced, "replay", Traced.replay)
    monkeypatch.setattr(graphs.StepGraphs, "captured", graphs.StepGraphs.captured)
    monkeypatch.setattr(xspecmesh_pool, "ONE_READ", xspecmesh_pool.ONE_READ)
    gpu_sync_count.emulate_captures()
    return gpu_sync_count


def test_a_steps_host_time_is_the_time_between_refills_less_the_emulated_replays(monkeypatch):
    """`gpu_sync_count.ms_per_step`'s host work on a clock that a run moves by hand: each step takes 3 ms of host work and
    2 ms of emulated replays, and its prefill (inside `Batch.refill`) 7 ms; the host work a step is 3 ms (5 where the
    replays stayed in, 10 where the prefill did)."""
    from specgen.decoding import loop
    from specgen.decoding.stats import DecodeStats

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import gpu_sync_count

    clock = [0.0]
    monkeypatch.setattr(gpu_sync_count, "clock", lambda: clock[0])
    monkeypatch.setattr(gpu_sync_count.OpCounter, "replay_s", 0.0)
    left = [0]

    def refill(batch) -> bool:
        clock[0] += 0.007  # admission and prefill
        left[0] -= 1
        return left[0] >= 0

    monkeypatch.setattr(loop.Batch, "refill", refill)

    def run() -> DecodeStats:
        left[0] = 4  # four steps
        while loop.Batch.refill(None):
            clock[0] += 0.005
            gpu_sync_count.OpCounter.replay_s += 0.002
        return DecodeStats(steps=4)

    assert gpu_sync_count.ms_per_step(run, "cpu")[1] == pytest.approx(3.0)


def eager_ops_a_step(gpu_sync_count, run) -> tuple[float, dict, dict]:
    """`run()` (its decode steps) once for the captures, then its eager ops a step (`OpCounter`, replays not counted),
    the ops a step by (file, op) summed over the file's lines, and the same of its graphs' kernels."""
    from collections import Counter

    run()  # the captures
    gpu_sync_count.OpCounter.by_line = Counter()
    with gpu_sync_count.OpCounter() as counter:
        steps = run()
    by_op = {"eager": Counter(), "graph": Counter()}
    for (kind, line), n in gpu_sync_count.OpCounter.by_line.items():
        by_op[kind][line.split(":")[0], line.split()[-1]] += n / steps
    gpu_sync_count.OpCounter.by_line = None
    return counter.ops / steps, by_op["eager"], by_op["graph"]


def tree_step_ops(monkeypatch, batch: int, options: dict | None = None) -> tuple[float, dict, dict]:
    """Eager ops a decode step and graph kernels (`eager_ops_a_step`) of lossless ADT-Tree (its `options`) on a tiny
    CFG image model at `batch` sequences."""
    from specgen.decoding.sampling import SamplingParams
    from specgen.generate.image_methods import ImageParts, build_image_method
    from specgen.image.target import CFGTarget
    from specgen.methods import run_batch
    from specgen.models.eagle import EagleNet
    from tests.image_fixtures import tiny_image_target

    gpu_sync_count = emulated_sync_count(monkeypatch)
    model = tiny_image_target(0)
    torch.manual_seed(1)
    net = EagleNet.from_target(model).eval()
    gpu_sync_count.capture(model, net)
    parts = ImageParts(model, CFGTarget(model, 3.0), net, None, 4)

    def run():
        got = run_batch(parts.target, lambda i: build_image_method("adt-tree", parts, options or {})[0],
                        [[i] for i in range(batch)], 16, SamplingParams(), batch_size=batch)
        return max(r.stats.steps for r in got.results)

    return eager_ops_a_step(gpu_sync_count, run)


def test_text_steps_eager_ops_stay_within_budget(monkeypatch):
    """The sync count's B1 greedy text rows (`gpu_sync_count.text_cases`): eager ops a captured step outside its
    replays (each a launch or a host tensor op on a GPU). At 17f25cf: AR 15.8, n-gram 19.4, pcllm-mr (n 4 + lookup 16)
    30.5, and each cut's own check below fails there: a tree mask is one host op (the view over its bytes; a zeroed
    tensor, its index and an indexed write before); one unpadded row's output goes to its drafter unsliced (two aliases
    a step); pcllm-mr's last winning kind of branch leads its prefix tree, so a commit along it moves no cache slots
    (a host tensor, its unbind and four indexing ops, in 0.79 of the steps before; a lookup branch wins most here).
    Since session 85 a step's host-built tokens and positions go in with the bucket's meta in one copy (no device
    tensor of them first, no copies between device buffers): AR 14 -> 10, n-gram 17 -> 13, pcllm-mr 22 -> 18; since
    session 89 as a packed buffer (`devices.int_tensor`: no `torch.tensor` and its two host ops): 7.8, 11.4, 15.5."""
    gpu_sync_count = emulated_sync_count(monkeypatch)
    cases = gpu_sync_count.text_cases("cpu")
    counts = {name: eager_ops_a_step(gpu_sync_count, lambda: cases[f"text {name} B1 T0"]().steps)
              for name in ("ar", "ngram", "pcllm-mr")}
    for _, by_op, _ in counts.values():
        assert by_op["specgen/decoding/pool.py", "alias.default"] == 0
    ops, by_op, _ = counts["pcllm-mr"]
    assert sum(n for (f, _), n in by_op.items() if f == "specgen/decoding/verify.py") < 2  # unbind, the mask's view
    assert by_op["specgen/models/cache.py", "index_put_.default"] < 2 * 0.25
    assert {name: ops <= budget for name, budget in (("ar", 8.5), ("ngram", 11.5), ("pcllm-mr", 16))
            for ops in [counts[name][0]]} == {"ar": True, "ngram": True, "pcllm-mr": True}, counts


@pytest.mark.parametrize("batch", [1, 2])
def test_an_image_tree_steps_eager_ops_stay_within_budget(monkeypatch, batch):
    """A captured ADT-Tree step's eager ops outside its replays (each a launch and a dispatch on a GPU). At de58c7e a
    step here was 57.6 at batch 1, 69.3 at batch 2 (29.3 and 41.6 since; 23.1 and 29.9 since an image's class
    position prefills as one replay, `CFGTarget.prefill`; 19.4 and 26.1 since a catch-up and its growth are one
    replay; 16.5 and 23.1 since host-built ints go in as a packed buffer), and each cut's own check below fails there
    (8.6 ops of image/target.py, 1.9 zero_, 2.9 clones, 1.9 host tensors of the growth's, 1 verify_batch a step): CFG's
    combine and the branches' repeat_interleave run inside the verify's replay (image/target.py's eager ops: its
    prefill's, once a sequence); padding keeps its buffers' values (no zero_); the catch-up's output is the drafter
    graph's own buffer (the clones are the target's two: its logits and features, which rows keep; its prefill's two
    are image/target.py's, once a sequence); a growth's host
    inputs are one tensor; a catch-up's tokens, positions and meta one host copy (no device tensor of them first:
    verify_batch's unbind only where a step verifies without a tree). In its graphs (at 8fb4577 embed_cat 5.6 a step,
    level_lists 3.6, a `where` and a RoPE gather 1 each): a growth's later levels take their inputs and attention lists
    from their beam, its first level's lists and every level's RoPE rows come from its setup."""
    ops, by_op, graph = tree_step_ops(monkeypatch, batch)
    assert graph["specgen/models/graphs.py", "specgen.embed_cat.default"] <= 2  # the catch-up's and level 1's
    assert not {op for f, op in graph if f == "specgen/methods/eagle_grow.py"} & {"aten.where.self", "aten.index.Tensor"}
    per_file = lambda name: sum(n for (f, _), n in by_op.items() if f == name)  # noqa: E731
    assert per_file("specgen/image/target.py") < batch
    assert sum(n for (_, op), n in by_op.items() if op.startswith("zero_")) == 0
    assert sum(n for (f, op), n in by_op.items() if op.startswith("clone") and f != "specgen/image/target.py") <= 2
    assert by_op["specgen/methods/eagle.py", "lift_fresh.default"] <= 1
    assert by_op["specgen/decoding/verify.py", "unbind.int"] < 0.5
    assert by_op["specgen/models/graphs.py", "lift_fresh.default"] == 0  # host ints packed (devices.int_tensor)
    assert ops <= {1: 18, 2: 24}[batch]


def launches(by_op: dict) -> Counter:
    """Of eager ops a step by (file, op), those that launch a kernel on a GPU: the sync count's VIEWS rule, and
    lift_fresh (a tensor made on the host) none."""
    import gpu_sync_count

    return Counter({(f, op): n for (f, op), n in by_op.items()
                    if gpu_sync_count.kernels_of(f"aten.{op}") and not op.startswith("lift_fresh")})


def test_a_tiny_tree_steps_real_launches_stay_within_budget(monkeypatch):
    """A tiny CFG image model's ADT-Tree step (`tree_step_ops`): a catch-up and its growth are one replay, each row's
    root gathered inside it (no copy, pad or join between them: devices.py's copies are the host inputs' alone, the
    catch-up's with its growth's ints, and the verify's). At 0845935 14.9 a step, 3.8 copies (13.9 and 2.9 since; 10.3
    and 2 since the catch-up and the growth share a replay)."""
    found = launches(tree_step_ops(monkeypatch, 1)[1])
    assert found["specgen/devices.py", "copy_.default"] <= 2 and sum(found.values()) <= 11, found


def test_a_run_ahead_tree_steps_real_launches_stay_within_budget(monkeypatch):
    """ADT-Tree with 4 tree steps a host read (`run_ahead`): a tree step's launches outside its three replays (the
    drafter's, the verify's, `advance`'s) are the verify's staging (its tokens, positions, tree and meta) and two
    clones and `advance`'s two input copies (the verify's outputs; the growth's tokens and mask reach it through the
    state, written inside the drafter's replay: 14.1 where they were its inputs too), and the loop step's read,
    commit and staging, shared by its steps (about 2 here: a 16-token budget cuts the steps). 12.1 a tree step when
    written (the per-step tree's 10.3)."""
    found = launches(tree_step_ops(monkeypatch, 1, {"run_ahead": 4})[1])
    assert sum(found.values()) <= 12.5, found


@pytest.mark.slow
def test_an_image_tree_steps_commit_is_one_launch(monkeypatch):
    """`--by-op "image adt-tree B1 T0"` (the shipped tiny image GPT, whose accepted paths move cache slots in 0.98 of
    the steps) with the commit as on CUDA: one op (`commit_slots`, registered for CPU tensors as torch's moves: the
    counter sees the op, not its inside; its Triton kernel's bits are test_cuda_ops.py's) where torch's commit
    gathers and scatters k and v (index and index_put_, twice each). Its real eager launches a step besides the image's VQ
    decode (once an image): 18.7 with torch's commit, 15.7 with the one op (a GPU's 60-node trees then, 43 steps an
    image; 15.0 at 16 nodes and 55 steps, where an image's prefill weighs less a step; a GPU's default is 31 nodes
    since session 60)."""
    from specgen.models import kernel_choice

    def moves(k, v, moved):
        row, src, dst = moved.unbind()
        k[:, row, :, dst] = k[:, row, :, src]
        v[:, row, :, dst] = v[:, row, :, src]

    sync_count = emulated_sync_count(monkeypatch)
    monkeypatch.setattr(kernel_choice, "one_pass", lambda x: x.dim() == 5)  # the commit's k [L, B, H, T, D] alone
    lib = torch.library.Library("specgen", "IMPL")  # noqa: TOR901
    lib.impl("commit_slots", moves, "CPU")
    try:
        c = sync_count.count(sync_count.image_cases("cpu")["image adt-tree B1 T0"], by_line=True)
    finally:
        lib._destroy()
    by_op = Counter()
    for (kind, line), n in sync_count.OpCounter.by_line.items():
        if kind == "eager":
            by_op[line.split(":")[0], line.split()[-1]] += n / c.steps
    sync_count.OpCounter.by_line = None
    found = launches(by_op)
    # a step's (an image's prefill puts its class position's keys and values in slot 0: `commit_first`, once an image)
    per_step = {op for (f, op), n in found.items() if f == "specgen/models/cache.py" and n > 0.5}
    assert per_step == {"commit_slots.default"}
    assert sum(n for (f, _), n in found.items() if f != "specgen/models/vq.py") <= 16.5, found


def mesh_step_ops(monkeypatch, case: str, ahead: bool = True) -> tuple[float, Counter]:
    """Eager ops a decode step of a `gpu_sync_count` mesh case (`--by-op CASE`'s first number: captured steps through
    the CPU replay emulation, replays not counted), and the ops a step by (file, op); `ahead`: XSpecMesh's heads run
    ahead as on a GPU (`ONE_READ`, the script's), else in `propose` as on a CPU."""
    from specgen.methods import xspecmesh_pool

    gpu_sync_count = emulated_sync_count(monkeypatch)
    if not ahead:
        monkeypatch.setattr(xspecmesh_pool, "ONE_READ", frozenset({"cuda"}))
    c = gpu_sync_count.count(gpu_sync_count.mesh_cases("cpu")[case], by_line=True)
    by_op = Counter()
    for (kind, line), n in gpu_sync_count.OpCounter.by_line.items():
        if kind == "eager":
            by_op[line.split(":")[0], line.split()[-1]] += n / c.steps
    gpu_sync_count.OpCounter.by_line = None
    return c.ops / c.steps, by_op


@pytest.mark.parametrize("ahead", [False, True])
def test_a_lossless_xspecmesh_steps_eager_ops_stay_within_budget(monkeypatch, ahead):
    """`mesh xspecmesh B1 T0`'s eager ops a step, with its heads run in `propose` (the CPU) and run ahead on every
    verify position (`ONE_READ`: a GPU). At 17f25cf 36.4 and 47.7 (mesh AR: 19.8); each cut's own check fails there:
    the heads' condition K/V is staged once a mesh, not copied in every call (devices.py's copies: the target's meta
    alone); their argmax and its float cast run inside their graph; the read-ahead heads take a row's verify positions
    as they are (no pad, repeat_interleave or tiled K/V), and the accept's hidden state is sliced only where a heads
    call reads it (12 ops of the pool's a step ahead, 7 in `propose`). Since the read-ahead heads run inside the
    verify's replay (`ReadAhead`: no staging copies, argmax or join outside it) 27.7 and 23.9, where 31 ran ahead;
    21.7 and 17.9 since a verify's host-built inputs go in with the bucket's meta in one copy; 16.6 and 12.8 since a
    mesh's prefill (the encoder, the conditions' K/V, the start's step) is one replay; 14.6 and 10.8 since host-built
    ints go in as a packed buffer (`devices.int_tensor`)."""
    ops, by_op = mesh_step_ops(monkeypatch, "mesh xspecmesh B1 T0", ahead)
    assert by_op["specgen/devices.py", "copy_.default"] < 1.5
    assert by_op["specgen/methods/xspecmesh_pool.py", "argmax.default"] < 0.5  # its graphs' captures (each generation)
    assert sum(n for (f, _), n in by_op.items() if f == "specgen/methods/xspecmesh_pool.py") <= 6.5
    assert ops <= {False: 15, True: 11.5}[ahead]
