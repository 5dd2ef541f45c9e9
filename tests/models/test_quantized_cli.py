"""--dtype / --quantize through the CLI on a tiny registry target: lossless rows, stored entries, one-line refusals,
and the benchmark's quantized rows (quality vs the float32 original) and llamacpp row (skipped without the package)."""

from __future__ import annotations

import json

import pytest

from specgen import checkpoints, registry
from tests.cli.test_cli_text import invoke, tiny_target  # noqa: F401 - the fixture

GEN = ["generate", "--model", "tiny-text", "--no-chat", "--max-new-tokens", "12", "--format", "json",
       "--prompt", "HELLO WORLD HELLO"]


def tokens(result) -> list[int]:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.splitlines()[0])["token_ids"]


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_generate_quantized_is_lossless_and_stored_once(tiny_target, quantize):  # noqa: F811
    ar = tokens(invoke(*GEN, "--quantize", quantize))
    suffix = "-g32" if quantize == "int4" else ""
    entry = checkpoints.find(f"tiny-text-{quantize}{suffix}")
    assert entry.meta["quantized"]["base"] == "target/tiny-text"
    assert tokens(invoke(*GEN, "--quantize", quantize, "--method", "ngram")) == ar
    assert tokens(invoke(*GEN, "--quantize", quantize, "--method", "jacobi")) == ar
    args = [a if a != "tiny-text" else f"tiny-text+{quantize}" for a in GEN]
    assert tokens(invoke(*args)) == ar  # the +suffix names the same target
    assert tokens(invoke(*[a if a != "tiny-text" else entry.name for a in GEN])) == ar  # and so does the entry


@pytest.mark.parametrize("extra,needle", [
    (["--quantize", "int5"], "--quantize must be one of"),
    (["--quantize", "int8", "--dtype", "float32"], "runs bfloat16 activations"),
    (["--dtype", "float64"], "--dtype must be one of"),
])
def test_bad_precision_is_one_line_exit_2(tiny_target, extra, needle):  # noqa: F811
    r = invoke(*GEN, *extra)
    assert r.exit_code == 2 and needle in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_a_stored_entry_of_another_mode_is_refused(tiny_target):  # noqa: F811
    tokens(invoke(*GEN, "--quantize", "int8"))
    r = invoke(*[a if a != "tiny-text" else "tiny-text-int8" for a in GEN], "--quantize", "int4")
    assert r.exit_code == 2 and "holds int8 weights, not int4" in r.output


@pytest.fixture
def long_tiny_target(tiny_target):  # noqa: F811
    """target/tiny-long: the tiny target's tokenizer on a model long enough for HumanEval prompts."""
    import shutil

    from tests.conftest import tiny_model

    model = tiny_model(0, max_seq_len=2048)
    meta = {k: v for k, v in tiny_target.meta.items() if k not in ("kind", "name")} | {"kwargs": model.cfg.to_dict()}

    def copy_tokenizer(folder):
        for f in tiny_target.path.iterdir():
            if f.name not in (registry.WEIGHTS, registry.CONFIG):
                shutil.copy2(f, folder / f.name)

    return registry.save("target", "tiny-long", model.state_dict(), meta, copy_tokenizer)


def test_benchmark_quantized_rows_and_skipped_llamacpp(long_tiny_target, monkeypatch):
    from specgen.eval import llamacpp_row

    monkeypatch.setattr(llamacpp_row.LlamaCppRow, "unavailable",
                        staticmethod(lambda *a: "llamacpp row skipped: llama-cpp-python is not installed"))
    r = invoke("benchmark", "--suite", "humaneval", "--model", "tiny-long", "--limit", "2", "--max-new-tokens", "8",
               "--format", "json", "--methods", "ar,ar@tiny-long+int8,ngram:q,llamacpp", "execute=false",
               "warmup=false", "targets.ngram:q=tiny-long+int8")
    assert r.exit_code == 0, r.output
    assert "llamacpp row skipped" in r.stderr
    rows = {row["method"]: row for row in json.loads(r.stdout)}
    assert set(rows) == {"ar", "ar@tiny-long+int8", "ngram:q"}  # no duplicate ar@ row, llamacpp left out
    q, n = rows["ar@tiny-long+int8"], rows["ngram:q"]
    assert n["exact_match_vs_own_ar"] == 1.0 and q["exact_match_vs_own_ar"] == 1.0
    assert "nll_base" in q and "prefix_vs_ar" in q  # quality against the float32 original
