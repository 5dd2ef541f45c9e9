"""`specgen generate` for images end to end on a tiny random registered target, VQ and EAGLE drafter."""

from __future__ import annotations

import json
import os

import pytest
import torch
from typer.testing import CliRunner

from cli.main import app
from specgen import registry
from specgen.models.eagle import EagleNet
from specgen.models.vq import VQ_CONFIGS, VQModel
from tests.image.helpers import tiny_image_gpt

runner = CliRunner()
GRID = 4


def register_tiny_image():
    """target/t-gpt (VQ t-vq, drafter t-eagle) in the current SPECGEN_HOME, the same weights at every call."""
    torch.manual_seed(0)
    vq_cfg = VQ_CONFIGS["vq-tiny"]
    vq = VQModel(vq_cfg)
    registry.save("vq", "t-vq", vq.state_dict(), {"builder": "vq", "kwargs": vq_cfg.to_dict()})
    gpt = tiny_image_gpt(0, grid=GRID, vocab=vq_cfg.codebook_size, classes=3)
    registry.save("target", "t-gpt", gpt.state_dict(), {
        "builder": "transformer", "kwargs": gpt.cfg.to_dict(), "modality": "image", "vq": "vq/t-vq",
        "grid": GRID, "classes": ["cat", "dog", "sky"], "vocab_size": vq_cfg.codebook_size, "drafter": "draft/t-eagle"})
    net = EagleNet.from_target(gpt)
    registry.save("draft", "t-eagle", net.state_dict(), {
        "builder": "eagle", "kwargs": net.cfg.to_dict(), "parent": "target/t-gpt", "vocab_size": vq_cfg.codebook_size})


@pytest.fixture
def tiny_image(tmp_path, registered):
    registered(register_tiny_image)
    return tmp_path


@pytest.fixture(scope="module")
def ar_tokens(tmp_path_factory):
    """AR's greedy tokens for dog, sky: the reference every lossless method is compared with (run once)."""
    tmp = tmp_path_factory.mktemp("ar")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECGEN_HOME", str(tmp / "home"))
        register_tiny_image()
        r = gen(tmp / "out", "--method", "ar", "--format", "json", "--classes", "dog,sky", "--temperature", "0")
    assert r.exit_code == 0, r.output
    return [i["tokens"] for i in json.loads(r.stdout)["images"]]


def gen(out, *args):
    return runner.invoke(app, ["generate", "--model", "t-gpt", "--num", "2", "-o", str(out), *args])


@pytest.mark.parametrize("method", ["ar", "eagle2", "adt-tree", "lantern", "adt-tree+lantern"])
def test_generate_images_json(tiny_image, ar_tokens, method):
    out = tiny_image / method
    r = gen(out, "--method", method, "--format", "json", "--classes", "dog,sky", "--temperature", "0")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [i["class"] for i in doc["images"]] == ["dog", "sky"]
    assert all(len(i["tokens"]) == GRID * GRID for i in doc["images"])
    assert (out / f"{method}-grid.png").is_file() and len(list(out.glob("*.png"))) == 3
    assert doc["stats"]["nfe"] >= 1 and doc["lossless"] == ("lantern" not in method)
    if "lantern" not in method:  # lossless: identical tokens at T = 0 (and AR run twice is deterministic)
        assert [i["tokens"] for i in doc["images"]] == ar_tokens


@pytest.mark.parametrize("args,needle", [
    (["--method", "adt-tree", "--classes", "dgo"], "did you mean dog"),
    (["--method", "adt-tree", "--cfg-scale", "-1"], "cfg_scale"),
    (["--method", "eagle2", "method_options.depth=0"], "depth"),
    (["--method", "adt-tree", "method_options.d0=20"], "bounds"),
    (["--method", "adt-tree", "method_options.init=diagonal"], "init must be"),
    (["--method", "lantern", "method_options.lantern_delta=2"], "delta"),
    (["--method", "ngram"], "is for text"),
    # more classes than images: the last was left out unsaid (cycled over --num 2: cat, dog)
    (["--method", "ar", "--classes", "cat,dog,sky"], "--classes names 3 classes but --num 2 draws 2: sky"),
])
def test_bad_image_input(tiny_image, args, needle):
    out = tiny_image / "bad"
    r = gen(out, *args)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not list(out.glob("*.png")) if out.exists() else True


@pytest.mark.parametrize("model", ["tiny-image-upsampler-2x", "tiny-image-eagle", "tiny-image-vq"])
def test_an_image_entry_that_is_no_target_as_the_model_is_one_line(tiny_image, model):
    """--model UPSAMPLER failed "AttributeError: 'UpsamplerConfig' object has no attribute 'vocab_size'" (exit 1),
    and a drafter or VQ said it 'records no VQ decoder; import it with --vq NAME', after loading it."""
    r = runner.invoke(app, ["generate", "--model", model, "-n", "1", "-o", str(tiny_image / "o")])
    assert r.exit_code == 2 and "is not a target entry; --model takes an image GPT" in r.stderr, r.output
    assert len(r.stderr.strip().splitlines()) == 1 and not (tiny_image / "o").exists()


def test_drafter_for_another_target_and_codebook_mismatch(tiny_image):
    other = tiny_image_gpt(1, grid=GRID, vocab=512, classes=3)
    registry.save("target", "other", other.state_dict(), {"builder": "transformer", "kwargs": other.cfg.to_dict(),
                                                         "modality": "image", "vq": "vq/t-vq", "grid": GRID,
                                                         "vocab_size": 512, "drafter": "draft/t-eagle"})
    r = runner.invoke(app, ["generate", "--model", "other", "--method", "eagle2", "-o", str(tiny_image / "o")])
    assert r.exit_code == 2 and "trained for target/t-gpt" in r.stderr
    small = tiny_image_gpt(2, grid=GRID, vocab=64, classes=3)
    registry.save("target", "small", small.state_dict(), {"builder": "transformer", "kwargs": small.cfg.to_dict(),
                                                         "modality": "image", "vq": "vq/t-vq", "grid": GRID})
    r = runner.invoke(app, ["generate", "--model", "small", "--method", "ar", "-o", str(tiny_image / "s")])
    assert r.exit_code == 2 and "codes" in r.stderr


def test_drafter_flag(tiny_image, ar_tokens):
    """--drafter picks the EAGLE drafter (lossless: same tokens as ar); a foreign one and a text model refuse it."""
    tree = gen(tiny_image / "d", "--format", "json", "--classes", "dog,sky", "-t", "0", "--method", "adt-tree",
               "--drafter", "t-eagle")
    assert tree.exit_code == 0, tree.output
    assert [i["tokens"] for i in json.loads(tree.stdout)["images"]] == ar_tokens
    other = tiny_image_gpt(1, grid=GRID, vocab=512, classes=3)
    registry.save("target", "other2", other.state_dict(), {"builder": "transformer", "kwargs": other.cfg.to_dict(),
                                                          "modality": "image", "vq": "vq/t-vq", "grid": GRID,
                                                          "vocab_size": 512})
    r = runner.invoke(app, ["generate", "--model", "other2", "--method", "eagle2", "--drafter", "t-eagle",
                            "-o", str(tiny_image / "o2")])
    assert r.exit_code == 2 and "trained for target/t-gpt" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = gen(tiny_image / "o3", "--method", "mulo-sd", "--drafter", "t-eagle")  # ignored there: refused
    assert r.exit_code == 2 and "method_options.lowres" in r.stderr, r.output
    r = runner.invoke(app, ["generate", "--method", "ngram", "--drafter", "t-eagle", "--prompt", "hi"])
    assert r.exit_code == 2 and "--drafter" in r.stderr, r.output
    r = runner.invoke(app, ["generate", "--method", "xspecmesh", "--drafter", "t-eagle", "--num", "1"])
    assert r.exit_code == 2 and "method_options.heads" in r.stderr, r.output  # what a mesh run uses instead


@pytest.mark.parametrize("method,title", [("lantern", "T=0.0, LOSSY)"), ("eagle2", "T=0.0)")])
def test_the_table_says_whether_a_method_is_lossy(tiny_image, method, title):
    r = gen(tiny_image / method, "--method", method, "--num", "1", "--temperature", "0")
    assert r.exit_code == 0 and title in r.stderr, r.output


def test_unwritable_output_folder(tiny_image):
    blocker = tiny_image / "file"
    blocker.write_text("x")
    r = gen(blocker / "sub", "--method", "ar")
    assert r.exit_code == 2 and "cannot create output folder" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_image_benchmark_suite(tiny_image):
    out = tiny_image / "bench"
    r = runner.invoke(app, ["benchmark", "--suite", "images", "--model", "t-gpt", "--limit", "2", "--format", "json",
                            "out_dir=" + str(out), "classifier=",  # none
                            "methods=[ar,adt-tree,lantern]"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert {(x["method"], x["temperature"]) for x in rows} == {(m, t) for m in ("ar", "adt-tree", "lantern")
                                                              for t in (0.0, 1.0)}
    by = {(x["method"], x["temperature"]): x for x in rows}
    assert by[("adt-tree", 0.0)]["exact_match_vs_ar"] == 1.0 and by[("adt-tree", 0.0)]["lossless"]
    assert not by[("lantern", 0.0)]["lossless"]
    assert all(x["nll"] > 0 for x in rows) and "no classifier metrics" in rows[0]["quality_note"]
    assert (out / "adt-tree-T0-grid.png").is_file() and (out / "speed-quality-T1.png").is_file()


def test_benchmark_refuses_a_classifier_that_is_another_model(tiny_image):
    # a target named as the classifier failed exit 1 with "AttributeError: ... no attribute 'image_size'"
    r = runner.invoke(app, ["benchmark", "--suite", "images", "--model", "t-gpt", "--limit", "1", "methods=[ar]",
                            "temperatures=[0]", f"out_dir={tiny_image / 'bench'}", "classifier=t-gpt"])
    assert r.exit_code == 2 and "target/t-gpt is not an image classifier" in r.stderr, r.output
    assert len(r.stderr.strip().splitlines()) == 1 and not (tiny_image / "bench").exists()


def test_benchmark_refuses_an_out_dir_it_cannot_make_before_the_work(tiny_image):
    (tiny_image / "file").write_text("x")  # the grids and plots would fail only once every row was measured
    r = runner.invoke(app, ["benchmark", "--suite", "images", "--model", "t-gpt", "--limit", "1",
                            f"out_dir={tiny_image / 'file' / 'sub'}", "methods=[ar]"])
    assert r.exit_code == 2 and "out_dir=" in r.stderr and "is a file" in r.stderr, r.output
    assert "image" not in r.stdout and len(r.stderr.strip().splitlines()) == 1


def test_benchmark_report_writes_the_grids_where_it_is_told(tiny_image):
    """A run folder whose recorded out_dir cannot be written here (another machine's path) could not be reported at
    all: the refusal names out_dir=DIR, which writes the grids there; `out_dir=` writes none; the rest of the
    config is the run's, as measured."""
    run = tiny_image / "run"
    r = runner.invoke(app, ["benchmark", "--suite", "images", "--model", "t-gpt", "--limit", "1", "methods=[ar]",
                            "temperatures=[0.0]", "quality=false", f"out_dir={tiny_image / 'b'}", "--run-dir", str(run),
                            "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads((run / "run.json").read_text())
    (tiny_image / "file").write_text("x")  # as another machine's folder: it cannot be made here
    doc["config"]["out_dir"] = str(tiny_image / "file" / "grids")
    (run / "run.json").write_text(json.dumps(doc))
    for args, needle in [([], "out_dir=DIR writes them elsewhere"), (["limit=2"], "its one override is out_dir=DIR")]:
        r = runner.invoke(app, ["benchmark", "report", str(run), *args])
        assert r.exit_code == 2 and needle in r.stderr and not r.stdout, r.output
        assert len(r.stderr.strip().splitlines()) == 1
    shown = runner.invoke(app, ["benchmark", "report", str(run), f"out_dir={tiny_image / 'c'}", "--format", "json"])
    assert shown.exit_code == 0 and [x["method"] for x in json.loads(shown.stdout)] == ["ar"], shown.output
    assert (tiny_image / "c" / "ar-T0-grid.png").is_file()
    before = sorted(tiny_image.rglob("*"))
    bare = runner.invoke(app, ["benchmark", "report", str(run), "out_dir=", "--format", "json"])
    assert bare.exit_code == 0 and json.loads(bare.stdout) == json.loads(shown.stdout), bare.output
    assert sorted(tiny_image.rglob("*")) == before  # no grid or plot anywhere


def test_benchmark_report_writes_the_grids_of_the_rows_it_shows(tiny_image):
    """`report RUN --methods ar` wrote every row's grid (lantern's too) and plotted every row, showing one."""
    run, grids = tiny_image / "run", tiny_image / "grids"
    r = runner.invoke(app, ["benchmark", "--suite", "images", "--model", "t-gpt", "--limit", "1",
                            "methods=[ar,lantern]", "temperatures=[0.0]", "quality=false", "out_dir=", "--run-dir",
                            str(run), "--format", "json"])
    assert r.exit_code == 0, r.output
    shown = runner.invoke(app, ["benchmark", "report", str(run), f"out_dir={grids}", "--methods", "ar",
                                "--format", "json"])
    assert shown.exit_code == 0 and [x["method"] for x in json.loads(shown.stdout)] == ["ar"], shown.output
    assert sorted(p.name for p in grids.iterdir()) == ["ar-T0-grid.png", "speed-quality-T0.png"]


def test_a_resume_with_another_limit_names_the_option_given(tiny_image):
    """The images suite's `--limit` sets `num`: the refusal named `num`, a key the command line never gave."""
    args = ["benchmark", "--suite", "images", "--model", "t-gpt", "methods=[ar]", "temperatures=[0.0]",
            "quality=false", "out_dir=", "--run-dir", str(tiny_image / "run")]
    run = runner.invoke(app, [*args, "--limit", "1"])
    assert run.exit_code == 0, run.output
    for given, needle in [(["--limit", "2"], "another config: --limit (1 -> 2);"),
                          (["num=2"], "another config: num (1 -> 2);")]:
        r = runner.invoke(app, [*args, *given])
        assert r.exit_code == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output


def test_benchmark_suite_comes_from_the_recipe(tiny_image):
    cfg = tiny_image / "bench.yaml"
    cfg.write_text(f"suite: images\nmodel: t-gpt\nnum: 1\ntemperatures: [0.0]\nmethods: [ar]\nquality: false\n"
                   f"out_dir: {tiny_image / 'b'}\n")
    r = runner.invoke(app, ["benchmark", "--config", str(cfg), "--format", "json"])
    assert r.exit_code == 0, r.output
    assert [x["method"] for x in json.loads(r.stdout)] == ["ar"]


def test_image_benchmark_rows_at_several_precisions_in_one_run(tiny_image):
    """`dtypes` gives entries their own precision (a dtype or a quantization): bf16 and int8 rows run interleaved
    with float32 ones, and a lossless row equals AR of the same precision (exact_match_vs_own_ar), whatever it
    does against float32 AR."""
    r = runner.invoke(app, ["benchmark", "--suite", "images", "--model", "t-gpt", "--limit", "2", "--format", "json",
                            "out_dir=" + str(tiny_image / "b"), "quality=false", "temperatures=[0.0]",
                            "methods=[ar,ar@bf16,adt-tree@bf16,ar@int8,adt-tree@int8]",
                            "dtypes={ar@bf16: bfloat16, adt-tree@bf16: bfloat16, ar@int8: int8, adt-tree@int8: int8}"])
    assert r.exit_code == 0, r.output
    rows = {x["method"]: x for x in json.loads(r.stdout)}
    assert [rows[m]["dtype"] for m in ("ar", "ar@bf16", "adt-tree@bf16", "adt-tree@int8")] == [
        "float32", "bfloat16", "bfloat16", "int8"]
    assert all(rows[m]["exact_match_vs_own_ar"] == 1.0 for m in ("ar@bf16", "adt-tree@bf16", "adt-tree@int8"))
    r = runner.invoke(app, ["benchmark", "--suite", "images", "--model", "t-gpt", "methods=[ar]", "dtypes={x: bfloat16}"])
    assert r.exit_code == 2 and "dtypes.x: no such row" in r.stderr


def test_generate_with_int8_weights(tiny_image):
    """`generate --quantize int8`: ADT-Tree decodes AR's tokens of the same int8 GPT (int8 benchmark rows: above);
    int8 as a benchmark run's own dtype (the model the quality columns are measured under) is refused in one line."""
    out = [runner.invoke(app, ["generate", "--model", "t-gpt", "--num", "2", "--temperature", "0", "--quantize",
                               "int8", "--method", m, "-o", str(tiny_image / m), "--format", "json"]) for m in
           ("ar", "adt-tree")]
    assert all(o.exit_code == 0 for o in out), [o.output for o in out]
    ar, tree = ([i["tokens"] for i in json.loads(o.stdout)["images"]] for o in out)
    assert tree == ar
    r = runner.invoke(app, ["benchmark", "--suite", "images", "--model", "t-gpt", "methods=[ar]", "dtype=int8"])
    assert r.exit_code == 2 and "per-row precision" in r.stderr


def test_a_model_name_with_a_precision_suffix_is_that_precision(tiny_image):
    """`--model NAME+int8` is `--model NAME --quantize int8`, as text takes it (was 'unknown checkpoint'); the output
    names the weights' precision (the entry's name does not: image GPTs are quantized at load)."""
    out = [json.loads(gen(tiny_image / o, "--method", "ar", "--temperature", "0", "--format", "json", *x).stdout)
           for o, x in (("a", ["--quantize", "int8"]), ("b", ["--model", "t-gpt+int8"]))]
    assert [i["tokens"] for i in out[0]["images"]] == [i["tokens"] for i in out[1]["images"]]
    assert out[0]["model"] == out[1]["model"] == "target/t-gpt+int8"


def test_a_row_precision_that_is_none_names_its_key(tiny_image):
    # was "--dtype must be one of float32, bfloat16, float16": an option not given, and no word of int8/int4
    r = runner.invoke(app, ["benchmark", "--suite", "images", "--model", "t-gpt", "methods=[ar,ar@x]",
                            "dtypes={ar@x: int3}"])
    assert r.exit_code == 2 and "dtypes.ar@x must be one of float32, bfloat16, float16, int8, int4" in r.stderr


def test_each_image_is_written_and_reported_as_it_is_done(tiny_image, monkeypatch):
    from specgen.generate.image import PngWriter

    r = gen(tiny_image / "all", "--method", "ar", "--classes", "dog,sky")
    assert r.exit_code == 0, r.output
    lines = [x for x in r.stderr.splitlines() if x.startswith("image ")]
    assert [x.split(":")[0] for x in lines] == ["image 1/2", "image 2/2"] and "ar-000-dog.png" in lines[0]
    real = PngWriter.add

    def add_then_interrupt(self, j, label, pixels):  # Ctrl-C after the first image: its file stays
        path = real(self, j, label, pixels)
        raise KeyboardInterrupt

    monkeypatch.setattr(PngWriter, "add", add_then_interrupt)
    out = tiny_image / "cut"
    r = gen(out, "--method", "ar", "--classes", "dog,sky")
    assert r.exit_code == 130 and [p.name for p in out.glob("*.png")] == ["ar-000-dog.png"]


def test_the_image_benchmark_table_marks_each_lossy_row_and_names_only_the_rows_it_has(tmp_path):
    """Each lossy row's `lossless` cell says LOSSY (it said False); the title names the table's lossy rows (it
    named lantern, vvs and mulo-sd whatever the rows were). The JSON rows keep the boolean."""
    from cli.benchmark_runs import SUITES
    from specgen.eval.image_bench import ImageBenchConfig
    from specgen.eval.run_dir import RunDir

    rows = [{"method": m, "lossless": ok, "temperature": t} for m, ok in (("ar", True), ("lantern", False),
                                                                          ("vvs@u", False)) for t in (0.0, 1.0)]
    rows.append({"method": "lantern@b2", "batch_size": 2, "lossless": False, "temperature": 0.0})  # named once
    sink = RunDir(tmp_path, "images", {})
    [(title, shown, columns)] = SUITES["images"].tables(rows, ImageBenchConfig(), sink)
    assert "LOSSY rows: lantern, vvs@u;" in title and "mulo-sd" not in title
    assert [r["lossless"] for r in shown] == ["yes", "yes", *["LOSSY"] * 5] and "lossless" in columns
    assert rows[2]["lossless"] is False
    [(title, shown, _)] = SUITES["images"].tables(rows[:2], ImageBenchConfig(), sink)
    assert "LOSSY" not in title


def test_a_model_without_class_names_cycles_every_class_and_refuses_an_id_past_them(tiny_image):
    """An entry that records no class names (an imported c2i GPT) drew every image from class 0, and an id past its
    classes failed in the forward (exit 1) or took the null class."""
    gpt = tiny_image_gpt(0, grid=GRID, vocab=VQ_CONFIGS["vq-tiny"].codebook_size, classes=3)
    registry.save("target", "nameless", gpt.state_dict(), {"builder": "transformer", "kwargs": gpt.cfg.to_dict(),
                                                          "modality": "image", "vq": "vq/t-vq", "grid": GRID})
    r = runner.invoke(app, ["generate", "--model", "nameless", "--method", "ar", "-n", "4", "-t", "0", "-f", "json",
                            "-o", str(tiny_image / "n")])
    assert r.exit_code == 0, r.output
    assert [i["label"] for i in json.loads(r.stdout)["images"]] == [0, 1, 2, 0]
    for classes, needle in [("3", "class id 3 is out of range: the model has 3 classes, ids 0-2"),
                            ("dog", "the model records no class names: give ids 0-2")]:
        r = runner.invoke(app, ["generate", "--model", "nameless", "--method", "ar", "--classes", classes,
                                "-o", str(tiny_image / "m")])
        assert r.exit_code == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output
        assert not (tiny_image / "m").exists()


def test_an_empty_out_dir_override_is_refused_not_this_folder(tiny_image, monkeypatch):
    """`out_dir=` (an unset shell variable) wrote the PNGs into the working folder, where `-o ""` is refused."""
    monkeypatch.chdir(tiny_image)
    r = runner.invoke(app, ["generate", "--model", "t-gpt", "--method", "ar", "-n", "1", "out_dir="])
    assert r.exit_code == 2 and "an empty out_dir" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output
    assert not list(tiny_image.glob("*.png"))


def test_a_device_that_fills_up_mid_run_is_a_runtime_failure_naming_the_folder(tiny_image, monkeypatch):
    """It was exit 2 (a usage error) with "[Errno 28] ...": the user's command was fine, the device was not."""
    import errno
    import os

    import specgen.paths

    def full(tmp, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))

    monkeypatch.setattr(specgen.paths, "link_into_place", full)  # under the images' write_linked
    out = tiny_image / "full" / "images"
    r = gen(out, "--method", "ar")
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith(f"error: cannot write images in {out} (No space left on device); free some space")
    assert len(r.stderr.strip().splitlines()) == 1 and not (tiny_image / "full").exists()  # nor a temporary


def test_a_batched_runs_rates_are_over_its_wall_time(tiny_image):
    """With --batch-size 2 tokens_per_s was over the rows' summed times (each counts every step of the batch): half
    the rate; and latency_s summed the images' latencies, a time of nothing."""
    r = gen(tiny_image / "b", "--method", "ar", "-b", "2", "--format", "json")
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)["stats"]
    assert stats["tokens_per_s"] == pytest.approx(stats["new_tokens"] / stats["wall_s"], rel=1e-2)
    assert stats["images_per_s"] == pytest.approx(2 / stats["wall_s"], rel=1e-2) and "latency_s" not in stats


def test_the_paths_on_stdout_are_the_files_written(tiny_image):
    """The PNG paths went to stdout through Rich markup: with -o "out [a]" they read `out /...`, files that do not
    exist, for whoever pipes them on."""
    r = runner.invoke(app, ["generate", "--model", "t-gpt", "--num", "1", "--method", "ar", "-q",
                            "-o", str(tiny_image / "out [a] :smile:")])
    assert r.exit_code == 0, r.output
    paths = r.stdout.splitlines()
    assert len(paths) == 2 and all(os.path.isfile(p) for p in paths), paths
