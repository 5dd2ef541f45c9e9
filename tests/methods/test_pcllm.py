"""pcllm (Jacobi on the distilled model) and pcllm-mr (multi-block + rejection recycling) equal greedy AR."""

from __future__ import annotations

import pytest

from tests.conftest import decode
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.errors import UsageError
from specgen.methods import get_method, model_for
from specgen.methods.options import MultiBlockOptions
from specgen.methods.pcllm import MultiBlockDrafter
from specgen.methods.text import EmptyDrafter
from tests.conftest import method_drafter, tiny_model

CONFIGS = [
    {},
    {"num_blocks": 1},
    {"block_size": 4, "num_blocks": 3, "spawn_ratio": 0.3, "verify": 2},
    {"block_size": 3, "pool_size": 0},  # an empty pool: no recycling
    {"block_size": 6, "ngram": 12, "verify": 3, "spawn_ratio": 0.5},
    {"lookup": 8},
    {"block_size": 3, "num_blocks": 1, "pool_size": 0, "lookup": 5},
]


def mr(**options):
    return MultiBlockDrafter(MultiBlockOptions(**options))


def target_of(seed):
    t = ModelTarget(tiny_model(seed))
    t.device = "cpu"
    return t


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_methods_equal_ar(seed):
    t = target_of(seed)
    for p in range(2):
        prompt = [1, 5, 9, 3, p, 7, 7, 1]
        ar = decode(t, EmptyDrafter(), prompt, 48, SamplingParams()).tokens
        for name in ("pcllm", "cllm"):
            d = method_drafter(name, p, block_size=5)
            assert decode(t, d, prompt, 48, SamplingParams()).tokens == ar
        for cfg in CONFIGS:
            res = decode(t, method_drafter("pcllm-mr", p, **cfg), prompt, 48, SamplingParams())
            assert res.tokens == ar, cfg
            assert res.stats.new_tokens == 48 and res.stats.target_forwards <= 48


def test_mr_stops_at_stop_token_like_ar():
    t = target_of(3)
    prompt = [4, 4, 2, 9]
    ar = decode(t, EmptyDrafter(), prompt, 40, SamplingParams()).tokens
    stop = (ar[17],)
    want = decode(t, EmptyDrafter(), prompt, 40, SamplingParams(), stop).tokens
    got = decode(t, mr(block_size=4), prompt, 40, SamplingParams(), stop).tokens
    assert got == want and got[-1] == stop[0]


def test_mr_recycles_on_a_repetitive_model():
    """A model that loops makes rejected tails reappear: some tokens must come from the pool, output unchanged."""
    t = target_of(0)
    prompt = [1, 2, 3]
    ar = decode(t, EmptyDrafter(), prompt, 80, SamplingParams()).tokens
    res = decode(t, mr(block_size=6, num_blocks=2, spawn_ratio=0.5, verify=2), prompt, 80, SamplingParams())
    assert res.tokens == ar
    assert res.stats.tpf >= 1.0


def test_mr_lookup_branch_commits_prompt_continuations():
    """A looping model repeats its own text: the prompt-lookup branch must win steps, output unchanged."""
    t = target_of(0)
    prompt = [1, 2, 3]
    ar = decode(t, EmptyDrafter(), prompt, 80, SamplingParams()).tokens
    plain = decode(t, mr(block_size=3, num_blocks=1, verify=0), prompt, 80, SamplingParams())
    res = decode(t, mr(block_size=3, num_blocks=1, verify=0, lookup=8), prompt, 80, SamplingParams())
    assert res.tokens == plain.tokens == ar
    assert res.stats.extras.get("recycled_tokens", 0) > 0  # only the lookup branch can be a non-main winner here
    assert res.stats.target_forwards < plain.stats.target_forwards


def test_mr_trees_of_more_nodes_than_the_draft_cap_equal_ar():
    """A tree's depth is within the loop's draft cap (256), its nodes are not: the window, `verify` recycled n-grams
    and the lookup branch, side by side (here up to 500 nodes); the loop's cache holds them."""
    t = ModelTarget(tiny_model(1, vocab_size=8, max_seq_len=1024))  # 8 tokens: n-grams recur, branches fill up
    prompt = [1, 2, 3, 1, 2, 3, 4]
    ar = decode(t, EmptyDrafter(), prompt, 100, SamplingParams()).tokens
    res = decode(t, mr(block_size=100, verify=4, lookup=100), prompt, 100, SamplingParams())
    assert res.tokens == ar
    assert max(res.stats.draft_sizes) > 256


def test_mr_options():
    with pytest.raises(UsageError, match=r"block_size must be >= 2 .*\(option block_size of pcllm-mr\)"):
        get_method("pcllm-mr").parse_options({"block_size": 1})
    with pytest.raises(UsageError, match="no option"):
        get_method("pcllm-mr").parse_options({"blocks": 2})


def test_distilled_methods_pick_their_model():
    for name in ("pcllm", "pcllm-mr"):
        assert model_for(get_method(name), "smollm2-135m", "smollm2-135m") == "smollm2-135m-pcllm"
        assert model_for(get_method(name), "tiny", "smollm2-135m") == "tiny"  # an explicit model wins
    assert model_for(get_method("cllm"), "smollm2-135m", "smollm2-135m") == "smollm2-135m-cllm"
    assert model_for(get_method("ar"), "smollm2-135m", "smollm2-135m") == "smollm2-135m"
    # the default model spelled as kind/name, or at a precision (`--model NAME+int8` is NAME at int8): `generate
    # --method pcllm --model target/smollm2-135m` (or smollm2-135m+int8) decoded the base, smollm2-135m the target
    pcllm = get_method("pcllm")
    assert model_for(pcllm, "target/smollm2-135m", "smollm2-135m") == "smollm2-135m-pcllm"
    assert model_for(pcllm, "smollm2-135m+int8", "smollm2-135m") == "smollm2-135m-pcllm+int8"
    assert model_for(pcllm, "target/smollm2-135m+bf16+int4", "smollm2-135m") == "smollm2-135m-pcllm+bf16+int4"
    assert model_for(pcllm, "draft/smollm2-135m", "smollm2-135m") == "draft/smollm2-135m"  # another entry
