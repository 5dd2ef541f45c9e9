"""The training-time image samplers run on the shared decoding loop and draw the tokens (and record the features) of
LlamaGen's batched sampling chain, written out here as the reference: one prefill of every [cond; null] row, then
one forward of all rows per token, logits-level CFG, a draw a row per step (LlamaGen's multinomial over the [B, V]
batch; here specgen's sampler, one uniform a row by inverse CDF, which draws the same law)."""

from __future__ import annotations

import pytest
import torch

from specgen.decoding.sampling import SamplingParams, inverse_cdf, logits_to_probs
from specgen.train.image_gpt import sample_images
from tests.image_fixtures import one_thread, tiny_image_target

_threads = pytest.fixture(autouse=True)(one_thread)


@torch.no_grad()
def llamagen_chain(model, labels: torch.Tensor, cfg_scale: float, params: SamplingParams,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [B, N] and features [branches, B, N, D] of LlamaGen's c2i `generate` with a static cache."""
    b, n = labels.shape[0], model.cfg.rope_grid ** 2
    rows = torch.cat([labels, torch.full_like(labels, model.cfg.num_classes)]) if cfg_scale > 1 else labels
    cache = model.new_cache(rows.shape[0], 1 + n)
    logits, hidden = model(None, torch.zeros(rows.shape[0], 1, dtype=torch.long), cache,
                           embeds=model.cls_embedding(rows))
    tokens, feats = [], []
    for r in range(n):
        cache.lengths = [length + 1 for length in cache.lengths]
        feats.append(hidden[:, -1])
        lg = logits[:, -1].float()
        if cfg_scale > 1:
            lg = lg[b:] + cfg_scale * (lg[:b] - lg[b:])
        probs = logits_to_probs(lg, params)
        tok = probs.argmax(-1) if params.greedy else torch.cat([  # a row at a time, one uniform each
            inverse_cdf(probs[i : i + 1], torch.rand(1, 1, generator=generator)) for i in range(b)])
        tokens.append(tok)
        x = tok.repeat(rows.shape[0] // b)[:, None]
        logits, hidden = model(x, torch.full((rows.shape[0], 1), 1 + r, dtype=torch.long), cache)
    return torch.stack(tokens, 1), torch.stack(feats, 1).view(rows.shape[0] // b, b, n, -1)


@pytest.mark.parametrize("cfg_scale,temperature,top_k", [(4.0, 1.0, 0), (1.0, 0.7, 20), (2.0, 0.0, 0)])
def test_the_shared_loop_draws_llamagens_tokens_and_records_its_features(cfg_scale, temperature, top_k):
    model = tiny_image_target(seed=3).eval()
    labels = torch.tensor([0, 2, 1, 2, 0])
    params = SamplingParams(temperature, top_k)
    want, want_f = llamagen_chain(model, labels, cfg_scale, params, torch.Generator().manual_seed(11))
    got, got_f = sample_images(model, labels, cfg_scale, temperature, top_k,
                               generator=torch.Generator().manual_seed(11), features=True)
    assert torch.equal(got, want)
    assert got_f.shape == want_f.shape == ((2 if cfg_scale > 1 else 1), 5, 16, model.cfg.dim)
    torch.testing.assert_close(got_f, want_f, atol=1e-5, rtol=1e-5)
    assert torch.equal(sample_images(model, labels, cfg_scale, temperature, top_k,
                                     generator=torch.Generator().manual_seed(11)), got)  # features or not: same tokens
