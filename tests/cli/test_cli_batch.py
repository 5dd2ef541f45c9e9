"""`--batch-size` through the CLI: batched text output equals unbatched, the batch table, and one-line refusals."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli_text import invoke, tiny_target  # noqa: F401 (fixture)

PROMPTS = ["HELLO WORLD", "AB", "A LONGER PROMPT THAN THE OTHERS", "XYZ XYZ XYZ", "Q"]


@pytest.mark.parametrize("method", ["ar", "ngram", "pcllm-mr"])
def test_batched_generate_equals_one_at_a_time_in_input_order(tiny_target, method):  # noqa: F811
    args = ["generate", "--model", "tiny-text", "--no-chat", "--max-new-tokens", "10", "--format", "json",
            "--method", method]
    for p in PROMPTS:
        args += ["--prompt", p]
    alone = invoke(*args)
    batched = invoke(*args, "--batch-size", "3")
    wide = invoke(*args, "--batch-size", "64")  # larger than the prompt count: clamped
    assert alone.exit_code == batched.exit_code == wide.exit_code == 0, batched.output
    rows = [[json.loads(line) for line in r.stdout.splitlines()] for r in (alone, batched, wide)]
    assert [r["prompt"] for r in rows[1]] == PROMPTS
    assert [r["token_ids"] for r in rows[0]] == [r["token_ids"] for r in rows[1]] == [r["token_ids"] for r in rows[2]]
    assert all(r["stats"]["latency_s"] > 0 for r in rows[1])


def test_batch_table_reports_throughput_and_latency(tiny_target):  # noqa: F811
    r = invoke("generate", "--model", "tiny-text", "--no-chat", "--max-new-tokens", "6", "--batch-size", "2",
               "--prompt", "AB", "--prompt", "CD", "--prompt", "EF", "method_options.budget=auto", "--method", "ngram")
    assert r.exit_code == 0, r.output
    assert "batch of 2 slots" in r.stderr and "throughput" in r.stderr


@pytest.mark.parametrize("args, needle", [
    (["generate", "--batch-size", "0"], "must be >= 1"),
    (["generate", "--batch-size", "-4"], "must be >= 1"),
    (["generate", "method_options.budget=sometimes", "--method", "ngram"], "budget must be fixed or auto"),
    (["benchmark", "--suite", "humaneval", "--batch-size", "1,x"], "comma-separated integers"),
    (["benchmark", "--suite", "humaneval", "--batch-size", "0"], "comma-separated integers"),
    (["benchmark", "--suite", "meshes", "--batch-size", "4,y"], "comma-separated integers"),
    (["benchmark", "--suite", "humaneval", "--batch-size", "1,,2"], "has an empty item"),  # was read as 1,2
    (["benchmark", "--suite", "images", "--batch-size", "1,2,"], "has an empty item"),
    (["benchmark", "--suite", "humaneval", "--batch-size", "1,+2"], "comma-separated integers"),
])
def test_bad_batch_input_is_one_line(tiny_target, args, needle):  # noqa: F811
    if args[0] == "generate":
        args = args + ["--model", "tiny-text", "--prompt", "AB", "--no-chat"]
    r = invoke(*args)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.exit_code == 2, r.output
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], r.stderr
