"""Text-conditional (t2i) generation: greedy EAGLE-2 / ADT-Tree equal AR under CFG with left-padded captions,
caption files (formats, left padding, bad input), and `specgen generate --captions` end to end."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from cli.main import app
from specgen import registry
from specgen.decoding.sampling import SamplingParams
from specgen.errors import IncompatibleError, UsageError
from specgen.image.captions import left_pad, read_captions
from specgen.image.target import CaptionCFGTarget
from specgen.methods.adt_tree import AdtPolicy
from specgen.methods.eagle import EagleTreeDrafter, FixedShape, TreeShape
from specgen.methods.options import AdtOptions
from specgen.methods.text import EmptyDrafter
from specgen.models.eagle import EagleNet
from specgen.models.llamagen import llamagen_config
from specgen.models.transformer import Transformer
from tests.conftest import decode
from tests.image.helpers import TinyEagle, tiny_image_gpt
from tests.image_fixtures import one_thread

_threads = pytest.fixture(autouse=True)(one_thread)

GRID, N_COND, CAP = 4, 6, 16
runner = CliRunner()


def tiny_t2i_gpt(seed: int = 0, vocab: int = 32) -> Transformer:
    """A random t2i GPT: 4x4 grid, 6 caption slots of width 16, 2D RoPE with 6 zero condition rows."""
    torch.manual_seed(seed)
    cfg = dataclasses.replace(llamagen_config("gpt-tiny", vocab=vocab, grid=GRID, model_type="t2i",
                                              cls_token_num=N_COND, caption_dim=CAP),
                              dim=32, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=64)
    model = Transformer(cfg)
    for p in model.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.4)
    return model.eval()


def caption(seed: int, n_valid: int):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(1, N_COND, CAP, generator=g)
    mask = torch.arange(N_COND)[None] < n_valid  # right-padded, as T5 returns it
    return left_pad(feats, mask, N_COND)[0]


def drafter(model, target, policy):
    return EagleTreeDrafter(TinyEagle(model).eval(), model.output, policy, max_len=64, guidance=target.cfg_scale)


@pytest.mark.parametrize("cfg_scale", [1.0, 3.0])
@pytest.mark.parametrize("n_valid", [2, 5])
def test_eagle2_and_adt_tree_greedy_equal_ar_with_padded_captions(cfg_scale, n_valid):
    model = tiny_t2i_gpt(n_valid)
    target = CaptionCFGTarget(model, cfg_scale, caption(n_valid, n_valid))
    n = GRID * GRID
    ar = decode(target, EmptyDrafter(), target.prompt(), n, SamplingParams()).tokens
    assert len(ar) == n
    eagle = decode(target, drafter(model, target, FixedShape(TreeShape(3, 4, 12))), target.prompt(), n,
                   SamplingParams())
    assert eagle.tokens == ar
    adt = AdtPolicy(AdtOptions(d0=2, k0=4, l_k=1, k_min=1, k_max=8, total_tokens=10), GRID, N_COND)
    assert decode(target, drafter(model, target, adt), target.prompt(), n, SamplingParams()).tokens == ar
    net = EagleNet.from_target(model).eval()  # the registry drafter class, untrained
    d = EagleTreeDrafter(net, model.output, FixedShape(TreeShape(3, 4, 12)), max_len=64, guidance=target.cfg_scale)
    assert decode(target, d, target.prompt(), n, SamplingParams()).tokens == ar


def test_oracle_drafter_is_fully_accepted_through_the_key_mask():
    """The target itself as drafter, over a cache whose caption prefix is padded: trees built with explicit
    multi-level masks (attn_mask) must see exactly the target's keys to be accepted at every level."""
    model = tiny_t2i_gpt(3)
    target = CaptionCFGTarget(model, 2.0, caption(1, 3))

    class Oracle(torch.nn.Module):
        graphs = None

        def new_cache(self, batch, max_len):
            return model.new_cache(batch, max_len)

        def forward(self, features, tokens, positions, cache=None, tree_mask=None, attn_mask=None):
            if cache.lengths[0] == 0:  # the image's first catch-up: the caption positions + key mask first
                target.prefill(torch.tensor([target.prompt()]), cache)
            return model.hidden_states(model.tok_embeddings(tokens), positions, cache, tree_mask, attn_mask=attn_mask)

    depth = 3
    d = EagleTreeDrafter(Oracle(), model.output, FixedShape(TreeShape(depth, 2, 8)), max_len=64,
                         guidance=target.cfg_scale)
    res = decode(target, d, target.prompt(), GRID * GRID, SamplingParams())
    ar = decode(target, EmptyDrafter(), target.prompt(), GRID * GRID, SamplingParams()).tokens
    assert res.tokens == ar
    full = [a for a, size in zip(res.stats.accepted, res.stats.depths) if size == depth]
    assert full and all(a == depth for a in full)


def test_read_captions_formats_and_left_padding(tmp_path):
    feats = torch.randn(2, 4, CAP)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.int64)
    save_file({"features": feats, "mask": mask}, str(tmp_path / "c.safetensors"))
    np.savez(tmp_path / "c.npz", features=feats.numpy(), mask=mask.bool().numpy())
    np.save(tmp_path / "c.npy", feats.numpy())
    for name in ("c.safetensors", "c.npz"):
        caps = read_captions(tmp_path / name, N_COND, CAP)
        assert [c.valid.tolist() for c in caps] == [[False] * 3 + [True] * 3, [False] * 5 + [True]]
        torch.testing.assert_close(caps[0].features[3:], feats[0, :3])
        assert caps[0].features[:3].abs().sum() == 0 and [c.index for c in caps] == [0, 1]
    caps = read_captions(tmp_path / "c.npy", N_COND, CAP)  # no mask: every token is real
    assert [int(c.valid.sum()) for c in caps] == [4, 4]


def test_a_caption_npy_that_is_not_one_or_holds_objects_is_refused_as_such(tmp_path):
    """numpy's own refusal of either is advice to allow pickles, which nothing here does."""
    (tmp_path / "junk.npy").write_bytes(b"not numpy")
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    for name, needle in (("junk.npy", "not a .npy file .no NumPy header.; save caption features"),
                         ("objects.npy", "holds Python objects")):
        with pytest.raises(UsageError, match=needle) as info:
            read_captions(tmp_path / name, N_COND, CAP)
        assert "pickle" not in str(info.value)


@pytest.mark.parametrize("arrays,error,needle", [
    ({"features": torch.randn(2, 4, CAP + 1)}, IncompatibleError, "17 wide"),
    ({"features": torch.randn(2, N_COND + 1, CAP)}, UsageError, "at most 6"),
    ({"features": torch.full((1, 3, CAP), float("nan"))}, UsageError, "NaN"),
    ({"features": torch.randn(2, 4, CAP), "mask": torch.zeros(2, 3)}, UsageError, "mask must be"),
    ({"features": torch.randn(2, 4, CAP), "mask": torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])}, UsageError, "no valid"),
    ({"features": torch.randn(2, 4, CAP), "mask": torch.full((2, 4), 2)}, UsageError, "0/1"),
    ({"feats": torch.randn(2, 4, CAP)}, UsageError, "no 'features'"),
])
def test_bad_caption_files(tmp_path, arrays, error, needle):
    path = tmp_path / "bad.safetensors"
    save_file(arrays, str(path))
    with pytest.raises(error, match=needle):
        read_captions(path, N_COND, CAP)


def test_nan_at_a_padded_slot_is_ignored(tmp_path):
    feats = torch.randn(1, 4, CAP)
    feats[0, 3] = float("nan")
    save_file({"features": feats, "mask": torch.tensor([[1, 1, 1, 0]])}, str(tmp_path / "c.safetensors"))
    (cap,) = read_captions(tmp_path / "c.safetensors", N_COND, CAP)
    assert torch.isfinite(cap.features).all()


@pytest.fixture
def t2i_registry(tmp_path, registered):
    registered(register_t2i)
    feats = torch.randn(2, 4, CAP)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    save_file({"features": feats, "mask": mask}, str(tmp_path / "caps.safetensors"))
    return tmp_path


def register_t2i():
    from specgen.models.vq import VQ_CONFIGS, VQModel

    torch.manual_seed(0)
    vq_cfg = VQ_CONFIGS["vq-tiny"]
    registry.save("vq", "t-vq", VQModel(vq_cfg).state_dict(), {"builder": "vq", "kwargs": vq_cfg.to_dict()})
    gpt = tiny_t2i_gpt(0, vocab=vq_cfg.codebook_size)
    registry.save("target", "t2i-gpt", gpt.state_dict(), {
        "builder": "llamagen-gpt", "kwargs": gpt.cfg.to_dict(), "modality": "image", "vq": "vq/t-vq", "grid": GRID,
        "vocab_size": vq_cfg.codebook_size})
    net = EagleNet.from_target(gpt)
    registry.save("draft", "t2i-eagle", net.state_dict(), {
        "builder": "eagle", "kwargs": net.cfg.to_dict(), "parent": "target/t2i-gpt",
        "vocab_size": vq_cfg.codebook_size})
    c2i = tiny_image_gpt(0, grid=GRID, vocab=vq_cfg.codebook_size, classes=3)
    registry.save("target", "c2i-gpt", c2i.state_dict(), {
        "builder": "llamagen-gpt", "kwargs": c2i.cfg.to_dict(), "modality": "image", "vq": "vq/t-vq", "grid": GRID})


def gen(out, *args, model="t2i-gpt"):
    return runner.invoke(app, ["generate", "--model", model, "-o", str(out), "--temperature", "0", *args])


def test_generate_with_captions(t2i_registry):
    caps = str(t2i_registry / "caps.safetensors")
    docs = {}
    for method in ("ar", "adt-tree", "eagle2", "lantern", "vvs"):
        out = t2i_registry / method
        r = gen(out, "--method", method, "--captions", caps, "--cfg-scale", "3", "--format", "json")
        assert r.exit_code == 0, r.output
        docs[method] = json.loads(r.stdout)
        assert [i["caption"] for i in docs[method]["images"]] == [0, 1]  # one image per caption by default
        assert all(len(i["tokens"]) == GRID * GRID for i in docs[method]["images"])
        assert len(list(out.glob("*.png"))) == 3
    tokens = {m: [i["tokens"] for i in d["images"]] for m, d in docs.items()}
    assert tokens["adt-tree"] == tokens["ar"] and tokens["eagle2"] == tokens["ar"]  # lossless at T = 0
    r = gen(t2i_registry / "n3", "--method", "ar", "--captions", caps, "--num", "3", "--format", "json")
    assert r.exit_code == 0, r.output
    assert [i["caption"] for i in json.loads(r.stdout)["images"]] == [0, 1, 0]


@pytest.mark.parametrize("make,args,needle", [
    (lambda d: save_file({"features": torch.randn(1, 4, CAP + 2)}, str(d / "x.safetensors")), [], "18 wide"),
    (lambda d: save_file({"features": torch.randn(1, N_COND + 2, CAP)}, str(d / "x.safetensors")), [], "at most 6"),
    (lambda d: save_file({"features": torch.full((1, 2, CAP), float("inf"))}, str(d / "x.safetensors")), [], "NaN"),
    (lambda d: None, [], "not found"),
    (lambda d: (d / "x.safetensors").write_bytes(b"garbage"), [], "cannot read"),
    (lambda d: save_file({"features": torch.randn(1, 2, CAP)}, str(d / "x.safetensors")), ["--classes", "0"],
     "not --classes"),
    (lambda d: save_file({"features": torch.randn(1, 2, CAP)}, str(d / "x.safetensors")), ["--method", "mulo-sd"],
     "mulo-sd supports class-conditional"),
])
def test_bad_captions_on_the_command_line(t2i_registry, make, args, needle):
    make(t2i_registry)
    out = t2i_registry / "bad"
    r = gen(out, "--captions", str(t2i_registry / "x.safetensors"), *args)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists() or not list(out.glob("*.png"))


def test_conditioning_mismatches_on_the_command_line(t2i_registry):
    r = gen(t2i_registry / "a", "--method", "ar")
    assert r.exit_code == 2 and "needs --captions" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = gen(t2i_registry / "b", "--method", "ar", "--captions", str(t2i_registry / "caps.safetensors"), model="c2i-gpt")
    assert r.exit_code == 2 and "class-conditional" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not list((t2i_registry / "b").glob("*.png"))


def test_the_default_drafter_is_the_shipped_one_then_the_only_one_trained(t2i_registry):
    """A drafter trained for a quick test must not silently replace the shipped one (built-in first); with
    several installed and none shipped, `generate` asks for --drafter in one line."""
    from specgen import checkpoints
    from specgen.generate.image import default_drafter

    assert default_drafter(checkpoints.find("target/t2i-gpt")) == "draft/t2i-eagle"  # the only one trained
    assert default_drafter(checkpoints.find("target/c2i-gpt")) == ""  # none
    twin = registry.read_state(checkpoints.find("draft/t2i-eagle"))
    meta = {k: v for k, v in checkpoints.find("draft/t2i-eagle").meta.items() if k not in ("kind", "name")}
    registry.save("draft", "a-quick-one", twin, meta)
    r = gen(t2i_registry / "two", "--method", "eagle2", "--captions", str(t2i_registry / "caps.safetensors"))
    assert r.exit_code != 0 and "2 drafters were trained for target/t2i-gpt" in r.output
    assert "--drafter NAME" in r.output and "Traceback" not in r.output
    assert gen(t2i_registry / "named", "--method", "eagle2", "--captions", str(t2i_registry / "caps.safetensors"),
               "--drafter", "a-quick-one").exit_code == 0
    shipped = checkpoints.find("target/tiny-image-gpt")  # the built-in target and its shipped drafter
    registry.save("draft", "b-quick-one", twin, {**meta, "parent": "target/tiny-image-gpt"})
    assert default_drafter(shipped) == "draft/tiny-image-eagle"
