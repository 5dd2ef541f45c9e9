"""LlamaGen c2i checkpoints load strict after conversion and match an independent reference forward (t2i: test_llamagen_t2i.py)."""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F

from specgen.builders import BUILDERS
from specgen.errors import CheckpointError
from specgen.models.llamagen import GPT_CONFIGS, find_multiple, llamagen_config, llamagen_state
from tests.image_fixtures import one_thread

_threads = pytest.fixture(autouse=True)(one_thread)

D, H, L, V, G, C = 64, 4, 2, 48, 4, 5  # dim, heads, layers, codebook, grid, classes
HD = D // H
FFN = find_multiple(int(2 * 4 * D / 3), 256)


def llamagen_checkpoint(seed: int = 0) -> dict:
    """A random state dict with LlamaGen's exact key names (as `torch.save(model.state_dict())` after
    an old run that still carried `freqs_cis`), wrapped the way its DDP trainer saves it."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=0.2):
        return torch.randn(*shape, generator=g) * std

    sd = {"tok_embeddings.weight": r(V, D, std=1.0), "cls_embedding.embedding_table.weight": r(C + 1, D, std=1.0),
          "norm.weight": 1 + r(D, std=0.1), "output.weight": r(V, D), "freqs_cis": torch.zeros(1 + G * G, HD // 2, 2)}
    sd.update(layer_weights(r, L, D, FFN))
    return {"model": sd, "steps": torch.tensor(7)}


def reference_logits(sd: dict, labels: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """LlamaGen c2i forward written from its gpt.py, independently of specgen's decoder."""
    x = torch.cat([sd["cls_embedding.embedding_table.weight"][labels][:, None], sd["tok_embeddings.weight"][tokens]], 1)
    return reference_blocks(sd, x, torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).tril(), 1)


def reference_blocks(sd: dict, x: torch.Tensor, mask: torch.Tensor, n_cond: int) -> torch.Tensor:
    """Logits of LlamaGen's blocks (gpt.py) over the embeddings x [B, T, D] under the bool mask [T, T] or [B, 1, T, T],
    the 2D RoPE after `n_cond` zero condition rows; the constants are this file's (test_llamagen_t2i.py shares them)."""
    half = HD // 2
    freqs = 1.0 / (10000 ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    f = torch.outer(torch.arange(G).float(), freqs)
    grid = torch.cat([f[:, None, :].expand(G, G, -1), f[None, :, :].expand(G, G, -1)], dim=-1)
    cache = torch.stack([grid.cos(), grid.sin()], dim=-1).flatten(0, 1)  # [G*G, half, 2]
    freqs_cis = torch.cat([torch.zeros(n_cond, half, 2), cache])  # zero condition rows

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def rope(x):  # x [B, T, H, hd], adjacent pairs as complex numbers
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
        fc = torch.view_as_complex(freqs_cis[: x.shape[1]].contiguous())[None, :, None]
        return torch.view_as_real(xc * fc).flatten(3)

    b, t, _ = x.shape
    for i in range(L):
        p = f"layers.{i}."
        q, k, v = (rms(x, sd[p + "attention_norm.weight"]) @ sd[p + "attention.wqkv.weight"].T).split(D, -1)
        q, k, v = rope(q.view(b, t, H, HD)), rope(k.view(b, t, H, HD)), v.view(b, t, H, HD)
        att = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) / HD ** 0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + (att @ v.transpose(1, 2)).transpose(1, 2).reshape(b, t, D) @ sd[p + "attention.wo.weight"].T
        hn = rms(x, sd[p + "ffn_norm.weight"])
        x = x + (F.silu(hn @ sd[p + "feed_forward.w1.weight"].T) * (hn @ sd[p + "feed_forward.w3.weight"].T)) \
            @ sd[p + "feed_forward.w2.weight"].T
    return rms(x, sd["norm.weight"]) @ sd["output.weight"].T


def config_kwargs() -> dict:
    cfg = llamagen_config("gpt-tiny", vocab=V, grid=G, num_classes=C)
    return {**cfg.to_dict(), "dim": D, "n_layers": L, "n_heads": H, "n_kv_heads": H, "ffn_dim": FFN}


def test_released_configs_match_llamagen():
    expect = {"GPT-B": (768, 2048), "GPT-L": (1024, 2816), "GPT-XL": (1280, 3584), "GPT-XXL": (1536, 4096),
              "GPT-XXXL": (2560, 6912), "GPT-3B": (3200, 8704)}
    for name, (dim, ffn) in expect.items():
        cfg = llamagen_config(name)
        assert (cfg.dim, cfg.ffn_dim, cfg.hd) == (dim, ffn, 100 if name == "GPT-3B" else 64)
        assert cfg.max_seq_len == 257 and cfg.rope_layout == "interleaved" and not cfg.tie_embeddings
    assert llamagen_config("GPT-XL", grid=24).max_seq_len == 1 + 576
    assert set(expect) <= set(GPT_CONFIGS)


def test_llamagen_checkpoint_loads_strict_and_matches_reference():
    ckpt = llamagen_checkpoint()
    kwargs = config_kwargs()
    state = llamagen_state(ckpt, kwargs)
    assert "freqs_cis" not in state
    model = BUILDERS["llamagen-gpt"](**kwargs).eval()
    model.load_state_dict(state, strict=True)
    g = torch.Generator().manual_seed(1)
    labels = torch.tensor([0, 3, C])  # C = null class
    tokens = torch.randint(0, V, (3, G * G - 1), generator=g)
    with torch.no_grad():
        cond = model.cls_embedding(labels)
        embeds = torch.cat([cond, model.tok_embeddings(tokens)], dim=1)
        positions = torch.arange(G * G).expand(3, -1)
        logits, _ = model(None, positions, embeds=embeds)
        ref = reference_logits(ckpt["model"], labels, tokens)
    assert logits.shape == (3, G * G, V)
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)

    # cached incremental decoding gives the same logits (condition prefill, then one token at a time)
    with torch.no_grad():
        cache = model.new_cache(3)
        steps = [model(None, torch.zeros(3, 1, dtype=torch.long), cache, embeds=cond)[0]]
        for row in range(3):
            cache.commit(row, [0])
        for r in range(G * G - 1):
            steps.append(model(tokens[:, r : r + 1], torch.full((3, 1), 1 + r), cache)[0])
            for row in range(3):
                cache.commit(row, [0])
    torch.testing.assert_close(torch.cat(steps, 1), ref, atol=1e-4, rtol=1e-4)


def layer_weights(r, layers: int, dim: int, ffn: int) -> dict:
    """Random decoder-layer tensors in LlamaGen's key layout (fused wqkv, SwiGLU w1/w3/w2); `r(*shape, std=)` draws."""
    sd = {}
    for i in range(layers):
        p = f"layers.{i}."
        sd[p + "attention.wqkv.weight"] = r(3 * dim, dim)
        sd[p + "attention.wo.weight"] = r(dim, dim)
        sd[p + "feed_forward.w1.weight"] = r(ffn, dim)
        sd[p + "feed_forward.w3.weight"] = r(ffn, dim)
        sd[p + "feed_forward.w2.weight"] = r(dim, ffn, std=0.05)
        sd[p + "attention_norm.weight"] = 1 + r(dim, std=0.1)
        sd[p + "ffn_norm.weight"] = 1 + r(dim, std=0.1)
    return sd


def hf_layer_names(sd: dict, layers: int, dim: int) -> dict:
    """The decoder layers of a LlamaGen state dict under LANTERN's HF names (fused wqkv split into q, k, v)."""
    hf = {}
    for i in range(layers):
        p, q = f"layers.{i}.", f"model.layers.{i}."
        for name, part in zip("qkv", sd[p + "attention.wqkv.weight"].split(dim)):
            hf[q + f"self_attn.{name}_proj.weight"] = part
        hf[q + "self_attn.o_proj.weight"] = sd[p + "attention.wo.weight"]
        hf[q + "mlp.gate_proj.weight"] = sd[p + "feed_forward.w1.weight"]
        hf[q + "mlp.up_proj.weight"] = sd[p + "feed_forward.w3.weight"]
        hf[q + "mlp.down_proj.weight"] = sd[p + "feed_forward.w2.weight"]
        hf[q + "input_layernorm.weight"] = sd[p + "attention_norm.weight"]
        hf[q + "post_attention_layernorm.weight"] = sd[p + "ffn_norm.weight"]
    return hf


def test_lantern_hf_names_convert():
    sd = llamagen_checkpoint()["model"]
    hf = {"model.embed_tokens.weight": sd["tok_embeddings.weight"], "lm_head.weight": sd["output.weight"],
          "model.norm.weight": sd["norm.weight"],
          "model.cls_embedding.embedding_table.weight": sd["cls_embedding.embedding_table.weight"]}
    hf.update(hf_layer_names(sd, L, D))
    out = llamagen_state(hf)
    want = {k: v for k, v in sd.items() if k != "freqs_cis"}
    assert out.keys() == want.keys()
    assert all(torch.equal(out[k], want[k]) for k in want)


def test_incomplete_checkpoints_are_refused():  # t2i checkpoints load: tests/models/test_llamagen_t2i.py
    with pytest.raises(CheckpointError, match="incomplete"):
        llamagen_state({"model.layers.0.self_attn.q_proj.weight": torch.zeros(2, 2)})


def test_weights_of_an_integer_dtype_for_float_parameters_are_refused(specgen_home):
    """A weight stored as integers where the model holds floats (a header's F16 damaged to I16: same size, so no size
    check sees it) loaded cast by load_state_dict: garbage weights, exit 0; it is one CheckpointError naming it."""
    from safetensors.torch import load_file, save_file

    from specgen import checkpoints
    from tests.image_fixtures import register_tiny_image_target

    entry = register_tiny_image_target()
    weights = entry.path / "model.safetensors"
    state = load_file(str(weights))
    state["output.weight"] = state["output.weight"].to(torch.int32)
    save_file(state, str(weights))
    with pytest.raises(CheckpointError, match=r"output.weight is stored as int32, the model holds float32"):
        checkpoints.load_module(checkpoints.find("tiny-img"))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_weights_holding_nan_or_inf_are_refused_naming_the_tensor(specgen_home, bad):
    """A NaN or inf weight loaded silently, then failed when sampling with a line naming no checkpoint, or (greedy)
    decoded garbage, exit 0; the load is one CheckpointError naming the entry, the file and the tensor."""
    from safetensors.torch import load_file, save_file

    from specgen import checkpoints
    from tests.image_fixtures import register_tiny_image_target

    entry = register_tiny_image_target()
    weights = entry.path / "model.safetensors"
    state = load_file(str(weights))
    state["layers.1.feed_forward.w2.weight"][3, 5] = bad
    save_file(state, str(weights))
    with pytest.raises(CheckpointError, match=rf"^target/tiny-img: weights {re.escape(str(weights))} hold NaN or "
                                              r"infinite values in layers\.1\.feed_forward\.w2\.weight$"):
        checkpoints.load_module(checkpoints.find("tiny-img"))


def test_registry_import_of_a_llamagen_pt(tmp_path):
    from specgen import checkpoints
    from specgen.importer import import_checkpoint

    ckpt = llamagen_checkpoint()
    path = tmp_path / "c2i_tiny.pt"
    torch.save(ckpt, path)
    kw = tmp_path / "kwargs.json"
    kw.write_text(json.dumps(config_kwargs()))
    entry = import_checkpoint(path, "llamagen-tiny", builder="llamagen-gpt", kwargs_path=kw)
    model = checkpoints.load_module(entry)
    torch.testing.assert_close(model.output.weight, ckpt["model"]["output.weight"])


def test_a_pt_with_its_training_args_imports_and_other_objects_are_refused(tmp_path):
    """LlamaGen's training scripts save `args` (an argparse.Namespace) beside the weights: admitted by name;
    any other Python object in the pickle is still refused, in one line without terminal colours."""
    import argparse
    from collections import OrderedDict

    from specgen.importer import read_state_file

    ckpt = llamagen_checkpoint()
    path = tmp_path / "c2i_args.pt"
    torch.save({**ckpt, "args": argparse.Namespace(gpt_model="GPT-B", image_size=256)}, path)
    assert set(read_state_file(path)) == set(ckpt["model"])
    bad = tmp_path / "c2i_other.pt"
    torch.save({**ckpt, "sampler": OrderedDict, "hook": print}, bad)
    with pytest.raises(CheckpointError, match="cannot read c2i_other.pt as a state dict") as err:
        read_state_file(bad)
    assert "\x1b" not in str(err.value) and "\n" not in str(err.value)
