"""The shipped SmolLM2 on this CPU: every lossless text method's greedy text is AR's, float32 and bfloat16."""

from __future__ import annotations

import pytest
import torch

from specgen.data.humaneval import load_problems
from specgen.decoding.sampling import SamplingParams
from specgen.methods import run_batch
from specgen.text.target import load_text_model
from tests.conftest import method_drafter

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lossless_methods_equal_ar_on_smollm2(dtype):
    """HumanEval/2 is where a bfloat16 n-gram left AR's text at token 47 while oneDNN ran the verify's products (its
    rows' bits depend on the row count); 64 tokens of the first three problems, each alone, at torch's threads."""
    model = load_text_model("smollm2-135m", dtype=None if dtype == "float32" else dtype)
    prompts = [model.tokenizer.encode(p.prompt) for p in load_problems(3)]
    with torch.inference_mode():
        out = {name: [r.tokens for r in run_batch(model.target, lambda i, name=name: method_drafter(name), prompts,
                                                   64, SamplingParams(), batch_size=1).results]
               for name in ("ar", "ngram", "jacobi")}
    assert all(len(t) == 64 for t in out["ar"])
    assert out["ngram"] == out["ar"] and out["jacobi"] == out["ar"]
