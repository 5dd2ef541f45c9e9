"""A bfloat16 target: greedy AR equals transformers' bfloat16 generate on the same tiny Llama, logits close."""

from __future__ import annotations

import pytest
import torch

from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.methods import run_batch
from specgen.models.hf_export import to_hf
from tests.conftest import method_drafter, tiny_model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bf16_greedy_ar_equals_transformers_bf16(seed):
    model = tiny_model(seed)
    hf = to_hf(model).to(torch.bfloat16)
    ours = model.to(torch.bfloat16)
    prompt = torch.randint(0, 64, (10,), generator=torch.Generator().manual_seed(seed)).tolist()
    tokens = run_batch(ModelTarget(ours), lambda i: method_drafter("ar"), [prompt], 24,
                       SamplingParams()).results[0].tokens
    with torch.inference_mode():
        out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 10, dtype=torch.long),
                          max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
        seq = torch.tensor([prompt + tokens])
        logits = ours(seq, torch.arange(seq.shape[1])[None])[0].float()
        want = hf(seq).logits.float()
    assert tokens == out[0, 10:].tolist()
    # bfloat16 activations round differently in the two implementations (attention math: float32 here)
    assert (logits - want).abs().max() < 0.05 * want.abs().max()
    assert ours.new_cache(1, 8).k.dtype == torch.bfloat16  # the KV cache follows the activation dtype
