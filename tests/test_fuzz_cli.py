"""Issue 23, fuzzed: random option values and overrides for every command on a tiny model.

Whatever the input, a command exits 0, 1 or 2, never prints a traceback, prints at most one (error) line on
stderr when it fails, and a failure leaves no new file behind. Each example runs in a fresh SPECGEN_HOME and
working folder; the trainers are pointed at inputs that do not exist, so a valid configuration ends at its
first load (fast) instead of training.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.main import app

NUMBERS = ["-3", "-0", "0", "1", "2", "0.5", "2.5", "1e9", "1e400", "nan", "inf", "-inf", "abc", ""]
TEXTS = ["", "x", "a\x01b", "é", "../up", "n" * 120, "smollm2-135m", "tiny-text", "-", "[1,2]", "{a: 1}", "null",
         "afile", "."]
VALUES = st.one_of(st.sampled_from(NUMBERS + TEXTS), st.text(max_size=6))

# command -> (fixed arguments, {option: values}, override keys)
COMMANDS = {
    "generate": (["generate", "--model", "tiny-text", "--no-chat", "--prompt", "HI", "--max-new-tokens", "2"],
                 {"--temperature": NUMBERS, "--top-p": NUMBERS, "--top-k": NUMBERS, "--seed": NUMBERS,
                  "--max-new-tokens": ["-3", "0", "1", "3", "abc", "1000000000"],
                  "--method": ["ar", "jacobi", "ngram", "pcllm-mr", "xspecmesh", "adt-tree", "nope", ""],
                  "--device": ["cpu", "cuda", "meta:0", "x"], "--format": ["json", "table", "xml"]},
                 ["method_options.block_size", "method_options.num_draft", "method_options", "max_new_tokens",
                  "temperature", "top_p", "chat", "seed", "nope"]),
    "generate-image": (["generate", "--model", "tiny-image-gpt", "--method", "ar", "--num", "1", "-o", "imgs"],
                       {"--cfg-scale": NUMBERS, "--temperature": NUMBERS, "--top-k": NUMBERS, "--top-p": NUMBERS,
                        "--num": ["-1", "0", "1", "2", "abc"], "--classes": ["0", "1,2", ",", "nope", "99", ""],
                        "--method": ["ar", "adt-tree", "lantern", "xspecmesh", "nope"], "-o": ["imgs", "afile", "."]},
                       ["method_options.depth", "method_options.total_tokens", "method_options.lantern_delta",
                        "classes", "num"]),
    "generate-mesh": (["generate", "--method", "xspecmesh", "--num", "1", "--max-new-tokens", "24"],
                      {"--temperature": NUMBERS, "--top-p": NUMBERS, "--num": ["-1", "0", "1", "abc"],
                       "--max-new-tokens": ["-1", "0", "8", "24", "100000"], "-o": ["meshes", "afile", "."],
                       "--method": ["ar", "xspecmesh", "jacobi"]},
                      ["method_options.delta", "method_options.criterion", "method_options.num_heads",
                       "method_options.top_k_tree", "mesh_format"]),
    "benchmark": (["benchmark", "--model", "tiny-text", "--limit", "1", "--max-new-tokens", "2", "--methods", "ar",
                   "warmup=false", "execute=false", "nll=false"],
                  {"--limit": ["-3", "0", "1", "abc"], "--offset": ["-1", "0", "3", "100000"],
                   "--threads": ["-3", "0", "1", "99999", "x"], "--max-new-tokens": ["0", "1", "2", "5000"],
                   "--methods": ["ar", "ar,ngram", "ngram", "nope", ""], "--out": ["rows.jsonl", ".", "afile", "no/x"],
                   "--suite": ["humaneval", "imagenet"]},
                  ["method_options.ngram.num_draft", "methods", "limit", "threads", "suite"]),
    "export-mesh": (["export-mesh", "seq.jsonl"],
                    {"-o": ["out", "afile", "afile/sub", "."], "--mesh-format": ["obj", "ply", "xyz", ""],
                     "--format": ["json", "table", "x"]}, []),
    "registry": (["registry", "import", "w.pt", "--builder", "transformer", "--kwargs", "kw.json"],
                 {"--name": TEXTS + ["fresh"], "--kind": ["target", "draft", "nope"], "--parent": TEXTS,
                  "--builder": ["transformer", "nope"]}, []),
    "distill": (["distill", "--out", "run", "--trajectories", "empty", "--model", "tiny-text"],
                {"--steps": NUMBERS, "--objective": ["pcllm", "cllm", "x"], "--name": TEXTS, "--seed": NUMBERS},
                ["lr", "lora_rank", "block_size", "window", "warmup_steps", "lora_targets", "max_minutes", "name"]),
    "train-heads": (["train-heads", "--out", "run", "target=no-such-target"],
                    {"--kind": ["xspecmesh", "eagle", "nope"]},
                    ["stage1_lr", "stage2_lr", "num_heads", "head_kind", "batch_size", "beta1", "name", "ship_dir"]),
    "train-upsampler": (["train-upsampler", "--out", "run", "vq=no-such-vq"], {},
                        ["lr", "disc_lr", "steps", "scale", "lecam_decay", "name", "num_threads", "warm_start"]),
    "collect-trajectories": (["collect-trajectories", "--out", "run", "--model", "no-such-target"],
                             {"--block-size": NUMBERS, "--max-new-tokens": NUMBERS, "--limit": NUMBERS,
                              "--prompts": ["stdlib", "nope.txt", ""]},
                             ["threads", "shard_every", "offset", "chat", "prompt_field"]),
}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A SPECGEN_HOME with target/tiny-text and a working folder with the inputs the commands name, made once (each
    example gets a copy), and torch's generator state as making them left it."""
    import json

    import torch

    from tests.cli.test_cli_mesh import good_line
    from tests.conftest import tiny_model
    from tests.pcllm_fixtures import save_tiny_text

    root = tmp_path_factory.mktemp("fuzz-template")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECGEN_HOME", str(root / "home"))
        save_tiny_text()
    work = root / "work"
    work.mkdir()
    (work / "afile").write_text("x")
    (work / "empty").mkdir()
    (work / "seq.jsonl").write_text(good_line("m") + '\n{"token_ids": [1, 2, 3], "name": "bad"}\n[5, 6]\n')
    model = tiny_model(1)
    torch.save(model.state_dict(), work / "w.pt")
    (work / "kw.json").write_text(json.dumps(model.cfg.to_dict()))
    return root, torch.get_rng_state()


@contextmanager
def scratch(template):
    """A fresh copy of the template: SPECGEN_HOME and the working folder, as the current ones."""
    import torch

    made, rng = template
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        shutil.copytree(made, root, dirs_exist_ok=True)
        torch.set_rng_state(rng)
        old_env, old_cwd = os.environ.get("SPECGEN_HOME"), os.getcwd()
        os.environ["SPECGEN_HOME"] = str(root / "home")
        os.chdir(root / "work")
        try:
            yield root
        finally:
            os.chdir(old_cwd)
            if old_env is None:
                os.environ.pop("SPECGEN_HOME", None)
            else:
                os.environ["SPECGEN_HOME"] = old_env


def snapshot(root: Path) -> set[str]:
    """Files and folders under root, except built-in registry entries (a cache materialised on first use)."""
    from specgen.builtins import BUILTINS

    paths = set()
    for p in root.rglob("*"):
        parts = p.relative_to(root).parts
        if parts[:2] == ("home", "checkpoints") and (len(parts) == 3 or len(parts) >= 4 and parts[3] in BUILTINS):
            continue  # a kind folder, or a built-in entry
        paths.add(str(p.relative_to(root)))
    return paths


#: FUZZ_EXAMPLES=N: N random examples per command (a bug hunt); default: a few fixed ones (fast, reproducible).
#: FUZZ_LOG=FILE: append each example's exit code, arguments and last stderr line to FILE.
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "8"))


@pytest.mark.parametrize("command", sorted(COMMANDS))
@settings(max_examples=EXAMPLES, deadline=None, derandomize="FUZZ_EXAMPLES" not in os.environ,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_inputs_exit_cleanly(template, command, data):
    fixed, options, keys = COMMANDS[command]
    args = list(fixed)
    if options:
        for opt in data.draw(st.lists(st.sampled_from(sorted(options)), max_size=3, unique=True), label="options"):
            pool = st.sampled_from(options[opt])  # the option's own values 3 times out of 4, anything else the rest
            args += [opt, data.draw(st.one_of(pool, pool, pool, VALUES), label=opt)]
    if keys:
        for key in data.draw(st.lists(st.sampled_from(keys), max_size=2, unique=True), label="overrides"):
            args.append(f"{key}={data.draw(VALUES, label=key)}")
    with scratch(template) as root:
        before = snapshot(root)
        r = CliRunner().invoke(app, args)
        after = snapshot(root)
    if os.environ.get("FUZZ_LOG"):
        with open(os.environ["FUZZ_LOG"], "a") as log:
            print(r.exit_code, args, (r.stderr.strip().splitlines() or [""])[-1][:100], file=log)
    assert r.exit_code in (0, 1, 2), (args, r.output)
    assert "Traceback" not in r.output and "╭" not in r.output, (args, r.output)
    if r.exit_code:
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), (args, r.stderr)
        assert not re.match(r"error: \w+(Error|Exception|Warning): ", lines[0]), (args, lines[0])  # a raw exception
        assert after == before, (args, sorted(after - before))
