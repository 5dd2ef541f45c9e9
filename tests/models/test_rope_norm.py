"""The fused forms the decoder uses compute bit for bit what the textbook formulas compute (HF's RMSNorm, the
per-pair RoPE rotation), in float32 and bfloat16: a change of torch that breaks this fails here, not as a token
difference against transformers somewhere else."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specgen.models.rope import rotate, rotation, still, table_1d
from tests.conftest import tiny_model


def pairwise_rope(x: torch.Tensor, rot: torch.Tensor, layout: str) -> torch.Tensor:
    """The per-pair formula on x [B, H, S, D] with rot [B, S, D/2, 2]: (a, b) -> (a cos - b sin, b cos + a sin)."""
    cos, sin = rot[..., 0].unsqueeze(1), rot[..., 1].unsqueeze(1)
    if layout == "half":
        a, b = x.chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("head_dim", [8, 64, 128])
def test_rotate_is_the_pairwise_formula(dtype, layout, head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    table = table_1d(512, head_dim, 10000.0)
    positions = torch.randint(0, 512, (3, 5), generator=gen)
    rot = table[positions].to(dtype)  # [B, S, D/2, 2]
    x = (torch.randn(3, 4, 5, head_dim, generator=gen) * 3).to(dtype)
    assert torch.equal(rotate(x, rotation(rot, layout)), pairwise_rope(x, rot, layout))


def test_rotate_differs_between_layouts():
    """Control: the comparison above can fail (the two layouts rotate different pairs)."""
    table = table_1d(64, 16, 10000.0)
    rot = table[torch.arange(1, 6)[None]]
    x = torch.randn(1, 2, 5, 16)
    assert not torch.equal(rotate(x, rotation(rot, "half")), pairwise_rope(x, rot, "interleaved"))


@pytest.mark.parametrize("dim", [16, 64, 576, 960])
@pytest.mark.parametrize("rows", [1, 3, 300])
def test_rms_norm_is_hf_formula(dim, rows):
    gen = torch.Generator().manual_seed(dim + rows)
    for scale in (1e-3, 1.0, 50.0):
        x = torch.randn(rows, dim, generator=gen) * scale
        for eps in (1e-5, 1e-6):
            assert torch.equal(F.rms_norm(x, (dim,), eps=eps), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_a_still_rotation_keeps_every_value_bit_for_bit(dtype, layout):
    """A NoPE layer (SmolLM3) runs the RoPE layers' kernels with cos 1, sin 0: x itself, -0.0 and huge values too."""
    gen = torch.Generator().manual_seed(1)
    rot = rotation(table_1d(64, 16, 10000.0)[torch.randint(1, 64, (2, 5), generator=gen)].to(dtype), layout)
    x = (torch.randn(2, 3, 5, 16, generator=gen) * 1e4).to(dtype)
    x[0, 0, 0, :2] = torch.tensor([-0.0, torch.finfo(dtype).max])
    assert torch.equal(rotate(x, still(rot)), x) and not torch.equal(rotate(x, rot), x)  # control: rot turns


@pytest.mark.parametrize("cached", [False, True])
def test_a_model_without_rope_in_any_layer_reads_no_positions(cached):
    """All layers NoPE: a sequence's logits do not depend on its positions (eager, and over a cache on the CPU's
    native attention, whose kernel applies the rotation); control: one RoPE layer makes them depend on the distances
    between positions (RoPE ignores a common shift, so the positions are spread, not shifted)."""
    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    spread = torch.tensor([[0, 3, 4, 10, 11, 30, 31, 40]])

    def logits(model, positions: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return model(tokens, positions, model.new_cache(1, 64) if cached else None)[0]

    nope, half = tiny_model(0, nope_layers=(0, 1)), tiny_model(0, nope_layers=(1,))
    assert torch.equal(logits(nope, torch.arange(8)[None]), logits(nope, spread))
    assert not torch.allclose(logits(half, torch.arange(8)[None]), logits(half, spread), atol=1e-3)


@pytest.mark.parametrize("layers", [(2,), (1, 0), (0, 0), (-1,)])
def test_nope_layers_that_are_not_layers_are_refused(layers):
    with pytest.raises(ValueError, match="nope_layers"):
        tiny_model(0, nope_layers=layers)


@pytest.mark.parametrize("over,says", [(dict(local_layers=(1, 0), local_rope_theta=10.0), "local_layers"),
                                       (dict(local_layers=(1,), nope_layers=(1,), local_rope_theta=10.0),
                                        "local_layers"),
                                       (dict(local_layers=(1,)), "local_rope_theta"),
                                       (dict(local_rope_theta=10.0), "local_rope_theta"),
                                       (dict(embed_scale=0.0), "embed_scale"), (dict(ffn_act="relu"), "ffn_act"),
                                       (dict(sandwich_norms=True, cross_dim=8), "sandwich_norms"),
                                       (dict(window=8), "window"), (dict(local_layers=(0,), window=-1), "window"),
                                       (dict(local_layers=(0,), window=2.5), "window"),
                                       (dict(local_layers=(0,), window=4, rope_grid=4), "local_layers"),
                                       # a flag that is not a bool (a hand-edited entry's "yes" read as true)
                                       (dict(sandwich_norms="yes"), "sandwich_norms 'yes' is not true or false"),
                                       (dict(qk_norm=1), "qk_norm 1 is not"), (dict(tie_embeddings=None), "tie_emb")])
def test_gemma_fields_that_build_no_model_are_refused(over, says):
    with pytest.raises(ValueError, match=says):
        tiny_model(0, **over)


def test_a_sliding_config_reads_back_from_json_and_an_old_one_without_a_window_loads():
    """`window` survives JSON; a config saved before it (no key) loads with none (its local layers attend fully, as
    they did under the old context cap); NoPE layers may slide where no local base turns them (SmolLM3's)."""
    import json

    from specgen.models.transformer import TransformerConfig
    from tests.conftest import GEMMA, SLIDING

    for over in (*SLIDING.values(), dict(nope_layers=(1,), local_layers=(1,), window=4)):
        cfg = tiny_model(0, **over).cfg
        assert TransformerConfig(**json.loads(json.dumps(cfg.to_dict()))) == cfg
    old = {k: v for k, v in tiny_model(0, **GEMMA).cfg.to_dict().items() if k != "window"}
    assert TransformerConfig(**old).window == 0


def test_a_local_layer_turns_with_its_own_base_and_a_gemma_config_reads_back_from_json():
    """Gemma's local layers take the local table's rows (eager, and over the CPU's native cache); the config's new
    fields survive JSON (tuples come back as lists). Control: the same model with another local base differs."""
    import json

    from specgen.models.transformer import TransformerConfig
    from tests.conftest import GEMMA

    tokens = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    model = tiny_model(0, **GEMMA)
    assert TransformerConfig(**json.loads(json.dumps(model.cfg.to_dict()))) == model.cfg
    other = tiny_model(0, **{**GEMMA, "local_rope_theta": 10000.0})
    with torch.inference_mode():
        ours = model(tokens, torch.arange(8)[None])[0]
        cached = model(tokens, torch.arange(8)[None], model.new_cache(1, 64))[0]
        theirs = other(tokens, torch.arange(8)[None])[0]
    torch.testing.assert_close(cached, ours, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ours, theirs, atol=1e-3)
