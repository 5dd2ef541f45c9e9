"""Mesh commands through CliRunner: generate -> export-mesh, every format, benchmark, train-heads, bad inputs."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import torch
import trimesh
from typer.testing import CliRunner

from cli.main import app
from specgen.generate.mesh import load_conditions, read_file
from specgen.mesh.errors import MeshInputError
from specgen.mesh.export import EXPORT_FORMATS
from specgen.mesh.procedural import generate_mesh
from specgen.mesh.tokenizers import BPTTokenizer
from tests.mesh.mesh_fixtures import register_tiny

runner = CliRunner()


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def register_tiny_pair():
    register_tiny("tiny-mesh", "tiny-heads")


@pytest.fixture
def tiny(registered):
    registered(register_tiny_pair)


def invoke(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def one_error_line(r, code, needle):
    assert r.exit_code == code, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert "Traceback" not in r.output


def good_line(name="good", seed=3) -> str:
    m = generate_mesh(seed)
    return json.dumps({"name": name, "token_ids": BPTTokenizer().encode(m.vertices, m.faces).tolist()})


def test_help_has_examples():
    for sub in (["export-mesh"], ["train-heads"]):
        h = invoke(*sub, "--help")
        assert h.exit_code == 0 and "examples" in h.stdout
    assert "File format of the meshes" in invoke("export-mesh", "--help").stdout  # it said only "obj, ply, ..."


def test_generate_marks_rejection_lossless_only_without_an_adapter(tiny):
    """tiny-heads merge no adapter: criterion rejection keeps the model's distribution; the paper's rule does not."""
    opts = ["method_options.heads=tiny-heads", "method_options.sampling=tree", "method_options.top_k_tree=1"]
    rows = {}
    for crit in ("rejection", "threshold"):
        r = invoke("generate", "--method", "xspecmesh", "--num", "1", "--format", "json", "max_new_tokens=20",
                   *opts, f"method_options.criterion={crit}")
        assert r.exit_code == 0, r.output
        rows[crit] = json.loads(r.stdout.splitlines()[0])
    assert rows["rejection"]["lossless"] is True and rows["threshold"]["lossless"] is False
    t = invoke("generate", "--method", "xspecmesh", "--num", "1", "max_new_tokens=20", *opts,
               "method_options.criterion=rejection")
    assert t.exit_code == 0 and "rejection sampling" in t.stdout and "lossless" in t.stdout
    one_error_line(invoke("generate", "--method", "xspecmesh", "--num", "1", "method_options.heads=tiny-heads",
                          "method_options.criterion=rejection"), 2, "deterministic candidates")
    shipped = invoke("generate", "--method", "xspecmesh", "--num", "1", "--format", "json", "max_new_tokens=20",
                     *opts[1:], "method_options.criterion=rejection")  # the shipped stage-2 heads merge their LoRA
    assert shipped.exit_code == 0 and json.loads(shipped.stdout.splitlines()[0])["lossless"] is False


def test_quiet_leaves_the_result_table_on_stdout_as_its_help_says(tmp_path):
    """--quiet's help said "No progress bars or tables on stderr", yet export-mesh's and generate's mesh tables are
    results, on stdout (README: results on stdout, tables of statistics, logs and progress on stderr): --quiet leaves
    them, and quiets the warning of a sequence that does not decode."""
    from cli._options import QuietOpt

    assert "results stay on stdout" in QuietOpt.__metadata__[0].help
    text = good_line() + "\n" + json.dumps([4700, 5, 3]) + "\n"
    loud = invoke("export-mesh", "-", "-o", tmp_path / "a", input=text)
    assert loud.exit_code == 0 and "nothing written for it" in loud.stderr, loud.output
    r = invoke("export-mesh", "-", "-o", tmp_path / "b", "--quiet", input=text)
    assert r.exit_code == 0 and r.stderr == "" and "export-mesh ->" in r.stdout, r.output


def test_generate_json_then_export_reports_bad_sequences(tiny, tmp_path):
    r = invoke("generate", "--method", "xspecmesh", "--num", "2", "--format", "json", "max_new_tokens=30",
               "method_options.heads=tiny-heads", "method_options.delta=0.3")
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["name"] for x in rows] == ["test-1010000", "test-1010001"]
    done = [x for x in r.stderr.splitlines() if x.startswith("mesh ")]  # one line per mesh as it is done
    assert [x.split(":")[0] for x in done] == ["mesh 1/2", "mesh 2/2"]
    assert {x.split(": ")[1] for x in done} == {"test-1010000 decoded", "test-1010001 decoded"}
    assert all(x["heads"] == "heads/tiny-heads" and len(x["token_ids"]) <= 30 for x in rows)
    assert rows[0]["stats"]["scr"] >= 1.0 and not rows[0]["lossless"]
    # the random tiny model's sequences do not decode: reported with a position, skipped; the good one is written
    text = r.stdout + good_line() + "\n" + json.dumps([4700, 5, 3]) + "\n"
    e = invoke("export-mesh", "-", "-o", tmp_path / "out", "--format", "json", input=text)
    assert e.exit_code == 0, e.output
    out = [json.loads(x) for x in e.stdout.splitlines()]
    assert [x["valid"] for x in out] == [rows[0]["valid"], rows[1]["valid"], True, False]
    assert out[3]["error"].startswith("token ") and out[2]["faces"] > 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["good.obj"]
    assert "nothing written" in e.stderr


def test_ar_on_mesh_model_and_out_dir(tiny, tmp_path):
    """The random tiny model's meshes do not decode: the table still shows the run, then one line and exit 1, as
    export-mesh's for sequences of which none decodes (it exited 0 with nothing written)."""
    r = invoke("generate", "--method", "ar", "--model", "tiny-mesh", "-n", "1", "-o", tmp_path / "o",
               "max_new_tokens=20")
    assert r.exit_code == 1 and "none of the 1 meshes decodes" in r.stderr and "nothing written to" in r.stderr
    assert "test-1010000" in r.stdout and "ar on target/tiny-mesh" in r.stdout and not (tmp_path / "o").exists()
    assert "Traceback" not in r.output
    r = invoke("generate", "--method", "ar", "model=tiny-mesh+bf16", "-n", "1", "-o", tmp_path / "o",
               "max_new_tokens=20")  # NAME+bf16 as text takes it (was 'unknown checkpoint'); the title says it
    assert r.exit_code == 1 and "ar on target/tiny-mesh+bfloat16" in r.stdout


@pytest.mark.parametrize("fmt", sorted(EXPORT_FORMATS))
def test_export_every_format_reloads_same_faces(tmp_path, fmt):
    r = invoke("export-mesh", "-", "-o", tmp_path, "--mesh-format", fmt, "--format", "json", input=good_line())
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)
    mesh = trimesh.load(tmp_path / f"good.{fmt}", force="mesh", process=False)
    assert len(mesh.faces) == row["faces"] > 0


def test_export_preview_and_counts_cleaning(tmp_path):
    m = generate_mesh(4)
    tokens = BPTTokenizer().encode(m.vertices, m.faces).tolist()
    r = invoke("export-mesh", "-", "-o", tmp_path, "--preview", input=json.dumps(tokens))
    assert r.exit_code == 0 and (tmp_path / "mesh-000.png").stat().st_size > 1000
    assert "degenerate_removed" in r.stdout


def test_bad_point_clouds(tiny, tmp_path):
    nan = np.random.rand(300, 6)
    nan[5, 1] = np.nan
    np.save(tmp_path / "nan.npy", nan)
    np.save(tmp_path / "shape.npy", np.random.rand(300, 4))
    base = ["generate", "--method", "ar", "--model", "tiny-mesh", "max_new_tokens=5"]
    one_error_line(invoke(*base, "--point-clouds", tmp_path / "nan.npy"), 2, "NaN")
    one_error_line(invoke(*base, "--point-clouds", tmp_path / "shape.npy"), 2, "[N, 6] (points and normals)")
    one_error_line(invoke(*base, "--point-clouds", tmp_path / "missing.npy"), 2, "no such file")
    empty = tmp_path / "empty"
    empty.mkdir()
    one_error_line(invoke(*base, "--point-clouds", empty), 2, "no .npy or mesh files")
    (tmp_path / "empty.obj").write_text("v 0 0 0\nv 1 0 0\n")
    one_error_line(invoke(*base, "--point-clouds", tmp_path / "empty.obj"), 2, "no triangle faces")
    one_error_line(invoke(*base, "mesh_format=fbx", "-o", tmp_path / "o"), 2, "unknown mesh format")
    ok = tmp_path / "ok.npy"
    pts = np.random.randn(500, 6)
    np.save(ok, pts)
    r = invoke(*base, "--point-clouds", ok, "--format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["name"] == "ok"


@pytest.mark.parametrize("encoding", ["ascii", "binary_little_endian"])
def test_a_face_less_ply_is_read_as_a_point_cloud(tmp_path, encoding):
    pts = np.random.default_rng(0).standard_normal((40, 6)).astype(np.float32)
    names = ("x", "y", "z", "nx", "ny", "nz")
    for cols, name in ((names, "normals.ply"), (names[:3], "bare.ply")):
        header = [f"ply\nformat {encoding} 1.0\nelement vertex {len(pts)}\n"]
        header += [f"property float {c}\n" for c in cols] + ["end_header\n"]
        body = pts[:, : len(cols)]
        data = ("\n".join(" ".join(map(str, r)) for r in body.tolist()) + "\n").encode() if encoding == "ascii" \
            else body.astype("<f4").tobytes()
        (tmp_path / name).write_bytes("".join(header).encode() + data)
    (cond,) = read_file(tmp_path / "normals.ply", 100, 0)
    assert cond.name == "normals" and cond.points.shape == (100, 6)
    with pytest.raises(MeshInputError, match="no normals"):
        read_file(tmp_path / "bare.ply", 100, 0)


def test_export_shortens_a_long_name(tmp_path):
    """A name past a file name's length was "File name too long; write elsewhere" (exit 1), nothing written."""
    line = json.loads(good_line())
    r = invoke("export-mesh", "-", "-o", tmp_path, "--preview", input=json.dumps({**line, "name": "é" * 300}))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["é" * 100 + ".obj", "é" * 100 + ".png"]


def test_export_of_a_name_given_twice_numbers_the_file_as_every_writer_does(tmp_path):
    """Two sequences of one name (two generate outputs joined) were renamed `good_` (row and file), where every other
    writer keeps the name and numbers the new file (`good-1`, as the help and docs/cli.md say)."""
    r = invoke("export-mesh", "-", "-o", tmp_path, "--format", "json", input=good_line() + "\n" + good_line() + "\n")
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["name"] for x in rows] == ["good", "good"]
    assert [x["file"] for x in rows] == [str(tmp_path / "good.obj"), str(tmp_path / "good-1.obj")]


def test_unreadable_inputs_name_their_file(tmp_path):
    """A corrupt PLY, an empty batch and a mesh without area are refused as input errors naming the file (they were
    a bare ValueError/KeyError, exit 1, an empty run with exit 0, and a message without the file)."""
    (tmp_path / "empty.ply").write_bytes(b"")
    (tmp_path / "noxyz.ply").write_text("ply\nformat ascii 1.0\nelement vertex 3\nend_header\n1 2 3\n")
    np.save(tmp_path / "none.npy", np.zeros((0, 100, 6)))
    (tmp_path / "flat.obj").write_text("v 0 0 0\nv 1 0 0\nv 2 0 0\nf 1 2 3\n")
    for name, needle in (("empty.ply", "cannot read PLY"), ("noxyz.ply", "cannot read PLY"),
                         ("none.npy", "holds no point clouds"), ("flat.obj", "no surface area")):
        with pytest.raises(MeshInputError, match=needle) as e:
            read_file(tmp_path / name, 100, 0)
        assert str(e.value).startswith(str(tmp_path / name))


def test_a_npy_that_is_no_array_of_numbers_is_refused_without_pickle_advice(tmp_path):
    """A file named .npy that is not one (or holds Python objects) was refused with numpy's advice to load it
    `allow_pickle`, which no option gives and which this project never does."""
    (tmp_path / "junk.npy").write_bytes(b"junk")
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object))
    for name, needle in (("junk.npy", "not a .npy file (no NumPy header)"), ("objects.npy", "holds Python objects")):
        with pytest.raises(MeshInputError, match=re.escape(needle)) as e:
            read_file(tmp_path / name, 100, 0)
        assert str(e.value).startswith(str(tmp_path / name)) and "pickle" not in str(e.value)


def test_a_negative_seed_samples_user_clouds(tmp_path):
    """--seed takes any integer; numpy's generators refuse negative ones (was: ValueError, exit 1)."""
    np.save(tmp_path / "c.npy", np.random.default_rng(0).standard_normal((40, 6)))
    (cond,) = load_conditions(tmp_path / "c.npy", 1, 100, -1)
    assert cond.points.shape == (100, 6)
    assert (load_conditions(tmp_path / "c.npy", 1, 100, 5)[0].points == read_file(tmp_path / "c.npy", 100, 5)[0]
            .points).all()  # non-negative seeds sample as before


def test_inputs_sharing_a_name_are_named_apart(tmp_path):
    """sphere.obj and sphere.stl were both `sphere` (rows and files alike); a .npy batch's `a-0` met a-0.obj's."""
    sphere = trimesh.creation.icosphere(subdivisions=1)
    for name in ("sphere.obj", "sphere.stl", "a-0.obj", "box.obj"):
        (sphere if name != "box.obj" else trimesh.creation.box()).export(tmp_path / name)
    np.save(tmp_path / "a.npy", np.random.default_rng(0).standard_normal((2, 40, 6)))
    names = [c.name for c in load_conditions(tmp_path, 1, 100, 0)]
    assert names == ["a-0.obj", "a.npy-0", "a.npy-1", "box", "sphere.obj", "sphere.stl"]  # a lone stem keeps its name
    assert [c.name for c in load_conditions(tmp_path / "sphere.obj", 1, 100, 0)] == ["sphere"]


def test_mesh_usage_errors(tiny, tmp_path):
    register_tiny("other-mesh", "foreign-heads", parent="other-mesh")
    one_error_line(invoke("generate", "--method", "xspecmesh", "--model", "tiny-mesh",
                          "method_options.heads=foreign-heads"), 2, "trained for other-mesh")
    one_error_line(invoke("generate", "--method", "xspecmesh", "method_options.heads=tiny-heads",
                          "method_options.dleta=1"), 2, "no option")
    # heads named as the model, a backbone as the heads: were an AttributeError / "unknown builder None", exit 1
    one_error_line(invoke("generate", "--method", "ar", "--model", "tiny-heads"), 2,
                   "heads/tiny-heads is no mesh backbone")
    one_error_line(invoke("generate", "--method", "xspecmesh", "method_options.heads=tiny-mesh"), 2,
                   "target/tiny-mesh is no XSpecMesh heads entry")
    one_error_line(invoke("generate", "--method", "xspecmesh", "method_options.heads=tiny-heads",
                          "method_options.criterion=best"), 2, "criterion")
    # without --out-dir nothing is written: preview=true and mesh_format=glb ran with exit 0 and wrote no file
    for option in ("preview=true", "mesh_format=glb"):
        one_error_line(invoke("generate", "--method", "ar", "--model", "tiny-mesh", option), 2, "add --out-dir")
    one_error_line(invoke("export-mesh", "-", "--mesh-format", "fbx", input=good_line()), 2, "unknown mesh format")
    one_error_line(invoke("export-mesh", "-", input="\n"), 2, "no token sequences")
    one_error_line(invoke("export-mesh", "-", input="{oops\n"), 2, "<stdin> line 1: invalid JSON")
    one_error_line(invoke("export-mesh", "-", "-o", tmp_path / "x", input="[4700, 1]\n"), 1, "nothing written")
    assert not (tmp_path / "x").exists()
    one_error_line(invoke("train-heads", "--kind", "eagel", "--out", tmp_path), 2, "unknown heads kind")
    one_error_line(invoke("train-heads", "--kind", "xspecmesh"), 2, "--out")


def save_pt(model, path) -> None:
    torch.save(model.state_dict(), path)


def save_safetensors(model, path) -> None:
    from safetensors.torch import save_model

    save_model(model, str(path))


@pytest.mark.parametrize("save,name", [(save_pt, "w.pt"), (save_safetensors, "w.safetensors")])
def test_an_imported_mesh_backbone_is_a_mesh_model(tiny, tmp_path, save, name):
    # `registry import w.pt --builder mesh_gpt` recorded no modality: every mesh command said "is a text model".
    # safetensors: a tied head is stored once (a registry entry's model.safetensors, safetensors' save_model): the
    # import said "does not fit builder mesh_gpt: missing key decoder.output.weight" (only `output.weight` was known)
    from tests.mesh.mesh_fixtures import tiny_mesh_model

    model = tiny_mesh_model()
    assert model.decoder.output.weight is model.decoder.tok_embeddings.weight
    save(model, tmp_path / name)
    (tmp_path / "kw.json").write_text(json.dumps(model.builder_kwargs()))
    r = invoke("registry", "import", tmp_path / name, "--name", "my-mesh", "--builder", "mesh_gpt",
               "--kwargs", tmp_path / "kw.json")
    assert r.exit_code == 0, r.output
    r = invoke("generate", "--method", "ar", "--model", "my-mesh", "--num", "1", "max_new_tokens=4", "--format", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["model"] == "target/my-mesh", r.output
    # its vocabulary is recorded as a trained backbone's is (heads trained on it are checked against it): it was null
    r = invoke("registry", "show", "my-mesh")
    assert json.loads(r.stdout)["vocab_size"] == model.vocab_size, r.output


def test_benchmark_meshes_json(tiny):
    r = invoke("benchmark", "--suite", "meshes", "--model", "tiny-mesh", "--limit", "1", "--format", "json",
               "max_new_tokens=12", "num_heads=2", "heads={ca: tiny-heads}", "rows=[ar,ca]", "deltas=[0.9]",
               "topk_accept=[]", "tree_k=[2]", "depths=[1,2]", "sweep_row=ca", "draft_dtypes=[bfloat16]",
               "lookups=[2]", "path_cuts=[0.3]")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [x["row"] for x in rows] == ["ar", "ca", "ca p>0.9", "ca PTS K_s=2", "ca D=1", "ca bfloat16",
                                        "ca lookup 2", "ca cut 0.3"]  # D=2 is row ca
    assert "bf16 head logits" in rows[-3]["rule"] and "lookup 2-gram" in rows[-2]["rule"]
    assert rows[-1]["rule"].endswith("path cut 0.3 (lossy)")
    assert rows[-4]["scr"] <= 2.0  # one head: at most 2 tokens per step
    assert rows[0]["cd_box"] > 0 and rows[0]["cd_other_mesh"] is None  # one test mesh: no "other"
    assert rows[0]["speedup_vs_ar"] == 1.0 and rows[0]["rule"] == "lossless" and "lossy" in rows[1]["rule"]
    # the decode weight layout a table was measured with, and (packed) the measured kernel crossover
    layout = r" ((col|row) layout|packed layout(, (native|oneDNN) [-\w /,]+ rows)?)"
    assert re.search(layout + r", step kernels (native C( \([a-z, ]+\))?|torch)$", rows[0]["machine"])
    for key in ("cd", "hd", "valid_rate", "scr", "step_latency_ms", "speedup_scr_lat"):
        assert key in rows[1]
    phases = rows[1]["phase_ms_per_step"]  # where a step's time goes; the loop's own overhead is the rest
    assert {"propose", "verify", "accept", "commit"} <= set(phases)
    assert sum(phases.values()) <= rows[1]["step_latency_ms"] + 0.01


def test_benchmark_meshes_batched_rows_compare_with_batch_one_ar(tiny):
    """`vs_ar_b1` of a batched row is its tokens/s over batch-1 AR's (one shard: exactly that ratio)."""
    r = invoke("benchmark", "--suite", "meshes", "--model", "tiny-mesh", "--limit", "3", "--format", "json",
               "max_new_tokens=12", "num_heads=2", "heads={ca: tiny-heads}", "rows=[ar,ca]", "deltas=[]",
               "topk_accept=[]", "tree_k=[]", "depths=[]", "sweep_row=ca", "--batch-size", "1,3")
    assert r.exit_code == 0, r.output
    rows = {x["row"]: x for x in json.loads(r.stdout)}
    for label in ("ar@b3", "ca@b3"):
        assert rows[label]["vs_ar_b1"] == pytest.approx(rows[label]["tokens_per_s"] / rows["ar"]["tokens_per_s"],
                                                        rel=0.01)


def test_benchmark_report_shows_the_rows_methods_names(tiny, tmp_path):
    """`report --methods` keeps those rows (a batched row is its row's); it was ignored, every row printed."""
    run = tmp_path / "run"
    r = invoke("benchmark", "--suite", "meshes", "--model", "tiny-mesh", "--limit", "2", "--format", "json",
               "max_new_tokens=6", "num_heads=2", "heads={ca: tiny-heads}", "rows=[ar,ca]", "sweep_row=ca",
               "deltas=[0.9]", "topk_accept=[]", "tree_k=[]", "depths=[]", "--batch-size", "1,2", "--run-dir", run)
    assert r.exit_code == 0, r.output
    every = json.loads(r.stdout)
    assert [x["row"] for x in every] == ["ar", "ca", "ca p>0.9", "ar@b2", "ca@b2", "ca p>0.9@b2"]
    shown = invoke("benchmark", "report", run, "--methods", "ar,ca p>0.9", "--format", "json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == [every[i] for i in (0, 2, 3, 5)]  # the run's numbers, fewer rows
    one_error_line(invoke("benchmark", "report", run, "--methods", "ar,cb"), 2,
                   "--methods: the run has no row 'cb'; its rows: ar, ca, ca p>0.9")
    for machine in run.glob("machine-*.json"):  # torn: skipped, so no reference distances for the table
        machine.write_text("{torn")
    one_error_line(invoke("benchmark", "report", run), 2, "no machine file with the test meshes' reference distances")
    again = invoke("benchmark", "--suite", "meshes", "--model", "tiny-mesh", "--limit", "2", "--format", "json",
                   "max_new_tokens=6", "num_heads=2", "heads={ca: tiny-heads}", "rows=[ar,ca]", "sweep_row=ca",
                   "deltas=[0.9]", "topk_accept=[]", "tree_k=[]", "depths=[]", "--batch-size", "1,2", "--run-dir", run)
    assert again.exit_code == 0 and again.stdout, (again.stdout, again.stderr)
    assert json.loads(again.stdout) == every  # as the line says: rewritten


def test_benchmark_meshes_options_apply_to_every_heads_row(tiny):
    r = invoke("benchmark", "--suite", "meshes", "--model", "tiny-mesh", "--limit", "1", "--format", "json",
               "max_new_tokens=8", "num_heads=2", "heads={ca: tiny-heads}", "rows=[ar,ca]", "deltas=[]",
               "topk_accept=[]", "tree_k=[1]", "depths=[1]", "sweep_row=ca", "options={lookup: 1}")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [x["rule"] for x in rows] == ["lossless"] + [f"p>0.5, {s}, lookup 1-gram (lossy)" for s in ("IS", "PTS(K_s=1)", "IS")]
    one_error_line(invoke("benchmark", "--suite", "meshes", "--model", "tiny-mesh", "--limit", "1",
                          "heads={ca: tiny-heads}", "rows=[ar,ca]", "options={lookahead: 1}"), 2, "lookahead")


def test_benchmark_meshes_row_options_override_options_for_one_row(tiny):
    r = invoke("benchmark", "--suite", "meshes", "--model", "tiny-mesh", "--limit", "1", "--format", "json",
               "max_new_tokens=8", "num_heads=2", "heads={ca: tiny-heads, cav: tiny-heads}", "rows=[ar,ca,cav]",
               "deltas=[]", "topk_accept=[]", "tree_k=[]", "depths=[1]", "sweep_row=cav", "options={lookup: 1}",
               "row_options={cav: {lookup: 0, vertex_lookup: true}}", "merged_ar=[cav]")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [x["rule"] for x in rows] == ["lossless", "p>0.5, IS, lookup 1-gram (lossy)", "p>0.5, IS, vertex lookup (lossy)",
                                         "lossless", "p>0.5, IS, vertex lookup (lossy)"]  # ar+cav, then cav D=1
    assert rows[3]["row"] == "ar+cav" and rows[3]["method"] == "ar" and rows[3]["scr"] == 1.0
    # tiny-heads carry no adapter, so their backbone is the target itself: same seeds, same tokens as row ar
    assert rows[3]["heads"] == "tiny-heads" and (rows[3]["mean_tokens"], rows[3]["cd"]) == (rows[0]["mean_tokens"], rows[0]["cd"])
    one_error_line(invoke("benchmark", "--suite", "meshes", "--model", "tiny-mesh", "--limit", "1",
                          "heads={ca: tiny-heads}", "rows=[ar,ca]", "row_options={ca: {vertex: 1}}"), 2,
                   "row_options.ca")


def test_shipped_models_generate_then_export(tmp_path):
    # default heads: stage 2 CA heads + their LoRA merged into the shipped backbone
    r = invoke("generate", "--method", "xspecmesh", "--num", "1", "--format", "json", "max_new_tokens=8")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)
    assert row["model"] == "target/mesh-gpt-tiny" and row["adapter"] == "adapter/xspecmesh-ca-tiny-lora"
    # stage-1 heads leave the backbone unchanged; it ends its sequences (EOS) within the budget
    r = invoke("generate", "--method", "xspecmesh", "--num", "2", "--format", "json", "--seed", "0",
               "method_options.heads=xspecmesh-ca-tiny-s1")
    assert r.exit_code == 0, r.output
    e = invoke("export-mesh", "-", "-o", tmp_path, "--mesh-format", "ply", "--format", "json", input=r.stdout)
    assert e.exit_code == 0, e.output
    out = [json.loads(x) for x in e.stdout.splitlines()]
    assert any(x["valid"] and x["faces"] > 0 for x in out)
    for x in out:
        if x["valid"]:
            assert len(trimesh.load(x["file"], force="mesh", process=False).faces) == x["faces"]


@pytest.mark.slow
def test_mesh_benchmark_rows_at_several_precisions_in_one_run():
    """`dtypes` gives a row its own precision (its backbone and heads loaded once in that dtype); unknown rows fail."""
    args = ["benchmark", "--suite", "meshes", "--limit", "1", "--max-new-tokens", "40", "rows=[ar,ca+lora]",
            "deltas=[]", "topk_accept=[]", "tree_k=[]", "depths=[]", "--format", "json"]
    r = CliRunner().invoke(app, [*args, "dtypes={ca+lora: bfloat16}"])
    assert r.exit_code == 0, r.output
    assert [(x["row"], x["dtype"]) for x in json.loads(r.stdout)] == [("ar", "float32"), ("ca+lora", "bfloat16")]
    r = CliRunner().invoke(app, [*args, "dtypes={nope: bfloat16}"])
    assert r.exit_code == 2 and "dtypes.nope: no such row" in r.stderr
    r = CliRunner().invoke(app, [*args, "dtypes={ca+lora: int8}"])  # a quantized row: the decoder int8 at load
    assert r.exit_code == 0, r.output
    assert [(x["row"], x["dtype"]) for x in json.loads(r.stdout)] == [("ar", "float32"), ("ca+lora", "int8")]
    r = CliRunner().invoke(app, [*args, "dtype=int8"])
    assert r.exit_code == 2 and "per-row precision" in r.stderr


@pytest.mark.parametrize("other, shown", [(None, "another test mesh - (one test mesh)"), (0.3474, "another test mesh 0.3474")])
def test_the_mesh_benchmark_title_says_when_there_is_no_other_test_mesh(tmp_path, other, shown):
    """With one test mesh (`--limit 1`) the title said `another test mesh None`."""
    from cli.benchmark_runs import SUITES
    from specgen.eval.mesh_bench import MeshBenchConfig
    from specgen.eval.run_dir import RunDir

    rows = [{"row": "ar", "cd_box": 0.5885, "cd_other_mesh": other}]
    [(title, _, _)] = SUITES["meshes"].tables(rows, MeshBenchConfig(limit=1), RunDir(tmp_path, "meshes", {}))
    assert title.endswith(f"reference CD: a box 0.5885, {shown}") and "None" not in title


def test_a_mesh_write_the_device_refuses_names_the_folder(tmp_path, monkeypatch):
    """`generate -o` said only "error: No space left on device" (export-mesh named the folder): both write through
    `write_files`, which names it and removes a folder it made for nothing."""
    import errno
    import os

    import specgen.mesh.export as export
    from cli.generate_mesh import write_files
    from specgen.errors import RuntimeFailure

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(export, "atomic_write_bytes", full)
    m = generate_mesh(3)
    out = tmp_path / "deep" / "meshes"
    with pytest.raises(RuntimeFailure, match=re.escape(f"cannot write meshes in {out} (No space left on device)")):
        write_files(m.vertices, m.faces, out, "m", "obj", False)
    assert not (tmp_path / "deep").exists()


def test_a_mesh_file_another_writer_made_meanwhile_is_kept(tmp_path, monkeypatch):
    """Two runs writing meshes of one name into one --out-dir: a file the other run made after this one picked its
    free name (free_stem) was replaced (the write was an atomic rename over it); like images, a mesh and its preview
    are linked into place under the next free name instead."""
    import cli.generate_mesh as cli_mesh

    real = cli_mesh.free_stem

    def racing(folder, stem, suffixes):  # the other writer's files land right after the name was picked
        picked = real(folder, stem, suffixes)
        for suffix in suffixes:
            (folder / f"{picked}{suffix}").write_text("the other run's")
        return picked

    monkeypatch.setattr(cli_mesh, "free_stem", racing)
    m = generate_mesh(3)
    path, png = cli_mesh.write_files(m.vertices, m.faces, tmp_path, "m", "obj", True)
    assert (tmp_path / "m.obj").read_text() == (tmp_path / "m.png").read_text() == "the other run's"
    assert (path, png) == (tmp_path / "m-1.obj", str(tmp_path / "m-1.png")) and "\nv " in path.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m-1.obj", "m-1.png", "m.obj", "m.png"]


def test_a_killed_runs_preview_temporary_goes_when_the_next_run_picks_another_stem(tmp_path):
    """Run 1 wrote m.obj and was killed writing its preview: the next run's mesh takes m-1, whose sweep saw only
    m-1's temporaries, so `.m.png.<hex>.tmp` stayed for good. Fresh ones (a live writer's) and other names' stay."""
    import time

    import cli.generate_mesh as cli_mesh

    (tmp_path / "m.obj").write_text("run 1's")
    names = (".m.png.ab12cd34.tmp", ".m-3.obj.ab12cd34.tmp", ".m.png.ef56ab78.tmp", ".n.png.ab12cd34.tmp")
    stale, stale_numbered, live, other = (tmp_path / n for n in names)
    for f in (stale, stale_numbered, live, other):
        f.write_bytes(bytes(8))
    for f in (stale, stale_numbered, other):
        os.utime(f, (time.time() - 2 * 3600,) * 2)
    m = generate_mesh(3)
    assert cli_mesh.write_files(m.vertices, m.faces, tmp_path, "m", "obj", True)[0] == tmp_path / "m-1.obj"
    assert not stale.exists() and not stale_numbered.exists() and live.exists() and other.exists()


def test_an_out_dir_that_is_a_link_to_nothing_is_refused_before_the_work(tmp_path):
    """A dangling link as --out-dir (or above it) passed the up-front check and failed "File exists" (exit 1) at the
    first file, after every mesh or image was decoded."""
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    for out in (tmp_path / "gone", tmp_path / "gone" / "sub"):
        one_error_line(invoke("export-mesh", "-", "-o", out, input=good_line()), 2,
                       f"{tmp_path / 'gone'} is a link to {tmp_path / 'nowhere'}, which does not exist")
    assert not (tmp_path / "nowhere").exists()
