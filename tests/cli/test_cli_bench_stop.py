"""`benchmark --stop` and `--no-chat`: every row, peer rows included, keeps the tokens `generate --stop` keeps from
the same prompt ids; the dry run shows the stops; a resume refuses other stops or prompts; other suites refuse both."""

from __future__ import annotations

import json

import pytest
import torch

from specgen.eval import hf_rows, text_bench
from specgen.generate import text as generate_text
from tests.cli.test_cli_bench_prompts import one_line
from tests.cli.test_cli_text import CHAT, invoke, tiny_target  # noqa: F401 - tiny_target: the fixture

PROMPTS = ["HELLO WORLD", "ABC ABC ABC"]
ROWS = "ar,ngram,jacobi,hf,hf-lookup,hf-compiled"
BENCH = ["benchmark", "--suite", "text", "--model", "tiny-text", "--max-new-tokens", "12", "warmup=false",
         "nll=false"]


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n")
    return path


def generated(path, *args) -> list[dict]:
    """`generate`'s JSON results over the prompt file (AR, as the benchmark's reference row)."""
    r = invoke("generate", "--model", "tiny-text", "--prompts", str(path), "--max-new-tokens", "12", "--format",
               "json", *args)
    assert r.exit_code == 0, r.output
    return [json.loads(line) for line in r.stdout.splitlines()]


def kept_tokens(run_dir) -> dict[str, list[list[int]]]:
    """row -> each prompt's tokens, from a run folder's records."""
    records = [json.loads(line) for line in (run_dir / "records-0-of-1.jsonl").read_text().splitlines()]
    records.sort(key=lambda r: r["index"])
    return {m: [r["runs"][m]["tokens"] for r in records] for m in records[0]["runs"]}


def test_every_row_keeps_what_generate_stop_keeps(tiny_target, prompts, tmp_path, monkeypatch):  # noqa: F811
    """A stop string of three characters (three tokens of tiny-text: it completes across them) ends every specgen
    row and every transformers row at the token `generate --stop` ends at; the rows' counts are the kept tokens."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)  # hf-compiled's loop, uncompiled
    plain = generated(prompts)
    stop = plain[0]["completion"][2:5]
    want = [r["token_ids"] for r in generated(prompts, "--stop", stop)]
    assert len(want[0]) < len(plain[0]["token_ids"])  # the stop ends the first prompt's row early
    r = invoke(*BENCH, "--prompts", str(prompts), "--methods", ROWS, "--stop", stop, "--run-dir",
               str(tmp_path / "run"), "--format", "json")
    assert r.exit_code == 0, r.output
    assert kept_tokens(tmp_path / "run") == {m: want for m in ROWS.split(",")}
    rows = {row["method"]: row for row in json.loads(r.stdout)}
    assert {m: row["new_tokens"] for m, row in rows.items()} == {m: sum(map(len, want)) for m in ROWS.split(",")}
    assert all(row["exact_match_vs_ar"] == 1.0 for row in rows.values())
    table = invoke("benchmark", "report", str(tmp_path / "run"))
    assert f"greedy, stop {stop!r}, max 12 new tokens" in table.stdout.replace("\n", " ")


def test_a_recipes_stop_and_chat_keys_are_the_options(tiny_target, prompts, tmp_path):  # noqa: F811
    (tiny_target.path / "chat_template.jinja").write_text(CHAT)
    plain = generated(prompts, "--no-chat")
    stop = plain[0]["completion"][1:3]
    recipe = tmp_path / "bench.yaml"
    recipe.write_text(json.dumps({"suite": "text", "stop": [stop, "\n"], "chat": False}))
    by_recipe = invoke(*BENCH, "--config", str(recipe), "--prompts", str(prompts), "--methods", "ar",
                       "--run-dir", str(tmp_path / "a"))
    by_option = invoke(*BENCH, "--prompts", str(prompts), "--methods", "ar", "--stop", stop, "--stop", "\n",
                       "--no-chat", "--run-dir", str(tmp_path / "b"))
    assert by_recipe.exit_code == 0 and by_option.exit_code == 0, by_recipe.output + by_option.output
    want = [r["token_ids"] for r in generated(prompts, "--no-chat", "--stop", stop, "--stop", "\n")]
    assert kept_tokens(tmp_path / "a") == kept_tokens(tmp_path / "b") == {"ar": want}


def spy(monkeypatch, module, name: str, arg: int) -> list[list[int]]:
    """The prompt ids `module.name` is called with (its positional argument `arg`: a list of prompts)."""
    seen, real = [], getattr(module, name)

    def spied(*args, **kwargs):
        seen.extend(list(p) for p in args[arg])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spied)
    return seen


def test_no_chat_feeds_every_row_the_ids_generate_no_chat_feeds(tiny_target, prompts, monkeypatch):  # noqa: F811
    """--no-chat: the raw text's ids for the specgen rows and the transformers row alike, as `generate --no-chat`
    encodes them; without it the chat template's (this tiny model has one here), as `generate`'s."""
    (tiny_target.path / "chat_template.jinja").write_text(CHAT)
    for flags, want in (([], "U:{} A:"), (["--no-chat"], "{}")):
        fed = spy(monkeypatch, generate_text, "run_batch", 2)
        generated(prompts, *flags)
        rows, peer = spy(monkeypatch, text_bench, "run_batch", 2), spy(monkeypatch, hf_rows, "generate_padded", 1)
        r = invoke(*BENCH, "--prompts", str(prompts), "--methods", "ar,hf", *flags)
        assert r.exit_code == 0, r.output
        assert rows == peer == fed == [tiny_text_ids(want.format(p)) for p in PROMPTS]


def tiny_text_ids(text: str) -> list[int]:
    """tiny-text's raw ids: one token a character, id = code point - 32."""
    return [ord(c) - 32 for c in text]


def test_the_dry_run_shows_the_stops_and_raw_prompts(tiny_target, prompts):  # noqa: F811
    r = invoke(*BENCH, "--prompts", str(prompts), "--stop", "\n", "--stop", "AB", "--no-chat", "--dry-run",
               "--format", "json")
    assert r.exit_code == 0, r.output
    checks = {row["check"]: row["detail"] for row in json.loads(r.stdout)}
    assert checks["stops"] == "every row, peer rows too, ends at the tokenizer's stop ids or at the token completing " \
                              "'\\n', 'AB'"
    assert checks["prompts"].startswith("2 prompts, raw (no chat template), each fits")
    plain = json.loads(invoke(*BENCH, "--prompts", str(prompts), "--dry-run", "--format", "json").stdout)
    assert {row["check"]: row["detail"] for row in plain}["stops"].endswith("stop ids (no stop strings)")


def test_a_resume_refuses_other_stops_and_accepts_the_same(tiny_target, prompts, tmp_path):  # noqa: F811
    run = ["--prompts", str(prompts), "--methods", "ar,hf", "--run-dir", str(tmp_path / "run"), "--format", "json"]
    first = invoke(*BENCH, *run, "--stop", "AB")
    assert first.exit_code == 0, first.output
    again = invoke(*BENCH, *run, "--stop", "AB")
    assert again.exit_code == 0 and json.loads(again.stdout) == json.loads(first.stdout), again.output
    assert "--stop (['AB'] -> ['A'])" in one_line(invoke(*BENCH, *run, "--stop", "A"))
    assert "config: stop (['AB'] -> [])" in one_line(invoke(*BENCH, *run))  # the key: no option gave it
    assert "--no-chat (True -> False)" in one_line(invoke(*BENCH, *run, "--stop", "AB", "--no-chat"))
    dry = json.loads(invoke(*BENCH, *run, "--stop", "A", "--dry-run").stdout)
    assert not {row["check"]: row for row in dry}["resume"]["ok"]


def test_a_run_from_before_the_keys_resumes_at_their_defaults_only(tiny_target, prompts, tmp_path):  # noqa: F811
    """A run folder whose config lacks `stop` and `chat` (an older specgen's) resumes with them at their defaults
    (no stop strings, chat true), and refuses other values, naming the flag."""
    run = ["--prompts", str(prompts), "--methods", "ar", "--run-dir", str(tmp_path / "run"), "--format", "json"]
    first = invoke(*BENCH, *run)
    assert first.exit_code == 0, first.output
    path = tmp_path / "run" / "run.json"
    doc = json.loads(path.read_text())
    assert doc["config"].pop("stop") == [] and doc["config"].pop("chat") is True
    path.write_text(json.dumps(doc))
    again = invoke(*BENCH, *run)
    assert again.exit_code == 0 and json.loads(again.stdout) == json.loads(first.stdout), again.output
    assert invoke(*BENCH, *run, "--chat").exit_code == 0  # the default, given
    assert "--no-chat ('<unset>' -> False)" in one_line(invoke(*BENCH, *run, "--no-chat"))
    assert "--stop ('<unset>' -> ['AB'])" in one_line(invoke(*BENCH, *run, "--stop", "AB"))
    dry = json.loads(invoke(*BENCH, *run, "--dry-run").stdout)
    assert {row["check"]: row for row in dry}["resume"]["ok"]


@pytest.mark.parametrize("args,said", [
    (["--stop", ""], "error: an empty stop string is in every text"),
    (["stop=[AB,'']"], "error: an empty stop string is in every text"),  # a recipe's list, as the option's
    (["--suite", "images", "--stop", "x"], "--stop is for --suite humaneval or text; it is not an option of the "
                                           "images suite"),
    (["--suite", "meshes", "--stop", "x"], "--stop is for --suite humaneval or text; it is not an option of the "
                                           "meshes suite"),
    (["--suite", "images", "--no-chat"], "--no-chat is for --suite humaneval or text"),
    (["--suite", "meshes", "--chat"], "--chat is for --suite humaneval or text"),
    (["report", "runs/x", "--stop", "x"], "--stop does not apply to `benchmark report`"),
    (["report", "runs/x", "--no-chat"], "--no-chat does not apply to `benchmark report`"),
])
def test_refusals_are_one_line(tiny_target, args, said):  # noqa: F811
    assert said in one_line(invoke("benchmark", "--model", "tiny-text", *args) if args[0] != "report" else
                            invoke("benchmark", *args))


def test_benchmark_help_documents_stop_and_no_chat():
    r = invoke("benchmark", "--help")
    text = " ".join(r.stdout.replace("│", " ").split())
    assert "[text] Stop string (repeatable; recipe key stop)" in text and "--no-chat" in text


@pytest.mark.slow
def test_the_embedded_model_keeps_what_generate_keeps(prompts, tmp_path):
    """SmolLM2 (byte-level BPE: a stop string completes inside a token) on raw code prompts with Codex-style stops:
    every row, transformers' included, keeps `generate --no-chat --stop`'s tokens."""
    prompts.write_text("def fib(n):\ndef is_prime(n):\n")
    stops = ["--stop", "\n    ", "--stop", "\ndef", "--stop", "```"]
    r = invoke("generate", "--prompts", str(prompts), "--no-chat", "--max-new-tokens", "16", "--format", "json",
               *stops)
    assert r.exit_code == 0, r.output
    want = [json.loads(line)["token_ids"] for line in r.stdout.splitlines()]
    rows = "ar,ngram,jacobi,hf,hf-lookup"
    b = invoke("benchmark", "--suite", "text", "--prompts", str(prompts), "--no-chat", "--max-new-tokens", "16",
               "--methods", rows, *stops, "--run-dir", str(tmp_path / "run"), "warmup=false", "nll=false")
    assert b.exit_code == 0, b.output
    assert kept_tokens(tmp_path / "run") == {m: want for m in rows.split(",")}
    assert all(len(w) < 16 for w in want)
