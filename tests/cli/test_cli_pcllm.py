"""collect-trajectories -> distill -> generate/benchmark end to end on a tiny random target, and every bad input."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors import safe_open
from safetensors.torch import load_file
from typer.testing import CliRunner

from cli.main import app
from specgen import checkpoints, registry
from specgen.errors import UnknownNameError, UsageError
from tests.pcllm_fixtures import save_tiny_text, write_prompts

runner = CliRunner()
DISTILL = ["block_size=4", "window=4", "lora_rank=4", "lora_alpha=8", "lr=3e-3", "warmup_steps=2", "log_every=2",
           "ckpt_every=2"]


def invoke(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def one_line_error(r, code, needle):
    assert r.exit_code == code, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert "Traceback" not in r.output


@pytest.fixture
def traj(tmp_path):
    save_tiny_text()
    out = tmp_path / "traj"
    r = invoke("collect-trajectories", "--out", out, "--model", "tiny-text", "--prompts", write_prompts(tmp_path),
               "--block-size", 4, "--max-new-tokens", 16, "--format", "json", "chat=false", "shard_every=3")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)
    assert row["prompts"] == 8 and row["blocks"] >= 8 and row["mean_iterations_per_block"] > 1
    return out


def test_collect_distill_generate_benchmark(traj, tmp_path):
    r = invoke("collect-trajectories", "--out", traj, "--merge", "--format", "json")
    assert r.exit_code == 0 and (traj / "merged" / "train.parquet").is_file()
    r = invoke("distill", "--out", tmp_path / "run", "--trajectories", traj, "--model", "tiny-text", "--name", "tiny-pc",
               "--steps", 6, "--format", "json", *DISTILL)
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)
    assert row["registered"] == "adapter/tiny-pc-lora, target/tiny-pc" and row["steps"] == 6
    weights = [k for k in load_file(str(tmp_path / "run" / "state.safetensors")) if k.startswith("model.")]
    assert weights and all(".lora_" in k for k in weights)  # the state holds the adapter, not the model
    outs = {}
    for method in ("ar", "pcllm", "pcllm-mr", "cllm"):
        for model in ("tiny-pc", "adapter/tiny-pc-lora"):  # the adapter entry = base with the adapter merged
            opts = [] if method == "ar" else ["method_options.block_size=4"]
            r = invoke("generate", "--model", model, "--method", method, "--no-chat", "--prompt", "SORT A LIST",
                       "--max-new-tokens", 20, "--format", "json", *opts)
            assert r.exit_code == 0, r.output
            outs[method, model] = json.loads(r.stdout)["token_ids"]
    assert len(set(map(tuple, outs.values()))) == 1  # lossless w.r.t. the distilled model's own greedy AR
    r = invoke("benchmark", "--suite", "humaneval", "--model", "tiny-text", "--methods", "ar,pcllm,pcllm-mr,pcllm:n1",
               "--limit", 1, "--max-new-tokens", 8, "--format", "json", "targets.pcllm=tiny-pc",
               "targets.pcllm-mr=tiny-pc", "execute=false", "warmup=false",
               "method_options.pcllm.block_size=4", "method_options.pcllm-mr.block_size=4",
               "method_options.pcllm:n1.block_size=1")
    assert r.exit_code == 0, r.output
    rows = {x["method"]: x for x in json.loads(r.stdout)}
    assert set(rows) == {"ar", "pcllm", "pcllm-mr", "pcllm:n1", "ar@tiny-pc"}
    variant = rows["pcllm:n1"]  # a variant row: pcllm's target and options, its own block size (1 = plain AR)
    assert variant["model"] == "tiny-pc" and variant["tpf"] == 1.0 and variant["exact_match_vs_own_ar"] == 1.0
    r = invoke("benchmark", "--suite", "humaneval", "--model", "tiny-text", "--methods", "ar,pcllm:x",
               "--limit", 1, "targets.pcllm=tiny-pc", "method_options.pcllm:x.blok_size=2")
    one_line_error(r, 2, "method pcllm has no option 'blok_size'")  # the variant's own options are read
    assert rows["pcllm"]["exact_match_vs_own_ar"] == 1.0 and rows["pcllm-mr"]["exact_match_vs_own_ar"] == 1.0
    assert rows["pcllm"]["model"] == "tiny-pc" and rows["ar"]["model"] == "tiny-text"
    assert "prefix_vs_ar" in rows["ar@tiny-pc"] and rows["ar"]["nll_base"] > 0


def test_bad_inputs_are_one_line(traj, tmp_path):
    save_tiny_text("other-text", seed=4, eos="^")  # another target with another tokenizer
    base = ["distill", "--out", tmp_path / "r", "--trajectories", traj, "--steps", 2, *DISTILL]
    one_line_error(invoke(*base, "--model", "other-text"), 2, "come from target/tiny-text (tokenizer")
    r = invoke(*base, "--model", "other-text")
    assert "target/other-text (tokenizer" in r.stderr
    one_line_error(invoke(*base, "--model", "tiny-text", "block_size=8"), 2, "block size 4")
    one_line_error(invoke(*base, "--model", "tiny-text", "--dtype", "float64"), 2, "--dtype / mixed_precision must be")
    one_line_error(invoke("distill", "--out", tmp_path / "r", "--trajectories", tmp_path, "--model", "tiny-text"), 2,
                   "holds no trajectories")
    # collecting into a folder of another target / block size
    one_line_error(invoke("collect-trajectories", "--out", traj, "--model", "other-text", "--prompts",
                          write_prompts(tmp_path), "--block-size", 4, "--max-new-tokens", 16, "chat=false"), 2,
                   "target/tiny-text")
    one_line_error(invoke("collect-trajectories", "--out", traj, "--model", "tiny-text", "--prompts",
                          write_prompts(tmp_path), "--block-size", 5, "--max-new-tokens", 16, "chat=false"), 2,
                   "block_size=4")
    # another seed: the prompts it adds would hold that seed's initial guesses, under meta saying seed 0
    one_line_error(invoke("collect-trajectories", "--out", traj, "--model", "tiny-text", "--prompts",
                          write_prompts(tmp_path), "--block-size", 4, "--max-new-tokens", 16, "chat=false",
                          "--seed", 1), 2, "seed=0, now 1")
    # empty and malformed prompt files
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    one_line_error(invoke("collect-trajectories", "--out", tmp_path / "e", "--model", "tiny-text", "--prompts", empty),
                   2, "empty")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    one_line_error(invoke("collect-trajectories", "--out", tmp_path / "b", "--model", "tiny-text", "--prompts", bad),
                   2, "invalid JSON")
    assert not (tmp_path / "e").exists() and not (tmp_path / "b").exists()
    # a LoRA adapter trained for another base
    r = invoke("distill", "--out", tmp_path / "a", "--trajectories", traj, "--model", "tiny-text", "--name", "tiny-pc",
               "--steps", 2, *DISTILL)
    assert r.exit_code == 0, r.output
    one_line_error(invoke("distill", "--out", tmp_path / "c", "--trajectories", traj, "--model", "other-text",
                          "init_adapter=tiny-pc-lora", *DISTILL), 2, "trained for target/tiny-text, not target/other-text")
    meta = checkpoints.find("adapter/tiny-pc-lora").meta
    (checkpoints.find("adapter/tiny-pc-lora").path / "config.json").write_text(json.dumps({**meta, "parent": "target/other-text"}))
    one_line_error(invoke("generate", "--model", "adapter/tiny-pc-lora", "--prompt", "x", "--no-chat"), 2,
                   "was trained with tokenizer")


def _state_step(out):
    with safe_open(str(out / "state.safetensors"), "pt") as f:
        return json.loads(f.metadata()["meta"])["step"]


def test_interrupted_distill_leaves_a_loadable_checkpoint(traj, tmp_path):
    out = tmp_path / "run"
    r = invoke("distill", "--out", out, "--trajectories", traj, "--model", "tiny-text", "--name", "tiny-pc",
               "--steps", 6, "max_minutes=1e-9", *DISTILL)  # stops after the first step, as if killed
    assert r.exit_code == 0, r.output
    assert _state_step(out) == 1
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
    stopped = checkpoints.find("adapter/tiny-pc-lora").meta[registry.TRAINED_IN]
    assert stopped == str(out.resolve())  # the stopped run registered its outputs, recording its folder
    # another run folder (fresh) may not replace them without --force
    r = invoke("distill", "--out", tmp_path / "other", "--trajectories", traj, "--model", "tiny-text", "--name",
               "tiny-pc", "--steps", 6, *DISTILL)
    assert r.exit_code == 2 and "adapter/tiny-pc-lora already exists" in r.stderr
    # the same command resumes and replaces its own outputs, as its log line and the README say
    r = invoke("distill", "--out", out, "--trajectories", traj, "--model", "tiny-text", "--name", "tiny-pc",
               "--steps", 6, *DISTILL)
    assert r.exit_code == 0 and "resumed at step 1/6" in r.stderr, r.output
    assert _state_step(out) == 6
    assert checkpoints.find("target/tiny-pc").meta["metrics"]["steps"] == 6  # replaced by the finished run's


def test_a_run_folder_or_a_damaged_checkpoint_folder_as_model_says_why_it_is_none(traj, tmp_path):
    """generate --model RUN (distill's --out, which holds a config.json) or a checkpoint folder missing its
    config.json said "unknown checkpoint 'RUN'; known: ..." and listed every registry name."""
    out = tmp_path / "run"
    r = invoke("distill", "--out", out, "--trajectories", traj, "--model", "tiny-text", "--name", "tiny-pc",
               "--steps", 1, *DISTILL)
    assert r.exit_code == 0, r.output
    gen = ["generate", "--prompt", "x", "--no-chat", "--model"]
    one_line_error(invoke(*gen, out), 2, "is a training run folder, not a checkpoint; use the name the run registered")
    copy = shutil.copytree(checkpoints.find("tiny-pc").path, tmp_path / "copy")
    (copy / "config.json").unlink()
    one_line_error(invoke(*gen, copy), 2, "copy is a folder without config.json, not a checkpoint")
    one_line_error(invoke(*gen, copy / "model.safetensors"), 2, "model.safetensors is a file, not a checkpoint")
    with pytest.raises(UnknownNameError, match="unknown checkpoint ''"):  # an empty name is no path (Path("") is .)
        checkpoints.find("")


def test_an_adapter_whose_target_was_removed_names_it_as_its_parent(traj, tmp_path):
    """generate --model ADAPTER (or registry merge ADAPTER) after its target was removed said "unknown checkpoint
    'target/tiny-text'; did you mean ...", a name the user never gave."""
    r = invoke("distill", "--out", tmp_path / "run", "--trajectories", traj, "--model", "tiny-text",
               "--name", "tiny-pc", "--steps", 1, *DISTILL)
    assert r.exit_code == 0, r.output
    registry.remove("target/tiny-text")
    needle = "adapter/tiny-pc-lora was trained for 'target/tiny-text', which is not installed (removed?)"
    one_line_error(invoke("generate", "--model", "tiny-pc-lora", "--prompt", "x", "--no-chat"), 2, needle)
    one_line_error(invoke("registry", "merge", "tiny-pc-lora", "--name", "x"), 2, needle)


def test_an_adapter_and_trajectories_of_replaced_target_weights_are_refused(traj, tmp_path):
    """Other weights saved as tiny-text (--force) after an adapter was distilled on it: generate --model ADAPTER and
    registry merge ADAPTER decoded the adapter on the wrong base (exit 0, other tokens), and distill trained on the
    old weights' trajectories. Each records the digest its target's config got when saved, compared meta to meta;
    entries without one (saved by an older specgen) are not checked."""
    r = invoke("distill", "--out", tmp_path / "run", "--trajectories", traj, "--model", "tiny-text",
               "--name", "tiny-pc", "--steps", 1, *DISTILL)
    assert r.exit_code == 0, r.output
    gen = ["generate", "--model", "tiny-pc-lora", "--prompt", "x", "--no-chat", "--max-new-tokens", 4]
    before = invoke(*gen, "--format", "json")
    assert before.exit_code == 0, before.output
    save_tiny_text(seed=4)  # the same tokenizer and architecture, other weights
    one_line_error(invoke(*gen), 2, "adapter/tiny-pc-lora was trained for other weights of target/tiny-text")
    one_line_error(invoke("registry", "merge", "tiny-pc-lora", "--name", "x"), 2, "for other weights of target/tiny")
    one_line_error(invoke("distill", "--out", tmp_path / "again", "--trajectories", traj, "--model", "tiny-text",
                          "--steps", 1, *DISTILL), 2,
                   f"trajectories in {traj} were collected from other weights of target/tiny-text")
    one_line_error(invoke("collect-trajectories", "--out", traj, "--model", "tiny-text", "--prompts",
                          write_prompts(tmp_path), "--block-size", 4, "--max-new-tokens", 16, "chat=false"), 2,
                   "collected from other weights of target/tiny-text")
    assert invoke("generate", "--model", "tiny-pc", "--prompt", "x", "--no-chat").exit_code == 0  # merged: its own
    for folder, key in ((checkpoints.find("tiny-text").path, "weights_digest"),  # saved before: no check, no error
                        (checkpoints.find("tiny-pc-lora").path, "parent_digest")):
        meta = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({k: v for k, v in meta.items() if k != key}))
    after = invoke(*gen, "--format", "json")
    assert after.exit_code == 0 and json.loads(after.stdout)["token_ids"] != json.loads(before.stdout)["token_ids"]


def test_an_adapter_of_a_mesh_backbone_is_no_text_model(tmp_path):
    """collect-trajectories / distill / benchmark --model MESH-LORA (the XSpecMesh heads' adapter) failed 'cannot
    load the tokenizer in .../mesh-gpt-tiny: No such file or directory' (exit 1)."""
    needle = "adapter/xspecmesh-ca-tiny-lora adapts target/mesh-gpt-tiny, which is not a text model with a tokenizer"
    one_line_error(invoke("collect-trajectories", "--model", "xspecmesh-ca-tiny-lora", "--prompts",
                          write_prompts(tmp_path), "--out", tmp_path / "t"), 2, needle)
    assert not (tmp_path / "t").exists()


def test_builtin_distilled_targets_listed():
    r = invoke("registry", "list", "--format", "json")
    refs = {x["ref"] for x in json.loads(r.stdout)}
    assert {"target/smollm2-135m-pcllm", "target/smollm2-135m-cllm"} <= refs


def test_registry_merge_interpolates_in_weight_space(traj, tmp_path):
    """`registry merge --scale s` = base + s x the adapter's delta: 0 is the base, 1 the distilled target, 0.5 halfway;
    the adapter's recorded merge_scale is the default; bad scales and non-adapters are one line."""
    import torch

    r = invoke("distill", "--out", tmp_path / "run", "--trajectories", traj, "--model", "tiny-text", "--name", "tiny-pc",
               "--steps", 2, *DISTILL)
    assert r.exit_code == 0, r.output
    for s, name in ((0, "tiny-pc-0"), (0.5, "tiny-pc-half"), (None, "tiny-pc-default")):
        r = invoke("registry", "merge", "adapter/tiny-pc-lora", "--name", name, *(() if s is None else ("--scale", s)))
        assert r.exit_code == 0 and r.stdout.strip() == f"target/{name}", r.output
    w = {n: registry.read_state(checkpoints.find(n)) for n in ("tiny-text", "tiny-pc", "tiny-pc-0", "tiny-pc-half",
                                                              "tiny-pc-default")}
    key = next(k for k in w["tiny-text"] if k.endswith("wqkv.weight"))
    assert not torch.equal(w["tiny-pc"][key], w["tiny-text"][key])
    torch.testing.assert_close(w["tiny-pc-0"][key], w["tiny-text"][key])
    torch.testing.assert_close(w["tiny-pc-default"][key], w["tiny-pc"][key])
    torch.testing.assert_close(w["tiny-pc-half"][key], (w["tiny-text"][key] + w["tiny-pc"][key]) / 2)
    assert checkpoints.find("tiny-pc-half").meta["merge_scale"] == 0.5
    from specgen.train.distill import export_adapter  # the recipe's ship step records the chosen scale

    shipped = export_adapter("adapter/tiny-pc-lora", tmp_path / "asset", 0.5)
    assert json.loads((shipped / "adapter.json").read_text())["merge_scale"] == 0.5
    assert export_adapter("adapter/tiny-pc-lora", shipped, 0.25) == shipped  # an earlier export is replaced
    (shipped / "notes.txt").write_text("mine")  # other files were deleted with the folder it replaced
    with pytest.raises(UsageError, match=r"holds other files \(notes.txt\), which the export would delete"):
        export_adapter("adapter/tiny-pc-lora", shipped, 0.5)
    assert (shipped / "notes.txt").is_file()
    assert json.loads((shipped / "adapter.json").read_text())["merge_scale"] == 0.25
    with pytest.raises(UsageError, match="is a file, not a folder"):  # was IsADirectoryError from the swap
        export_adapter("adapter/tiny-pc-lora", shipped / "notes.txt", 0.5)
    r = invoke("generate", "--model", "tiny-pc-half", "--method", "pcllm-mr", "--no-chat", "--prompt", "SORT A LIST",
               "--max-new-tokens", 12, "--format", "json", "method_options.lookup=8")
    assert r.exit_code == 0, r.output
    one_line_error(invoke("registry", "merge", "adapter/tiny-pc-lora", "--name", "x", "--scale", -1), 2, "merge scale")
    one_line_error(invoke("registry", "merge", "tiny-text", "--name", "x"), 2, "not a LoRA adapter")
    one_line_error(invoke("registry", "merge", "adapter/nope", "--name", "x"), 2, "nope")
    registry.save("target", "tiny-no-tok", {}, {"builder": "transformer", "modality": "mesh"})
    registry.save("adapter", "mesh-lora", {}, {"parent": "target/tiny-no-tok", "lora_rank": 2, "lora_alpha": 4.0})
    one_line_error(invoke("registry", "merge", "adapter/mesh-lora", "--name", "x"), 2, "not a text model")


def test_collect_refuses_a_prompt_its_whole_blocks_run_past_the_context_before_anything_is_written(tmp_path):
    """1,016 tokens + a budget of 6 fit the 1,024-token context, but collecting decodes whole blocks of 4 and the next
    root (9 tokens): a prompt whose text ran that far failed mid-run, after the shards before it were written (this
    one stops early and ran through, exit 0). Refused up front, as generate refuses a budget past the context."""
    save_tiny_text()
    prompts = write_prompts(tmp_path, ["SHORT A", "SHORT B", "SHORT C", "X" * 1016])
    out = tmp_path / "traj"
    one_line_error(invoke("collect-trajectories", "--out", out, "--model", "tiny-text", "--prompts", prompts,
                          "--block-size", 4, "--max-new-tokens", 6, "chat=false", "shard_every=2"),
                   2, "a prompt of 1016 tokens + 9 decoded tokens (--max-new-tokens 6 in whole blocks of 4, then the "
                      "next root) does not fit target/tiny-text's context of 1024 tokens; lower --max-new-tokens to at "
                      "most 4")
    assert not out.exists()


def test_collect_refuses_a_prompt_past_the_context_before_the_weights_load(tmp_path):
    """A prompt that leaves no room for --max-new-tokens was found mid-run: the shards of the prompts before it were
    written, the rerun failed on it again and a fixed prompt file was refused as a changed config (a dead folder);
    it is refused as generate refuses it, before anything is decoded or written."""
    save_tiny_text()
    prompts = write_prompts(tmp_path, ["SHORT A", "SHORT B", "SHORT C", "X" * 1020])  # tiny-text's context: 1024
    out = tmp_path / "traj"
    one_line_error(invoke("collect-trajectories", "--out", out, "--model", "tiny-text", "--prompts", prompts,
                          "--block-size", 4, "--max-new-tokens", 8, "chat=false", "shard_every=2"),
                   2, "error: prompt 3: prompt of 1020 tokens + max-new-tokens 8 does not fit target/tiny-text's "
                      "context of 1024")  # which one: its data_id
    assert not out.exists()
