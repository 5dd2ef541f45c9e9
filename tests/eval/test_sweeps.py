"""One variant syntax for benchmark rows (specgen/eval/sweeps.py): `row@tag`, per-row `options`, `sweep` lists in the
humaneval, images and meshes suites; the older keys give the same rows; bad sweeps are one-line usage errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from specgen.config import load_config
from specgen.errors import UsageError
from specgen.eval.sweeps import Sweep, expand, merged_table, sweeps_of, value_text

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def one_error_line(r, needle: str, code: int = 2) -> None:
    assert r.exit_code == code, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.output


# --- the shared helper --------------------------------------------------------------------------------------------

def test_nested_and_flat_spellings_are_the_same_sweeps():
    nested = sweeps_of({"mulo-sd": {"tau": [1e-3, 1e-2]}, "vvs@i": {"interval": [2, 5]}})
    flat = sweeps_of({"mulo-sd.tau": [1e-3, 1e-2], "vvs@i.interval": [2, 5]})
    assert nested == flat == [Sweep("mulo-sd", "tau", (1e-3, 1e-2)), Sweep("vvs@i", "interval", (2, 5))]


@pytest.mark.parametrize("sweep, value, name", [
    (Sweep("mulo-sd", "tau", ()), 1e-3, "mulo-sd@tau=0.001"),  # a plain row: row@option=value
    (Sweep("mulo-sd", "tau", ()), 3e-5, "mulo-sd@tau=3e-05"),
    (Sweep("vvs@i", "interval", ()), 2, "vvs@i=2"),  # a tagged row names the sweep by its tag
    (Sweep("ca+lora", "vertex_lookup", ()), True, "ca+lora@vertex_lookup=true"),
    (Sweep("ca+lora", "draft_dtype", ()), "bfloat16", "ca+lora@draft_dtype=bfloat16"),
    (Sweep("ca+lora", "delta", (), label="ca+lora p>{}"), 0.3, "ca+lora p>0.3"),  # an older key's own names
])
def test_row_names(sweep, value, name):
    assert sweep.name(value) == name and value_text(value) in name


@pytest.mark.parametrize("spec, needle", [
    ({"mulo-sd": {"tau": []}}, "sweep.mulo-sd.tau is empty"),
    ({"mulo-sd.tau": []}, "sweep.mulo-sd.tau is empty"),
    ({"mulo-sd": {"tau": 0.1}}, "sweep.mulo-sd.tau must be a list of values"),
    ({"mulo-sd": {"tau": [[0.1]]}}, "must be a number, string or boolean"),
    ({"mulo-sd": [0.1]}, "sweep.mulo-sd names no option"),
])
def test_bad_sweep_specs_are_one_line(spec, needle):
    with pytest.raises(UsageError, match=None) as e:
        sweeps_of(spec)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_sweep_that_is_no_mapping_is_refused_by_the_config():
    from specgen.config import load_config
    from specgen.eval.text_bench import TextBenchConfig

    with pytest.raises(UsageError, match="sweep=.1,2.': a list where a mapping is expected"):
        load_config(TextBenchConfig, overrides=["sweep=[1,2]"])


def test_expand_refuses_unknown_rows_bad_options_and_clashing_names():
    def check(row, options):
        if "bogus" in options:
            raise UsageError("method x has no option 'bogus'")

    rows = expand([Sweep("a", "k", (1, 2, 1))], ["a"], check)  # a repeated value is one row
    assert [(r.name, r.base, r.options) for r in rows] == [("a@k=1", "a", {"k": 1}), ("a@k=2", "a", {"k": 2})]
    with pytest.raises(UsageError, match=r"^sweep.b.k: no row 'b' to sweep; known: a$"):
        expand([Sweep("b", "k", (1,))], ["a"], check)
    with pytest.raises(UsageError, match=r"^sweep.a.bogus: method x has no option 'bogus'$"):
        expand([Sweep("a", "bogus", (1,))], ["a"], check)
    with pytest.raises(UsageError, match="given twice with different settings"):
        expand([Sweep("a", "k", (1,)), Sweep("a", "k", (1,), (("j", 2),))], ["a"], check)


def test_older_table_name_merges_and_a_disagreement_is_refused():
    assert merged_table({"a": {"x": 1}}, {"a": {"y": 2}, "b": {"x": 3}}, "method_options") == \
        {"a": {"x": 1, "y": 2}, "b": {"x": 3}}
    assert merged_table({"a": {"x": 1}}, {"a": {"x": 1}}, "method_options") == {"a": {"x": 1}}
    with pytest.raises(UsageError, match=r"method_options.a.x \(1\) and options.a.x \(2\) disagree"):
        merged_table({"a": {"x": 1}}, {"a": {"x": 2}}, "method_options")
    with pytest.raises(UsageError, match=r"options.block_size must map a row's options"):
        merged_table({}, {"block_size": 4}, "method_options")


# --- images -------------------------------------------------------------------------------------------------------

def checked(suite: str, cfg):
    """cfg as a run loads it: its `options` entries checked (`dry_run.picked_rows`, no --methods)."""
    from specgen.eval.dry_run import picked_rows

    return picked_rows(suite, cfg, {}, {})


def image_rows(cfg) -> list[tuple[str, dict]]:
    from specgen.eval.image_bench import checked_rows, options_of

    full = checked_rows(checked("images", cfg))
    return [(m, options_of(full, m)) for m in full.methods]


def test_images_sweep_rows_keep_the_names_of_the_older_sweep_keys():
    from specgen.eval.image_bench import ImageBenchConfig

    new = ImageBenchConfig(methods=["ar", "vvs@u", "mulo-sd"],
                           options={"vvs@u": {"schedule": "uniform"}, "vvs@d": {"schedule": "dynamic"},
                                    "vvs": {"depth": 3}, "vvs@i": {"schedule": "uniform"},
                                    "vvs@thr": {"schedule": "dynamic"}},
                           sweep={"mulo-sd": {"tau": [1e-3, 3e-2]}, "vvs@i": {"interval": [2, 5]},
                                  "vvs@thr.threshold": [0.6]})
    rows = image_rows(new)
    assert [m for m, _ in rows] == ["ar", "vvs@u", "mulo-sd", "mulo-sd@tau=0.001", "mulo-sd@tau=0.03", "vvs@i=2",
                                    "vvs@i=5", "vvs@thr=0.6"]
    assert dict(rows)["vvs@i=5"] == {"depth": 3, "schedule": "uniform", "interval": 5}


def test_images_sweep_of_any_method_or_row():
    from specgen.eval.image_bench import ImageBenchConfig

    options = {"eagle2": {"depth": 3}, "vvs@d": {"schedule": "dynamic"}}
    rows = dict(image_rows(ImageBenchConfig(methods=["ar", "eagle2", "vvs@d"], options=options,
                                            sweep={"eagle2": {"top_k": [2, 4]}, "vvs@d": {"alpha": [0.5]}})))
    assert rows["eagle2@top_k=2"] == {"depth": 3, "top_k": 2}
    assert rows["vvs@d=0.5"] == {"schedule": "dynamic", "alpha": 0.5}  # the tagged row's options, then the value


@pytest.mark.parametrize("sweep, needle", [
    ({"nope": {"tau": [1]}}, "sweep.nope.tau: no row 'nope' to sweep"),
    ({"mulo-sd": {"bogus": [1]}}, "sweep.mulo-sd.bogus: method mulo-sd has no option 'bogus'"),
    ({"vvs": {"depth": [0]}}, "sweep.vvs.depth: depth must be >= 1"),  # a value its method's options refuse
])
def test_images_bad_sweeps_are_refused(sweep, needle):
    from specgen.eval.image_bench import ImageBenchConfig, checked_rows

    with pytest.raises(UsageError) as e:
        checked_rows(ImageBenchConfig(methods=["ar"], sweep=sweep))
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("key", ["options", "method_options"])
def test_images_options_of_no_row_are_refused(key):
    """A tag that is neither a row nor swept (`options.lantern@x.k=1`) was left unused, unsaid; a row, a method, a
    sweep's row (its base and its rows) and the defaults' vvs@u and vvs@d (in every run's table) may be named."""
    from specgen.eval.image_bench import ImageBenchConfig

    with pytest.raises(UsageError, match=rf"^{key}.lantern@x: no row 'lantern@x' to set; an entry names a row "
                                         r"\(ar, lantern\), a method or a sweep's row; did you mean lantern\?$"):
        image_rows(ImageBenchConfig(methods=["ar", "lantern"], **{key: {"lantern@x": {"k": 1}}}))
    named = {r: {} for r in ("ar", "lantern", "vvs", "lantern@k2", "vvs@i", "vvs@i=2", "vvs@u", "vvs@d")}
    cfg = ImageBenchConfig(methods=["ar", "lantern", "lantern@k2"], sweep={"vvs@i": {"interval": [2]}}, **{key: named})
    assert [m for m, _ in image_rows(cfg)] == ["ar", "lantern", "lantern@k2", "vvs@i=2"]


def test_images_a_tagged_row_without_an_entry_of_its_own_is_refused():
    """`adt-tree@x` with no options or dtypes entry of its own decoded as adt-tree under another name, unsaid."""
    from specgen.eval.image_bench import ImageBenchConfig

    with pytest.raises(UsageError, match=r"^row adt-tree@x: a variant row needs options.adt-tree@x or "
                                         r"dtypes.adt-tree@x of its own \(else it decodes as adt-tree\)$"):
        image_rows(ImageBenchConfig(methods=["ar", "adt-tree@x"]))
    options = {"adt-tree@x": {"d_max": 6}, "vvs@u": {}}  # (vvs@u's entry: the default `options`' but for this one)
    rows = image_rows(ImageBenchConfig(methods=["ar", "adt-tree@x", "ar@bf16", "vvs@u"], options=options,
                                       dtypes={"ar@bf16": "bfloat16"}))
    assert [m for m, _ in rows] == ["ar", "adt-tree@x", "ar@bf16", "vvs@u"]


def test_images_a_row_given_twice_is_refused():
    # methods=[ar,ar] decoded every image twice and printed two equal rows (the mesh suite refused it)
    from specgen.eval.image_bench import ImageBenchConfig, checked_rows

    with pytest.raises(UsageError, match="row 'ar' is given twice"):
        checked_rows(ImageBenchConfig(methods=["ar", "lantern", "ar"]))
    assert checked_rows(ImageBenchConfig(methods=["ar", "mulo-sd@raster"], mulo_ablations=True)).methods.count(
        "mulo-sd@raster") == 1  # an ablation row also named by hand is one row


def test_images_plots_one_speed_quality_front_per_sweep(tmp_path):
    from specgen.eval.image_bench import swept_groups, write_outputs

    names = ["ar", "lantern", "mulo-sd", "mulo-sd@tau=0.001", "mulo-sd@tau=0.01", "vvs@u", "vvs@i=2", "vvs@thr=0.6",
             "eagle2", "eagle2@top_k=2", "ar@bf16", "mulo-sd@raster"]
    assert swept_groups(names) == ["mulo-sd@tau", "vvs@i", "vvs@thr", "eagle2@top_k"]
    rows = [{"method": m, "temperature": 0.0, "speedup_vs_ar": 1.0 + i / 10, "nll": 2.0 - i / 10, "clf_fid": None}
            for i, m in enumerate(names)]
    files = {f.name for f in write_outputs(rows, {}, tmp_path)}
    assert {"mulo-sd-pareto-T0.png", "vvs-u-pareto-T0.png", "vvs-d-pareto-T0.png",
            "eagle2-top_k-pareto-T0.png"} <= files


# --- humaneval ----------------------------------------------------------------------------------------------------

def test_text_sweep_rows_carry_the_base_rows_options_and_target():
    from specgen.eval.text_bench import TextBenchConfig, check_methods, decoded_model, row_options, with_sweeps

    cfg = TextBenchConfig(methods=["ar", "ngram", "ngram:pc"], options={"ngram": {"max_ngram": 3}},
                          method_options={"ngram:pc": {"num_draft": 8}}, targets={"ngram:pc": "smollm2-135m-pcllm"},
                          sweep={"ngram": {"num_draft": [2, 4]}, "ngram:pc.num_draft": [16]})
    full = with_sweeps(cfg)
    assert full.methods == ["ar", "ngram", "ngram:pc", "ngram@num_draft=2", "ngram@num_draft=4",
                            "ngram:pc@num_draft=16"]
    assert row_options("ngram@num_draft=2", full) == {"max_ngram": 3, "num_draft": 2}
    assert row_options("ngram:pc@num_draft=16", full) == {"max_ngram": 3, "num_draft": 16}
    assert decoded_model("ngram:pc@num_draft=16", full) == "smollm2-135m-pcllm"
    assert decoded_model("ngram@num_draft=2", full) == "smollm2-135m"
    assert with_sweeps(full) == full  # expanding twice changes nothing
    check_methods(full)


def test_text_method_options_is_the_older_name_of_options():
    from specgen.eval.text_bench import TextBenchConfig, row_options

    old = TextBenchConfig(methods=["ar", "ngram:d1"], method_options={"ngram": {"num_draft": 4}, "ngram:d1": {"num_draft": 1}})
    new = TextBenchConfig(methods=["ar", "ngram:d1"], options={"ngram": {"num_draft": 4}, "ngram:d1": {"num_draft": 1}})
    assert row_options("ngram:d1", old) == row_options("ngram:d1", new) == {"num_draft": 1}
    with pytest.raises(UsageError, match="method_options.ngram.num_draft .* disagree"):
        row_options("ngram", TextBenchConfig(method_options={"ngram": {"num_draft": 3}},
                                             options={"ngram": {"num_draft": 4}}))


@pytest.mark.parametrize("sweep, needle", [
    ({"hf": {"x": [1]}}, "sweep.hf.x: no row"),  # external rows take no specgen options
    ({"ngram": {"num_drafts": [1]}}, "sweep.ngram.num_drafts: method ngram has no option 'num_drafts'"),
])
def test_text_bad_sweeps_are_refused(sweep, needle):
    from specgen.eval.text_bench import TextBenchConfig, plan

    with pytest.raises(UsageError) as e:
        plan(TextBenchConfig(methods=["ar", "ngram", "hf"], sweep=sweep))
    assert needle in str(e.value)


# --- meshes -------------------------------------------------------------------------------------------------------

def mesh_rows(**kw) -> list[tuple]:
    from specgen.eval.mesh_bench import MeshBenchConfig, variants

    cfg = MeshBenchConfig(**{"rows": ["ar", "ca+lora"], "deltas": [], "topk_accept": [], "tree_k": [], "depths": [],
                             **kw})
    return [(v.label, v.heads, dataclasses.asdict(v.opts), v.plain) for v in variants(checked("meshes", cfg))]


def test_mesh_sweep_rows_on_any_heads_row():
    rows = {r[0]: r for r in mesh_rows(options={"sampling": "tree", "ca": {"num_heads": 2}},
                                       sweep={"ca": {"delta": [0.3]}, "ca+lora": {"top_k_tree": [1, 2]}})}
    assert list(rows) == ["ar", "ca+lora", "ca@delta=0.3", "ca+lora@top_k_tree=1", "ca+lora@top_k_tree=2"]
    label, heads, opts, plain = rows["ca@delta=0.3"]
    assert heads == "xspecmesh-ca-tiny-s1" and opts["num_heads"] == 2 and opts["delta"] == 0.3
    assert opts["sampling"] == "tree" and not plain  # bare options reach every heads row, swept ones too
    assert rows["ca+lora@top_k_tree=1"][2]["top_k_tree"] == 1 and rows["ca+lora"][2]["num_heads"] == 4


def test_mesh_old_sweep_keys_keep_their_row_names():
    labels = [r[0] for r in mesh_rows(deltas=[0.1, 1.0], topk_accept=[1], tree_k=[2], depths=[2, 4],
                                      draft_dtypes=["bfloat16"], lookups=[1], path_cuts=[0.3])]
    assert labels == ["ar", "ca+lora", "ca+lora p>0.1", "ca+lora p>1", "ca+lora top-1", "ca+lora PTS K_s=2",
                      "ca+lora D=2", "ca+lora bfloat16", "ca+lora lookup 1", "ca+lora cut 0.3"]
    assert mesh_rows(deltas=[0.1], sweep_row="none") == mesh_rows()  # sweep_row=none: the older keys add nothing


@pytest.mark.parametrize("key", ["options", "row_options"])
def test_mesh_options_of_no_row_are_refused(key):
    """A typo'd row's options were left unused, unsaid (the row ran at its defaults); a row of `heads`, `ar`, merged
    AR and sweep rows (also of heads rows `--methods` leaves out) may be named."""
    with pytest.raises(UsageError, match=rf"^{key}.ca\+lra: no row 'ca\+lra' to set; an entry names a row \(ar, "
                                         r"ca\+lora\), a `heads` row or a sweep's row; did you mean ca\+lora\?$"):
        mesh_rows(**{key: {"ca+lra": {"delta": 0.3}}})
    with pytest.raises(UsageError, match=rf"^{key}.ca\+lora@x: no row"):  # a tag no sweep makes (was left unused)
        mesh_rows(**{key: {"ca+lora@x": {"delta": 0.3}}})
    named = {r: {"delta": 0.3} for r in ("ar", "ca", "ar+ca", "ca+lora@delta=0.7", "ca+lora p>0.1")}
    rows = mesh_rows(merged_ar=["ca"], deltas=[0.1], sweep={"ca+lora": {"delta": [0.7]}}, **{key: named})
    assert [r[0] for r in rows] == ["ar", "ca+lora", "ar+ca", "ca+lora p>0.1", "ca+lora@delta=0.7"]


def test_mesh_row_options_is_the_older_name_of_per_row_options():
    per_row = {"vertex": {"sampling": "tree", "top_k_tree": 1, "vertex_lookup": True}}
    heads = {"ca+lora": "xspecmesh-ca-tiny", "vertex": "xspecmesh-ca-tiny"}
    old = mesh_rows(rows=["ar", "vertex"], heads=heads, row_options=per_row, sweep_row="vertex", depths=[2])
    new = mesh_rows(rows=["ar", "vertex"], heads=heads, options=per_row, sweep_row="vertex", depths=[2])
    assert old == new and [r[0] for r in new] == ["ar", "vertex", "vertex D=2"]
    assert new[2][2]["vertex_lookup"] and new[2][2]["num_heads"] == 2


@pytest.mark.parametrize("kw, needle", [
    ({"sweep": {"nope": {"delta": [0.3]}}}, "sweep.nope.delta: no row"),
    ({"heads": {"ca+lora": "h"}, "sweep": {"ca+lora": {"heads": ["x"]}}}, "XSpecMesh has no option 'heads'"),
    ({"sweep": {"ca+lora": {"dleta": [0.3]}}}, "sweep.ca+lora.dleta: XSpecMesh has no option 'dleta'"),
    ({"options": {"ca+lora": {"dleta": 1}}}, "`options.ca+lora` has no XSpecMesh option 'dleta'"),
    ({"rows": ["ar", "ca+lora", "ca+lora"]}, "row 'ca+lora' is given twice"),
])
def test_mesh_bad_rows_are_refused(kw, needle):
    with pytest.raises(UsageError) as e:
        mesh_rows(**kw)
    assert needle in str(e.value) and "\n" not in str(e.value)


# --- recipes: the shipped (new) spelling gives the rows the older spelling gave -----------------------------------

def test_tiny_images_recipe_rows_keep_the_names_tables_quote():
    from specgen.eval.image_bench import ImageBenchConfig

    names = [m for m, _ in image_rows(load_config(ImageBenchConfig, ROOT / "recipes/tiny/bench-images.yaml"))]
    assert names[8:] == ["mulo-sd@raster", "mulo-sd@no-expand", "mulo-sd@tau=0.001", "mulo-sd@tau=0.01",
                         "mulo-sd@tau=0.03", "vvs@i=2", "vvs@i=5", "vvs@thr=0.6", "vvs@thr=0.9"]


@pytest.mark.parametrize("recipe, old_key, new_key", [
    ("recipes/tiny/bench-meshes-batch.yaml", "row_options", "options"),
    ("recipes/tiny/bench-pcllm-blocks.yaml", "method_options", "options"),
])
def test_renamed_option_tables_give_the_same_rows(tmp_path, recipe, old_key, new_key):
    from specgen.eval.mesh_bench import MeshBenchConfig
    from specgen.eval.text_bench import TextBenchConfig, row_options

    text = (ROOT / recipe).read_text()
    assert f"\n{new_key}:\n" in text
    old = tmp_path / "old.yaml"
    old.write_text(text.replace(f"\n{new_key}:\n", f"\n{old_key}:\n"))
    if "meshes" in recipe:
        def rows(path):
            from specgen.eval.mesh_bench import variants

            return [(v.label, v.heads, v.opts) for v in variants(load_config(MeshBenchConfig, path))]
    else:
        def rows(path):
            cfg = load_config(TextBenchConfig, path)
            return [(m, row_options(m, cfg)) for m in cfg.methods]
    assert rows(ROOT / recipe) == rows(old) and len(rows(old)) > 2


# --- the command line: one line, exit 2, before anything is loaded ------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["--suite", "meshes", "sweep={ca+lora: {bogus: [1]}}"], "sweep.ca+lora.bogus: XSpecMesh has no option 'bogus'"),
    (["--suite", "meshes", "sweep.ca+lora.delta=[]"], "sweep.ca+lora.delta is empty"),
    (["--suite", "meshes", "sweep.ca+lora.delta=[2]"], "delta must be in [0, 1]"),
    (["--suite", "images", "sweep.nope.tau=[1]"], "sweep.nope.tau: no row"),
    (["--suite", "images", "options.nope.tau=1"], "options.nope: no row 'nope' to set"),
    (["--suite", "images", "methods=[ar,lantern]", "options.lantern@x.k=1"], "options.lantern@x: no row 'lantern@x'"),
    (["--suite", "humaneval", "--methods", "ar,ngram", "options.ngarm.num_draft=3"],
     "options.ngarm: no row 'ngarm' to set; an entry names a row (ar, ngram), a method or a sweep's row; did you mean "
     "ngram?"),
    (["--suite", "humaneval", "--methods", "ar,ngram", "method_options.ngarm@x.num_draft=3"], "options.ngarm@x:"),
    (["--suite", "images", "sweep.mulo-sd.tau=[-1]"], "tau must be >= 0"),
    (["--suite", "humaneval", "--methods", "ar,ngram", "sweep.ngram.num_draft=[0]"], "num_draft must be >= 1"),
    (["--suite", "humaneval", "--methods", "ar,ngram", "sweep.ngram=[1]"], "sweep.ngram names no option"),
    (["--suite", "humaneval", "--methods", "ar,ngram", "method_options.ngram.num_draft=2",
      "options.ngram.num_draft=3"], "disagree"),
])
def test_cli_refuses_bad_sweeps_in_one_line(args, needle, tmp_path):
    one_error_line(runner.invoke(app, ["benchmark", *args, "--out", str(tmp_path / "rows.jsonl")]), needle)


def test_dry_run_reports_a_bad_sweep():
    r = runner.invoke(app, ["benchmark", "--config", str(ROOT / "recipes/tiny/bench-images.yaml"), "--dry-run",
                            "--format", "json", "sweep.eagle2.top_kk=[2]"])
    assert r.exit_code == 1 and "sweep.eagle2.top_kk: method eagle2 has no option 'top_kk'" in r.stdout, r.output


@pytest.mark.parametrize("args,needle", [
    (["--methods", "ar,nosuch"], "unknown method 'nosuch'"),
    (["--batch-size", "1,4", "--limit", "0"], "limit must be >= 1"),
    (["--device", "tpu9"], "tpu9"),
])
def test_dry_run_checks_the_command_lines_options(args, needle):
    """--dry-run checks the recipe as the same command line would run it: an option it would refuse fails the check."""
    r = runner.invoke(app, ["benchmark", "--config", str(ROOT / "recipes/tiny/bench-humaneval.yaml"), "--dry-run",
                            "--format", "json", *args])
    assert r.exit_code == 1 and needle in r.stdout, r.output


def test_a_run_folder_started_before_the_sweep_key_resumes(tmp_path):
    """A key added since a run started, left empty (`sweep: {}`), is no change of config; a filled one is."""
    from specgen.eval.run_dir import RunDir

    RunDir.open(tmp_path / "run", "meshes", {"rows": ["ar"], "deltas": [0.3]})
    RunDir.open(tmp_path / "run", "meshes", {"rows": ["ar"], "deltas": [0.3], "sweep": {}, "options": {}})
    with pytest.raises(UsageError, match="another config: sweep.ca.delta"):
        RunDir.open(tmp_path / "run", "meshes", {"rows": ["ar"], "deltas": [0.3], "sweep": {"ca": {"delta": [1]}}})


# --- `--methods` picks the rows, and a recipe's sweep rows of their methods only ----------------------------------

def picked_config(suite: str, cls: type, recipe, overrides=(), **explicit):
    """The config a benchmark runs: `recipe` and `overrides` with the command line's `explicit` options, its rows
    picked (`dry_run.picked_rows`)."""
    from specgen.config import read_recipe
    from specgen.eval.dry_run import picked_rows

    cfg = load_config(cls, recipe, list(overrides), **explicit)
    return picked_rows(suite, cfg, explicit, read_recipe(recipe) if recipe is not None else {})


@pytest.mark.parametrize("methods, extra", [
    (["ar", "eagle2"], []),  # were kept: mulo-sd@raster, mulo-sd@no-expand, mulo-sd@tau=..., vvs@i=..., vvs@thr=...
    (["ar", "vvs@u"], ["vvs@i=2", "vvs@i=5", "vvs@thr=0.6", "vvs@thr=0.9"]),  # method vvs
    (["ar", "mulo-sd"], ["mulo-sd@raster", "mulo-sd@no-expand", "mulo-sd@tau=0.001", "mulo-sd@tau=0.01",
                         "mulo-sd@tau=0.03"]),
])
def test_methods_pick_the_images_recipes_sweep_rows_of_their_methods(methods, extra):
    from specgen.eval.image_bench import ImageBenchConfig

    recipe = ROOT / "recipes/tiny/bench-images.yaml"
    cfg = picked_config("images", ImageBenchConfig, recipe, methods=methods)
    assert [m for m, _ in image_rows(cfg)] == [*methods, *extra]
    unpicked = load_config(ImageBenchConfig, recipe, [f"methods=[{','.join(methods)}]"])  # the key: every sweep row
    assert picked_config("images", ImageBenchConfig, recipe, [f"methods=[{','.join(methods)}]"]) == unpicked
    assert len(image_rows(unpicked)) == len(methods) + 9
    batch = ROOT / "recipes/tiny/bench-images-batch.yaml"  # its eagle2@auto, adt-tree@auto entries go with the rows
    assert image_rows(picked_config("images", ImageBenchConfig, batch, methods=methods))


def test_methods_pick_the_text_sweep_rows_of_their_methods():
    from specgen.eval.text_bench import TextBenchConfig, picked, with_sweeps

    cfg = TextBenchConfig(methods=["ar", "ngram:d8"], sweep={"jacobi": {"block_size": [2]}, "ngram.num_draft": [2]})
    assert with_sweeps(picked(cfg)).methods == ["ar", "ngram:d8", "ngram@num_draft=2"]
    with pytest.raises(UsageError, match="sweep.ngram names no option"):  # a key naming no row stays, to be refused
        with_sweeps(picked(TextBenchConfig(methods=["ar"], sweep={"ngram": [1]})))


def test_methods_pick_the_mesh_sweep_and_merged_ar_rows_of_their_rows():
    from specgen.eval.mesh_bench import MeshBenchConfig, picked, variants

    recipe = ROOT / "recipes/tiny/bench-meshes.yaml"
    labels = [v.label for v in variants(picked(load_config(MeshBenchConfig, recipe, ["merged_ar=[ca+lora]",
                                                                                      "sweep.ca.delta=[0.3]"],
                                                           rows=["ar", "ca"])))]
    assert labels == ["ar", "ca", "ca@delta=0.3"]  # were also ar+ca+lora and the ten sweep_row rows of ca+lora
    labels = [v.label for v in variants(picked(load_config(MeshBenchConfig, recipe, rows=["ar", "ca+lora"])))]
    assert labels[:3] == ["ar", "ca+lora", "ca+lora p>0.1"] and len(labels) == 11


def test_dry_run_shows_the_rows_methods_picks():
    r = runner.invoke(app, ["benchmark", "--config", str(ROOT / "recipes/tiny/bench-images.yaml"), "--dry-run",
                            "--format", "json", "--methods", "ar,eagle2"])
    assert r.exit_code == 0, r.output
    assert [x["check"] for x in json.loads(r.stdout) if x["check"].startswith("method ")] == ["method ar",
                                                                                             "method eagle2"]


def test_a_run_records_the_rows_methods_picks_and_its_report_shows_them(tmp_path):
    args = ["--config", str(ROOT / "recipes/tiny/bench-meshes.yaml"), "--methods", "ar,ca", "--limit", "1",
            "--max-new-tokens", "6", "--run-dir", str(tmp_path / "run"), "--format", "json"]
    r = runner.invoke(app, ["benchmark", *args])
    assert r.exit_code == 0, r.output
    assert [x["row"] for x in json.loads(r.stdout)] == ["ar", "ca"]
    assert runner.invoke(app, ["benchmark", *args]).exit_code == 0  # the same command resumes (nothing left)
    r = runner.invoke(app, ["benchmark", "report", str(tmp_path / "run"), "--format", "json"])
    assert r.exit_code == 0 and [x["row"] for x in json.loads(r.stdout)] == ["ar", "ca"], r.output


def test_methods_leave_out_the_dtypes_of_the_rows_they_leave_out():
    """A precision recipe's `dtypes` name its rows: `--methods` picking some leaves the others' entries out (they
    were refused as `no such row`); an entry no row could have is still refused."""
    from specgen.eval.image_bench import ImageBenchConfig, checked_rows
    from specgen.eval.mesh_bench import MeshBenchConfig, variants

    images = ROOT / "recipes/tiny/bench-images-precision.yaml"
    pick = {"methods": ["ar", "adt-tree@bf16"]}
    cfg = picked_config("images", ImageBenchConfig, images, **pick)
    assert cfg.dtypes == {"adt-tree@bf16": "bfloat16"} and checked_rows(cfg).methods == pick["methods"]
    typo = picked_config("images", ImageBenchConfig, images, ["dtypes.adt-tre@bf16=bfloat16"], **pick)
    with pytest.raises(UsageError, match="dtypes.adt-tre@bf16: no such row"):
        checked_rows(typo)
    meshes = ROOT / "recipes/tiny/bench-meshes-precision.yaml"
    cfg = picked_config("meshes", MeshBenchConfig, meshes, rows=["ar", "ca+lora@bf16"])
    assert [v.label for v in variants(cfg)] == ["ar", "ca+lora@bf16", "ar+ca+lora@bf16"]
    assert cfg.dtypes == {"ca+lora@bf16": "bfloat16", "ar+ca+lora@bf16": "bfloat16"}
    r = runner.invoke(app, ["benchmark", "--config", str(meshes), "--dry-run", "--methods", "ar,ca+lora"])
    assert r.exit_code == 0, r.output


# --- an `options` entry no row reads: one check in every suite, beside --methods too --------------------------------

def recipe(tmp_path, doc: dict) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


@pytest.mark.parametrize("suite, cls, key, doc, needle", [
    ("text", "text_bench.TextBenchConfig", "methods", {"options": {"ngram:cahce": {"num_draft": 2}}},
     "options.ngram:cahce: no row 'ngram:cahce' to set; an entry names a row (ar, ngram), a method or a sweep's row; "
     "did you mean ngram?"),
    ("images", "image_bench.ImageBenchConfig", "methods", {"options": {"lantern@x": {"k": 1}}},
     "options.lantern@x: no row 'lantern@x' to set; an entry names a row (ar, lantern)"),
    ("meshes", "mesh_bench.MeshBenchConfig", "rows", {"row_options": {"ca@x": {"delta": 0.3}}},
     "row_options.ca@x: no row 'ca@x' to set; an entry names a row (ar, ca)"),
])
def test_an_options_entry_no_row_reads_is_refused_beside_methods(tmp_path, suite, cls, key, doc, needle):
    """A typo'd entry was left unused, unsaid: in the text suite always, in the others beside --methods (whose picking
    dropped it); the one check (`sweeps.Entries`) refuses it in every suite, with or without --methods."""
    import importlib

    module, name = cls.split(".")
    config = getattr(importlib.import_module(f"specgen.eval.{module}"), name)
    rows = ["ar", "ngram"] if suite == "text" else ["ar", "lantern"] if suite == "images" else ["ar", "ca"]
    path = recipe(tmp_path, {**doc, "suite": suite, key: rows})
    with pytest.raises(UsageError) as e:  # --methods picks the rows
        picked_config(suite, config, path, **{key: rows})
    assert str(e.value).startswith(needle), e.value
    r = runner.invoke(app, ["benchmark", "--config", str(path), "--dry-run", "--format", "json"])  # the plan's check
    assert r.exit_code == 1 and needle in r.stdout, r.output
    r = runner.invoke(app, ["benchmark", "--config", str(path), "--methods", ",".join(rows), "--limit", "1", "--out",
                            str(tmp_path / "rows.jsonl")])
    one_error_line(r, needle)
    assert not (tmp_path / "rows.jsonl").exists()


def test_a_recipes_options_entry_of_a_row_methods_leaves_out_is_no_typo(tmp_path):
    """The check reads a recipe's entries against its own rows and those --methods picks: an entry of a row (or a
    sweep's row) --methods leaves out is not refused, in every suite."""
    from specgen.eval.image_bench import ImageBenchConfig, checked_rows
    from specgen.eval.mesh_bench import MeshBenchConfig, variants
    from specgen.eval.text_bench import TextBenchConfig, row_options, with_sweeps

    text = recipe(tmp_path, {"methods": ["ar", "ngram", "jacobi@n4"], "options": {"jacobi@n4": {"block_size": 4},
                                                                                 "ngram": {"num_draft": 3}}})
    cfg = with_sweeps(picked_config("text", TextBenchConfig, text, methods=["ar", "ngram"]))
    assert cfg.methods == ["ar", "ngram"] and row_options("ngram", cfg) == {"num_draft": 3}
    images = recipe(tmp_path, {"methods": ["ar", "lantern@k2"], "options": {"lantern@k2": {"k": 2}}})
    assert checked_rows(picked_config("images", ImageBenchConfig, images, methods=["ar", "vvs@u"])).methods == [
        "ar", "vvs@u"]
    meshes = recipe(tmp_path, {"rows": ["ar", "ca", "mlp"], "sweep": {"ca": {"delta": [0.2]}},
                               "options": {"ca@delta=0.2": {"num_heads": 2}}})
    assert [v.label for v in variants(picked_config("meshes", MeshBenchConfig, meshes, rows=["ar", "mlp"]))] == [
        "ar", "mlp"]
