"""Text benchmark rows: `method@tag` variant rows (the images suite's spelling), `method:tag`, `method@MODEL`."""

import pytest

from specgen.errors import UsageError
from specgen.eval.text_bench import TextBenchConfig, decoded_model, plan, row_method, row_model, row_options


def cfg(**kw) -> TextBenchConfig:
    return TextBenchConfig(**{"methods": ["ar"], **kw})


def test_at_tag_is_a_variant_row_like_colon_tag():
    c = cfg(method_options={"pcllm": {"block_size": 4}, "pcllm@n8": {"block_size": 8}, "pcllm:n8": {"block_size": 8}})
    for row in ("pcllm@n8", "pcllm:n8"):
        assert row_method(row) == "pcllm" and row_model(row) is None
        assert row_options(row, c) == {"block_size": 8}
        assert decoded_model(row, c) == "smollm2-135m-pcllm"  # the method's distilled target, as the plain row
    assert decoded_model("pcllm@n8", cfg(targets={"pcllm@n8": "other"})) == "other"


def test_a_variant_row_on_another_model_keeps_the_variants_options():
    """`ngram:cache@NAME` is the `ngram:cache` variant decoding NAME: its options are the variant's (they were the
    method's alone, so a bfloat16 `ngram:cache@` row ran without its cache), a row's own entry over them."""
    c = cfg(method_options={"ngram": {"num_draft": 4, "budget": "fixed"}, "ngram:cache": {"cache": "smollm2-135m"},
                            "ngram:auto@smollm2-135m+bf16": {"budget": "auto"}})
    assert row_options("ngram:cache@smollm2-135m+bf16", c) == {"num_draft": 4, "budget": "fixed",
                                                                "cache": "smollm2-135m"}
    assert row_options("ngram:auto@smollm2-135m+bf16", c) == {"num_draft": 4, "budget": "auto"}
    assert row_options("ngram@smollm2-135m+bf16", c) == {"num_draft": 4, "budget": "fixed"}  # the control
    assert row_model("ngram:cache@smollm2-135m+bf16") == "smollm2-135m+bf16"


@pytest.mark.parametrize("row, model", [
    ("ar@anything", "anything"),  # ar@ rows always name the model (the exact-match reference rows)
    ("pcllm@smollm2-135m", "smollm2-135m"),  # a built-in
    ("jacobi@target/smollm2-135m+int8", "target/smollm2-135m+int8"),  # kind/name with a precision suffix
    ("jacobi@smollm2-135m-pcllm+bf16", "smollm2-135m-pcllm+bf16"),
])
def test_at_model_name_decodes_that_model(row, model):
    assert row_model(row) == model and decoded_model(row, cfg()) == model


def test_a_variant_row_without_options_of_its_own_is_refused():
    """`pcllm@nosuchmodel` is no model; with nothing of its own it would silently repeat `pcllm`. So would a typo'd
    `METHOD:tag` row (`--methods ar,ngram:cahce` beside a recipe's `ngram:cache` entry), which ran as ngram."""
    plan(cfg(methods=["ar", "pcllm@n8"], method_options={"pcllm@n8": {"block_size": 8}}))
    plan(cfg(methods=["ar", "pcllm:n8"], targets={"pcllm:n8": "smollm2-135m-pcllm"}))  # a target of its own
    with pytest.raises(UsageError, match="row pcllm@nosuchmodel: 'nosuchmodel' is not a registry model"):
        plan(cfg(methods=["ar", "pcllm@nosuchmodel"]))
    with pytest.raises(UsageError, match=r"^row ngram:cahce: a variant row needs options.ngram:cahce or "
                                         r"targets.ngram:cahce of its own \(else it decodes as ngram\); did you mean "
                                         r"ngram:cache\?$"):
        plan(cfg(methods=["ar", "ngram:cahce"], options={"ngram:cache": {"num_draft": 3}}))
    with pytest.raises(UsageError, match=r"^row hf:x: a variant row needs options.hf:x of its own"):
        plan(cfg(methods=["ar", "hf:x"]))
    with pytest.raises(UsageError, match="method pcllm@n8|has no option"):
        plan(cfg(methods=["ar", "pcllm@n8"], method_options={"pcllm@n8": {"blocks": 8}}))
