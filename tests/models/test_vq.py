"""LlamaGen-compatible VQ tokenizer: shapes, codebook, LlamaGen key layout, training signal, trainer I/O."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from specgen.models.vq import VQ_CONFIGS, VQConfig, VQModel

MICRO = VQConfig(codebook_size=32, codebook_embed_dim=4, ch=16, encoder_ch_mult=(1, 2), decoder_ch_mult=(1, 2),
                 z_channels=16, norm_groups=8, num_res_blocks=1, image_size=16)


def llamagen_vq_keys(ch_mult: tuple[int, ...], num_res_blocks: int = 2) -> set[str]:
    """The key names LlamaGen's `VQModel` (tokenizer/tokenizer_image/vq_model.py) produces, spelled out by hand."""
    conv = ("weight", "bias")
    keys = {f"{m}.{p}" for m in ("quant_conv", "post_quant_conv") for p in conv}
    keys |= {"quantize.embedding.weight", "quantize.codebook_used"}

    def res(prefix: str, c_in: int, c_out: int) -> set[str]:
        names = ["norm1", "conv1", "norm2", "conv2"] + (["nin_shortcut"] if c_in != c_out else [])
        return {f"{prefix}.{n}.{p}" for n in names for p in conv}

    def attn(prefix: str) -> set[str]:
        return {f"{prefix}.{n}.{p}" for n in ("norm", "q", "k", "v", "proj_out") for p in conv}

    levels = len(ch_mult)
    for part in ("encoder", "decoder"):
        keys |= {f"{part}.{n}.{p}" for n in ("conv_in", "norm_out", "conv_out") for p in conv}
        keys |= res(f"{part}.mid.0", 1, 1) | attn(f"{part}.mid.1") | res(f"{part}.mid.2", 1, 1)
    c = 1
    for lvl, m in enumerate(ch_mult):  # encoder: conv_blocks.0 is the highest resolution
        for j in range(num_res_blocks):
            keys |= res(f"encoder.conv_blocks.{lvl}.res.{j}", c, m)
            c = m
            if lvl == levels - 1:
                keys |= attn(f"encoder.conv_blocks.{lvl}.attn.{j}")
        if lvl != levels - 1:
            keys |= {f"encoder.conv_blocks.{lvl}.downsample.conv.{p}" for p in conv}
    c = ch_mult[-1]
    for i, lvl in enumerate(reversed(range(levels))):  # decoder: conv_blocks.0 is the lowest resolution
        for j in range(num_res_blocks + 1):
            keys |= res(f"decoder.conv_blocks.{i}.res.{j}", c, ch_mult[lvl])
            c = ch_mult[lvl]
            if lvl == levels - 1:
                keys |= attn(f"decoder.conv_blocks.{i}.attn.{j}")
        if lvl != 0:
            keys |= {f"decoder.conv_blocks.{i}.upsample.conv.{p}" for p in conv}
    return keys


@pytest.fixture(scope="module")
def vq16() -> VQModel:
    torch.manual_seed(0)
    return VQModel(VQ_CONFIGS["vq-16"]).eval()


def test_vq16_has_llamagen_keys_and_shapes(vq16: VQModel) -> None:
    sd = vq16.state_dict()
    assert set(sd) == llamagen_vq_keys((1, 1, 2, 2, 4))
    expected_shapes = {
        "encoder.conv_in.weight": (128, 3, 3, 3),
        "encoder.conv_blocks.0.downsample.conv.weight": (128, 128, 3, 3),
        "encoder.conv_blocks.2.res.0.nin_shortcut.weight": (256, 128, 1, 1),
        "encoder.conv_blocks.4.attn.1.proj_out.weight": (512, 512, 1, 1),
        "encoder.mid.1.q.weight": (512, 512, 1, 1),
        "encoder.conv_out.weight": (256, 512, 3, 3),
        "quant_conv.weight": (8, 256, 1, 1),
        "quantize.embedding.weight": (16384, 8),
        "quantize.codebook_used": (65536,),
        "post_quant_conv.weight": (256, 8, 1, 1),
        "decoder.conv_in.weight": (512, 256, 3, 3),
        "decoder.conv_blocks.0.attn.2.norm.weight": (512,),
        "decoder.conv_blocks.1.res.0.nin_shortcut.weight": (256, 512, 1, 1),
        "decoder.conv_blocks.3.upsample.conv.weight": (128, 128, 3, 3),
        "decoder.conv_out.weight": (3, 128, 3, 3),
    }
    for key, shape in expected_shapes.items():
        assert tuple(sd[key].shape) == shape, key
    assert not any("upsample" in k for k in sd if k.startswith("decoder.conv_blocks.4."))
    assert not any("downsample" in k for k in sd if k.startswith("encoder.conv_blocks.4."))


def test_vq8_keys() -> None:
    assert set(VQModel(VQ_CONFIGS["vq-8"]).state_dict()) == llamagen_vq_keys((1, 2, 2, 4))
    assert VQ_CONFIGS["vq-8"].downsample == 8 and VQ_CONFIGS["vq-16"].downsample == 16


def test_tiny_config_shapes_and_round_trip() -> None:
    cfg = VQ_CONFIGS["vq-tiny"]
    assert cfg.downsample == 4
    torch.manual_seed(0)
    model = VQModel(cfg).eval()
    images = torch.rand(2, 3, 64, 64) * 2 - 1  # [B,3,H,W]
    with torch.no_grad():
        idx = model.encode(images)
        assert idx.shape == (2, 16, 16) and idx.dtype == torch.long
        assert 0 <= int(idx.min()) and int(idx.max()) < cfg.codebook_size
        recon = model.decode_indices(idx)
        assert recon.shape == images.shape
        assert torch.allclose(model.decode_indices(idx.flatten(1)), recon)  # [B,h*w] accepted too
        out = model(images)
        assert out.recon.shape == images.shape and torch.equal(out.indices, idx)
        assert torch.allclose(out.recon, recon, atol=1e-5)  # forward == encode -> decode in eval
        emb = model.quantize.lookup(idx)
        assert emb.shape == (2, 16, 16, cfg.codebook_embed_dim)
    params = sum(p.numel() for p in model.state_dict().values())
    assert params * 2 < 5_000_000  # shipped fp16 checkpoint stays under ~5 MB


def test_codebook_is_l2_normalised() -> None:
    torch.manual_seed(0)
    model = VQModel(MICRO)
    with torch.no_grad():
        model.quantize.embedding.weight.mul_(3.0)  # raw weights need not be unit length ...
    codes = model.quantize.lookup(torch.arange(MICRO.codebook_size))  # [K,D]
    assert torch.allclose(codes.norm(dim=-1), torch.ones(MICRO.codebook_size), atol=1e-5)  # ... lookups are
    out = model(torch.rand(2, 3, 16, 16) * 2 - 1)
    assert torch.allclose(out.latents.norm(dim=1), torch.ones(2, 8, 8), atol=1e-5)


def test_training_loss_decreases_and_usage_window() -> None:
    torch.manual_seed(0)
    model = VQModel(MICRO).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    y, x = torch.meshgrid(torch.linspace(-1, 1, 16), torch.linspace(-1, 1, 16), indexing="ij")
    images = torch.stack([torch.stack([torch.sin(3 * x + k), torch.cos(2 * y - k), x * y]) for k in range(4)])
    losses = []
    for _ in range(25):
        out = model(images)
        loss = (out.recon - images).abs().mean() + out.quant_loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert out.commit_loss > 0 and out.codebook_loss > 0
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3
    used = model.quantize.codebook_used  # the rolling window of code ids seen (LlamaGen's buffer)
    assert 0 < used.unique().numel() <= MICRO.codebook_size and bool(used.any())


def test_trainer_writes_fp16_checkpoint_and_resumes(tmp_path) -> None:
    from specgen.train.vq import VQTrainConfig, VQTrainer

    micro = {k: v for k, v in MICRO.to_dict().items() if k != "image_size"}
    cfg = VQTrainConfig(model="vq-tiny", model_overrides=micro, crop_size=16, steps=4, batch_size=2,
                        patch_size=8, patch_fraction=0.5, warmup_steps=1, eval_samples=4, eval_every=4,
                        ckpt_every=2, log_every=2, restart_every=2)
    lines: list[str] = []
    metrics = VQTrainer(cfg, tmp_path, lines.append).run()
    assert metrics["step"] == 4 and metrics["weights"] == "fp16"
    assert metrics["heldout_psnr"] > 0 and 0 < metrics["codebook_usage"] <= 1
    doc = json.loads((tmp_path / "config.json").read_text())
    assert doc["config"]["codebook_size"] == 32 and doc["grid_size"] == 8
    weights = load_file(str(tmp_path / "model.safetensors"))
    assert all(t.dtype == torch.float16 for t in weights.values())
    VQModel(VQConfig(**doc["config"])).load_state_dict({k: v.float() for k, v in weights.items()})
    lines.clear()
    assert VQTrainer(cfg, tmp_path, lines.append).run()["step"] == 4  # resumed at the end: nothing left to train
    assert any("resumed at step 4/4" in line for line in lines)
    with pytest.raises(ValueError):
        VQTrainer(VQTrainConfig(**{**cfg.__dict__, "lr": 0.5}), tmp_path).run()
