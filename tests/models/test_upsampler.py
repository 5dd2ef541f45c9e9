"""MuLo-SD up/down-samplers: shapes, row causality, prefix consistency, quantisation, 2x -> 4x warm start."""

from __future__ import annotations

import pytest
import torch

from specgen.models.upsampler import RowCausalConv2d, UpDownSampler, UpsamplerConfig
from specgen.models.vq import VQ_CONFIGS, VQModel
from specgen.train.upsampler import VQFeatureDistance, vq_features

V = 64


def pair(scale: int = 2, seed: int = 0, skip: bool = False) -> UpDownSampler:
    torch.manual_seed(seed)
    p = UpDownSampler(UpsamplerConfig(codebook_size=V, embed_dim=8, scale=scale, channels=16, blocks=1, skip=skip))
    p.codebook.copy_(torch.randn(V, 8))
    for m in p.parameters():  # larger weights than the default init: every row must visibly react
        m.data.normal_(0, 0.3)
    return p.eval()


def test_conv_is_row_causal():
    torch.manual_seed(0)
    conv = RowCausalConv2d(3, 4, 5)
    x = torch.randn(1, 3, 7, 6)
    y = conv(x)
    x2 = x.clone()
    x2[:, :, 4] += 1.0
    d = (conv(x2) - y).abs().amax(dim=(0, 1, 3))
    assert y.shape == (1, 4, 7, 6)
    assert torch.all(d[:4] == 0) and torch.all(d[4:7] > 0)  # row 4 reaches rows 4..6 (kernel 5: 2 rows down)


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("scale", [2, 4])
def test_up_and_down_are_row_causal(scale, skip):
    p = pair(scale, skip=skip)
    g = 3
    low = torch.randint(0, V, (2, g, g))
    high = torch.randint(0, V, (2, g * scale, g * scale))
    with torch.no_grad():
        up, down = p.up_latents(low), p.down_latents(high)
        assert up.shape == (2, 8, g * scale, g * scale) and down.shape == (2, 8, g, g)
        for row in range(g):  # perturb low-res row `row`: high-res rows < row * scale never change
            low2 = low.clone()
            low2[:, row] = (low2[:, row] + 1) % V
            diff = (p.up_latents(low2) - up).abs().amax(dim=(0, 1, 3))
            assert torch.all(diff[: row * scale] == 0) and diff[row * scale :].max() > 0
        for row in range(g * scale):  # perturb high-res row `row`: low-res rows < row // scale never change
            high2 = high.clone()
            high2[:, row] = (high2[:, row] + 1) % V
            diff = (p.down_latents(high2) - down).abs().amax(dim=(0, 1, 3))
            assert torch.all(diff[: row // scale] == 0) and diff[row // scale :].max() > 0


@pytest.mark.parametrize("skip", [False, True])
def test_prefix_runs_equal_full_runs(skip):
    """Running on the first rows only gives the first rows of the full output (what MuLo-SD relies on)."""
    p = pair(2, skip=skip)
    low = torch.randint(0, V, (1, 4, 4))
    high = torch.randint(0, V, (1, 8, 4 * 2))
    full_up, full_down = p.upsample_tokens(low), p.downsample_tokens(high)
    for m in range(1, 4):
        assert torch.equal(p.upsample_tokens(low[:, :m]), full_up[:, : 2 * m])
        assert torch.equal(p.downsample_tokens(high[:, : 2 * m]), full_down[:, :m])


def test_quantize_matches_vq_rule_and_codes_round_trip():
    p = pair(2)
    ids = torch.randint(0, V, (2, 3, 5))
    assert torch.equal(p.quantize(p.embed(ids)), ids)  # a code vector quantises to itself
    with pytest.raises(ValueError):
        p.downsample_tokens(torch.zeros(1, 3, 4, dtype=torch.long))


def test_warm_start_2x_to_4x():
    small, big = pair(2, seed=1), pair(4, seed=2)
    fresh = big.warm_start_from(small)
    assert fresh and all(".stages.1." in k for k in fresh)
    sd_small, sd_big = small.state_dict(), big.state_dict()
    for k, v in sd_small.items():
        assert torch.equal(sd_big[k], v)


def test_stages_of_a_scale():  # other scales and even kernels: tests/cli/test_cli_train_upsampler.py
    assert UpsamplerConfig(scale=2).stages == 1 and UpsamplerConfig(scale=4).stages == 2


@pytest.mark.parametrize("scale", [2, 4])
def test_untrained_skip_pair_is_token_repeat_and_block_average(scale):
    """With the skip path and its zero-initialised heads, U_r repeats tokens and D_r inverts that repeat."""
    torch.manual_seed(0)
    p = UpDownSampler(UpsamplerConfig(codebook_size=V, embed_dim=8, scale=scale, channels=16, blocks=1, skip=True))
    p.codebook.copy_(torch.randn(V, 8))
    low = torch.randint(0, V, (2, 3, 3))
    repeated = low.repeat_interleave(scale, 1).repeat_interleave(scale, 2)
    assert torch.equal(p.upsample_tokens(low), repeated)
    assert torch.equal(p.downsample_tokens(repeated), low)


def test_the_vq_feature_distance_reads_each_level_at_its_own_resolution():
    """The perceptual substitute's features: conv_in's and each encoder level's before its downsample (64, 64, 32,
    16 on vq-tiny); a level's forward, which downsamples, would halve each of them once more."""
    torch.manual_seed(0)
    vq = VQModel(VQ_CONFIGS["vq-tiny"]).eval()
    x = torch.rand(1, 3, 64, 64) * 2 - 1
    with torch.no_grad():
        feats = vq_features(vq, x)
        assert [f.shape[-1] for f in feats] == [64, 64, 32, 16]
        assert VQFeatureDistance(vq)(x, x).abs().max() == 0 < VQFeatureDistance(vq)(x, -x).min()
