"""The `hf-compiled` peer row (eval/hf_rows.py): transformers' StaticCache and a compiled one-token step, greedy."""

from __future__ import annotations

import json

import pytest
import torch

from specgen.decoding.sampling import SamplingParams
from specgen.decoding.stops import Stops
from specgen.decoding.target import ModelTarget
from specgen.eval.hf_rows import generate_padded, one_token, timed_static_greedy
from specgen.methods import run_batch
from specgen.methods.text import EmptyDrafter
from specgen.models.hf_export import to_hf
from tests.cli.test_cli_bench_prompts import BENCH
from tests.cli.test_cli_text import invoke, tiny_target  # noqa: F401 - the fixture
from tests.conftest import EXAONE4, GEMMA2, GRANITE, MOE, OLMO2, OLMO3, tiny_model, unwindowed

PROMPT = [1, 2, 3, 4, 5, 1, 2, 3]


def test_the_static_cache_loop_decodes_what_ar_decodes_and_stops_at_a_stop_id():
    model = tiny_model(0)
    ar = run_batch(ModelTarget(model), lambda i: EmptyDrafter(), [PROMPT], 12, SamplingParams()).results[0].tokens
    hf = to_hf(model).eval()
    new, seconds = timed_static_greedy(hf, one_token, PROMPT, 12)
    assert new == ar and seconds > 0
    stop = ar[5]
    assert timed_static_greedy(hf, one_token, PROMPT, 12, Stops((stop,)), 64)[0] == ar[: ar.index(stop) + 1]


def test_the_hf_rows_of_a_gemma2_target_decode_what_ar_decodes():
    """A Gemma 2 target (scores capped, layer 0 sliding over 6 positions; 30 tokens past it) exports as transformers'
    Gemma2ForCausalLM, whose `hf` (generate), `hf-lookup` (prompt lookup) and `hf-compiled` (its StaticCache loop,
    uncompiled here) decode AR's tokens. Controls: the exports without the score cap or the window decode others."""
    def rows(over: dict) -> list[list[int]]:
        hf = to_hf(tiny_model(0, **over)).eval()
        return [timed_static_greedy(hf, one_token, PROMPT, 30)[0], generate_padded(hf, [PROMPT], 30)[0][0],
                generate_padded(hf, [PROMPT], 30, prompt_lookup_num_tokens=10)[0][0]]

    model = tiny_model(0, **GEMMA2)
    ar = run_batch(ModelTarget(model), lambda i: EmptyDrafter(), [PROMPT], 30, SamplingParams()).results[0].tokens
    assert type(to_hf(model)).__name__ == "Gemma2ForCausalLM"
    assert rows(GEMMA2) == [list(ar)] * 3
    for other in ({**GEMMA2, "attn_softcap": 0.0}, unwindowed(GEMMA2)):
        assert all(got != list(ar) for got in rows(other))


def test_the_hf_rows_of_an_olmo2_target_decode_what_ar_decodes():
    """An OLMo 2 target (no pre-norms, sandwich norms, q/k norms over whole projections) exports as transformers'
    Olmo2ForCausalLM, whose `hf`, `hf-lookup` and `hf-compiled` (uncompiled here) rows decode AR's tokens. Control:
    AR of the same weights with per-head q/k norms decodes other tokens (the whole span shows in what they match)."""
    model = tiny_model(0, **OLMO2)
    ar = run_batch(ModelTarget(model), lambda i: EmptyDrafter(), [PROMPT], 30, SamplingParams()).results[0].tokens
    hf = to_hf(model).eval()
    assert type(hf).__name__ == "Olmo2ForCausalLM"
    got = [timed_static_greedy(hf, one_token, PROMPT, 30)[0], generate_padded(hf, [PROMPT], 30)[0][0],
           generate_padded(hf, [PROMPT], 30, prompt_lookup_num_tokens=10)[0][0]]
    assert got == [list(ar)] * 3
    other = tiny_model(0, **{**OLMO2, "qk_norm_span": "head"})
    assert run_batch(ModelTarget(other), lambda i: EmptyDrafter(), [PROMPT], 30,
                     SamplingParams()).results[0].tokens != ar


@pytest.mark.parametrize("over,cls", [(OLMO3, "Olmo3ForCausalLM"), (EXAONE4, "Exaone4ForCausalLM")])
def test_the_hf_rows_of_olmo3_and_exaone4_targets_decode_what_ar_decodes(over, cls):
    """An OLMo 3 target (OLMo 2's block, layer 0 sliding with its own RoPE base) and an EXAONE 4 one (per-head q/k
    norms, layer 0 sliding, layer 1 NoPE) export as their transformers classes, whose `hf`, `hf-lookup` and
    `hf-compiled` (uncompiled here) rows decode AR's tokens, 30 of them past the window of 6. Control: AR of the same
    weights without the window decodes other tokens."""
    def ar(over: dict) -> list[int]:
        model = tiny_model(0, **over)
        return list(run_batch(ModelTarget(model), lambda i: EmptyDrafter(), [PROMPT], 30,
                              SamplingParams()).results[0].tokens)

    hf = to_hf(tiny_model(0, **over)).eval()
    assert type(hf).__name__ == cls
    got = [timed_static_greedy(hf, one_token, PROMPT, 30)[0], generate_padded(hf, [PROMPT], 30)[0][0],
           generate_padded(hf, [PROMPT], 30, prompt_lookup_num_tokens=10)[0][0]]
    assert got == [ar(over)] * 3
    assert ar(unwindowed(over)) != ar(over)


def test_the_hf_rows_of_a_granite_target_decode_what_ar_decodes():
    """A Granite target (embeddings scaled, logits divided) exports as transformers' GraniteForCausalLM, whose logits
    are the target's (the divisor included) and whose `hf`, `hf-lookup` and `hf-compiled` (uncompiled here) rows
    decode AR's tokens. Control: the export with its embedding multiplier reset to 1 decodes others."""
    def rows(hf) -> list[list[int]]:
        return [timed_static_greedy(hf, one_token, PROMPT, 30)[0], generate_padded(hf, [PROMPT], 30)[0][0],
                generate_padded(hf, [PROMPT], 30, prompt_lookup_num_tokens=10)[0][0]]

    model = tiny_model(0, **GRANITE).eval()
    ar = run_batch(ModelTarget(model), lambda i: EmptyDrafter(), [PROMPT], 30, SamplingParams()).results[0].tokens
    hf = to_hf(model).eval()
    assert type(hf).__name__ == "GraniteForCausalLM"
    x = torch.tensor([PROMPT])
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x, torch.arange(len(PROMPT))[None])[0], atol=1e-4, rtol=1e-4)
    assert rows(hf) == [list(ar)] * 3
    hf.model.embedding_multiplier = 1.0
    assert all(got != list(ar) for got in rows(hf))


def test_a_reused_static_cache_decodes_each_prompt_as_a_fresh_one():
    """One cache a size, reset for each prompt (as generate keeps its own): the same tokens as a new cache each time,
    a longer prompt before a shorter one included."""
    hf = to_hf(tiny_model(0)).eval()
    prompts, caches = [PROMPT, [7, 8, 9, 7, 8], PROMPT[:3] * 3], {}
    fresh = [timed_static_greedy(hf, one_token, p, 10, slots=64)[0] for p in prompts]
    assert [timed_static_greedy(hf, one_token, p, 10, slots=64, caches=caches)[0] for p in prompts] == fresh
    assert list(caches) == [64]


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_the_benchmark_row_equals_ar(compiled, tiny_target, monkeypatch):  # noqa: F811
    """The row through `specgen benchmark`; the default suite swaps torch.compile for the plain step (a compile of
    even the tiny model takes most of a minute on a CPU), the slow suite compiles."""
    if not compiled:
        monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    r = invoke(*BENCH, "--methods", "ar,hf-compiled", "--limit", "2")
    assert r.exit_code == 0, r.output
    rows = {row["method"]: row for row in json.loads(r.stdout)}
    assert rows["hf-compiled"]["exact_match_vs_ar"] == 1.0 and rows["hf-compiled"]["tokens_per_s"] > 0


@pytest.mark.parametrize("over,cls", [(MOE, "MixtralForCausalLM"),
                                      ({**MOE, "qk_norm": True, "expert_renorm": False}, "Qwen3MoeForCausalLM")])
def test_the_hf_rows_of_a_moe_target_decode_what_ar_decodes(over, cls):
    """A routed target exports as transformers' Mixtral (the k weights renormalised) or Qwen3-MoE (q/k norms), whose
    `hf`, `hf-lookup` and `hf-compiled` (uncompiled here) rows decode AR's tokens. Control: AR of the same weights
    routing one expert a token decodes others."""
    model = tiny_model(0, **over)
    ar = run_batch(ModelTarget(model), lambda i: EmptyDrafter(), [PROMPT], 30, SamplingParams()).results[0].tokens
    hf = to_hf(model).eval()
    assert type(hf).__name__ == cls
    got = [timed_static_greedy(hf, one_token, PROMPT, 30)[0], generate_padded(hf, [PROMPT], 30)[0][0],
           generate_padded(hf, [PROMPT], 30, prompt_lookup_num_tokens=10)[0][0]]
    assert got == [list(ar)] * 3
    other = tiny_model(0, **{**over, "experts_per_token": 1})
    assert run_batch(ModelTarget(other), lambda i: EmptyDrafter(), [PROMPT], 30,
                     SamplingParams()).results[0].tokens != ar
