"""LlamaGen t2i GPTs: strict loading, logits equal to an independent forward with left-padded captions,
padded caption slots without influence, cached (chain and tree) decoding equal to uncached, configs, import."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from specgen.builders import BUILDERS
from specgen.errors import UsageError
from specgen.image.captions import Caption, left_pad
from specgen.image.target import CaptionCFGTarget, cfg_target
from specgen.models.llamagen import find_multiple, llamagen_config, llamagen_kwargs, llamagen_state
from specgen.models.transformer import padded_causal_mask
from tests.image_fixtures import one_thread
from tests.models.test_llamagen import hf_layer_names, layer_weights, reference_blocks

_threads = pytest.fixture(autouse=True)(one_thread)

D, H, L, V, G, N, C = 64, 4, 2, 48, 4, 6, 24  # dim, heads, layers, codebook, grid, cls_token_num, caption_dim
HD = D // H
FFN = find_multiple(int(2 * 4 * D / 3), 256)
S = N + G * G - 1  # condition slots + image tokens fed (the last one is only predicted)


def t2i_checkpoint(seed: int = 0) -> dict:
    """A random state dict with LlamaGen's exact t2i key names, in its DDP container, with a stray freqs_cis."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, std=0.2):
        return torch.randn(*shape, generator=g) * std

    sd = {"tok_embeddings.weight": r(V, D, std=1.0), "norm.weight": 1 + r(D, std=0.1), "output.weight": r(V, D),
          "cls_embedding.cap_proj.fc1.weight": r(D, C, std=0.5), "cls_embedding.cap_proj.fc2.weight": r(D, D, std=0.3),
          "cls_embedding.uncond_embedding": r(N, C, std=1.0), "freqs_cis": torch.zeros(N + G * G, HD // 2, 2)}
    sd.update(layer_weights(r, L, D, FFN))
    return {"model": sd, "epoch": torch.tensor(3)}


def reference_logits(sd: dict, captions: torch.Tensor, valid: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """LlamaGen t2i forward written from gpt.py / generate.py, independently of specgen's decoder.

    captions [B, N, C] (left-padded), valid [B, N] bool, tokens [B, T]: logits [B, N + T, V].
    """
    cap = F.gelu(captions @ sd["cls_embedding.cap_proj.fc1.weight"].T, approximate="tanh") \
        @ sd["cls_embedding.cap_proj.fc2.weight"].T
    x = torch.cat([cap, sd["tok_embeddings.weight"][tokens]], 1)
    b, t, _ = x.shape
    # generate.py: causal mask, key columns of the condition multiplied by emb_masks, then the diagonal set to 1
    mask = torch.ones(b, t, t).tril()
    mask[:, :, :N] = mask[:, :, :N] * valid[:, None, :].float()
    eye = torch.eye(t)
    return reference_blocks(sd, x, (mask * (1 - eye) + eye).bool()[:, None], N)


def config_kwargs() -> dict:
    cfg = llamagen_config("gpt-tiny", vocab=V, grid=G, model_type="t2i", cls_token_num=N, caption_dim=C)
    return {**cfg.to_dict(), "dim": D, "n_layers": L, "n_heads": H, "n_kv_heads": H, "ffn_dim": FFN}


def load_model(ckpt: dict):
    kwargs = config_kwargs()
    state = llamagen_state(ckpt, kwargs)
    model = BUILDERS["llamagen-gpt"](**kwargs).eval()
    model.load_state_dict(state, strict=True)
    return model


def upstream_left_pad(t5: torch.Tensor, t5_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_t2i.py's left padding of right-padded T5 outputs: rotate, flip the mask, zero the padded slots."""
    new_mask = torch.flip(t5_mask, dims=[-1])
    rows = []
    for emb, m in zip(t5, t5_mask):
        n_valid = int(m.sum())
        rows.append(torch.cat([emb[n_valid:], emb[:n_valid]]))
    return torch.stack(rows) * new_mask[:, :, None], new_mask.bool()


@pytest.fixture
def batch():
    """Two right-padded T5-like captions of different lengths (4 and 2 of N tokens), left-padded, + tokens."""
    g = torch.Generator().manual_seed(5)
    t5 = torch.randn(2, N, C, generator=g)
    t5_mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]])
    captions = left_pad(t5, t5_mask.bool(), N)
    feats = torch.stack([c.features for c in captions])
    valid = torch.stack([c.valid for c in captions])
    tokens = torch.randint(0, V, (2, G * G - 1), generator=g)
    return t5, t5_mask, captions, feats, valid, tokens


def full_forward(model, feats, valid, tokens):
    """Uncached specgen forward over [caption slots; tokens] under LlamaGen's padded causal mask."""
    embeds = torch.cat([model.cls_embedding(feats), model.tok_embeddings(tokens)], 1)
    positions = torch.arange(embeds.shape[1]).expand(embeds.shape[0], -1)
    return model(None, positions, tree_mask=padded_causal_mask(F.pad(valid, (0, tokens.shape[1]), value=True)),
                 embeds=embeds)[0]


def test_left_padding_matches_sample_t2i(batch):
    t5, t5_mask, captions, feats, valid, _ = batch
    want_feats, want_valid = upstream_left_pad(t5, t5_mask)
    torch.testing.assert_close(feats, want_feats, rtol=0, atol=0)
    assert torch.equal(valid, want_valid)
    assert valid[:, -1].all() and [c.index for c in captions] == [0, 1]


def test_t2i_checkpoint_loads_strict_and_matches_reference(batch):
    _, _, _, feats, valid, tokens = batch
    ckpt = t2i_checkpoint()
    state = llamagen_state(ckpt, config_kwargs())
    assert "freqs_cis" not in state and "cls_embedding.uncond_embedding" in state
    model = load_model(ckpt)
    with torch.no_grad():
        logits = full_forward(model, feats, valid, tokens)
        ref = reference_logits(ckpt["model"], feats, valid, tokens)
    assert logits.shape == (2, S, V)
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)  # every position, padded query rows included
    # the two rows' masks differ, and the mask matters: without it the image logits change
    with torch.no_grad():
        unmasked = full_forward(model, feats, torch.ones_like(valid), tokens)
    assert not torch.allclose(unmasked[:, N - 1 :], ref[:, N - 1 :], atol=1e-3)


def test_strict_loading_refuses_a_missing_uncond_embedding():
    sd = dict(t2i_checkpoint()["model"])
    del sd["cls_embedding.uncond_embedding"]
    model = BUILDERS["llamagen-gpt"](**config_kwargs())
    with pytest.raises(RuntimeError, match="uncond_embedding"):
        model.load_state_dict(llamagen_state(sd), strict=True)


def test_padded_caption_slots_have_no_influence(batch):
    _, _, captions, feats, valid, tokens = batch
    model = load_model(t2i_checkpoint())
    noisy = feats.clone()
    noisy[~valid] = torch.randn(int((~valid).sum()), C) * 10
    with torch.no_grad():
        a = full_forward(model, feats, valid, tokens)
        b = full_forward(model, noisy, valid, tokens)
    torch.testing.assert_close(a[:, N - 1 :], b[:, N - 1 :], rtol=0, atol=1e-5)  # every image-token prediction
    assert not torch.allclose(a[:, : N - 2], b[:, : N - 2])  # the padded rows themselves did change
    # the same through the CFG target and its KV cache (prefill, then one decode step)
    outs = []
    for f in (feats[0], noisy[0]):
        cap = Caption(f, valid[0], 0)
        target = CaptionCFGTarget(model, 3.0, cap)
        cache = target.new_cache(1, S + 2)
        first = target.prefill(torch.tensor([target.prompt()]), cache)
        step = target.forward(tokens[:1, :3], torch.arange(N, N + 3)[None], cache, None)
        outs.append(torch.cat([first.logits[0], step.logits[0]]))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-5)


def test_cached_chain_and_tree_decoding_equal_uncached(batch):
    """Two rows with different padding in one cache: prefill, chains of 1 and 3 tokens, and a tree of siblings."""
    _, _, _, feats, valid, tokens = batch
    ckpt = t2i_checkpoint()
    model = load_model(ckpt)
    ref = reference_logits(ckpt["model"], feats, valid, tokens)
    with torch.no_grad():
        cache = model.new_cache(2, S + 4)
        pos = torch.arange(N).expand(2, -1)
        steps = [model(None, pos, cache, padded_causal_mask(valid), embeds=model.cls_embedding(feats))[0]]
        for row in range(2):
            cache.commit(row, list(range(N)))
        cache.key_mask = valid
        r = 0
        while r < G * G - 1:
            s = 1 if r < 6 else 3  # one token at a time, then chains of three (causal tree mask)
            chunk = tokens[:, r : r + s]
            steps.append(model(chunk, torch.arange(N + r, N + r + chunk.shape[1]).expand(2, -1), cache)[0])
            for row in range(2):
                cache.commit(row, list(range(chunk.shape[1])))
            r += chunk.shape[1]
    torch.testing.assert_close(torch.cat(steps, 1), ref, atol=1e-4, rtol=1e-4)

    # a tree after 5 committed tokens: root x5 with two children a, b at the same position (siblings)
    with torch.no_grad():
        for row in range(2):
            cache.rollback(row, N + 5)
        a, b = 7, 11
        tree_tokens = torch.tensor([[int(tokens[0, 5]), a, b], [int(tokens[1, 5]), a, b]])
        tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
        out = model(tree_tokens, torch.tensor([N + 5, N + 6, N + 6]).expand(2, -1), cache, tree)[0]
        for child, col in ((a, 1), (b, 2)):
            seq = torch.cat([tokens[:, :6], torch.full((2, 1), child)], 1)
            want = reference_logits(ckpt["model"], feats, valid, seq)[:, -1]
            torch.testing.assert_close(out[:, col], want, atol=1e-4, rtol=1e-4)


def test_cfg_target_uses_uncond_embedding_with_the_caption_mask(batch):
    """Row 1 = LlamaGen's cond_null (uncond_embedding) under the same emb_mask; logits combined at the logits level."""
    _, _, captions, feats, valid, tokens = batch
    ckpt = t2i_checkpoint()
    model = load_model(ckpt)
    scale = 4.0
    target = cfg_target(model, scale, captions[1])
    cache = target.new_cache(1, S + 2)
    first = target.prefill(torch.tensor([target.prompt()]), cache)
    out = target.forward(tokens[1:2, :4], torch.arange(N, N + 4)[None], cache, None)
    got = torch.cat([first.logits[0], out.logits[0]])  # [5, V]: predictions of image tokens 0..4
    sd = ckpt["model"]
    both = torch.stack([feats[1], sd["cls_embedding.uncond_embedding"]])
    ref = reference_logits(sd, both, valid[1:].expand(2, -1), tokens[1:2, :4].expand(2, -1).clone())
    ref = ref[:, N - 1 :]  # [2, 5, V]
    torch.testing.assert_close(got, ref[1] + scale * (ref[0] - ref[1]), atol=1e-4, rtol=1e-4)
    assert first.features.shape == (2, N, D) and torch.equal(cache.key_mask, valid[1:].expand(2, -1))
    with pytest.raises(UsageError, match="caption"):
        cfg_target(model, scale, None)


def test_released_t2i_configs_and_short_kwargs():
    cfg = llamagen_config("GPT-XL", model_type="t2i")
    assert (cfg.n_cond, cfg.caption_dim, cfg.num_classes, cfg.dim, cfg.ffn_dim) == (120, 2048, 0, 1280, 3584)
    assert cfg.max_seq_len == 120 + 256 and cfg.cond_kind == "caption"
    stage2 = llamagen_kwargs({"gpt_model": "GPT-XL", "model_type": "t2i", "grid": 32})
    assert stage2["rope_grid"] == 32 and stage2["max_seq_len"] == 120 + 1024 and stage2["caption_dim"] == 2048
    assert llamagen_config("GPT-B").cond_kind == "class"  # c2i unchanged
    with pytest.raises(UsageError, match="grid"):
        llamagen_kwargs({"gpt_model": "GPT-XL", "model_type": "t2i"})  # never guessed from a name
    with pytest.raises(UsageError, match="unknown key"):
        llamagen_kwargs({"gpt_model": "GPT-XL", "grid": 16, "image_size": 256})
    with pytest.raises(UsageError, match="model type"):
        llamagen_kwargs({"gpt_model": "GPT-XL", "grid": 16, "model_type": "t2v"})


def test_lantern_hf_t2i_names_convert():
    sd = t2i_checkpoint()["model"]
    hf = {"model.embed_tokens.weight": sd["tok_embeddings.weight"], "lm_head.weight": sd["output.weight"],
          "model.norm.weight": sd["norm.weight"]}
    for k in ("cap_proj.fc1.weight", "cap_proj.fc2.weight", "uncond_embedding"):
        hf["model.cls_embedding." + k] = sd["cls_embedding." + k]
    hf.update(hf_layer_names(sd, L, D))
    out = llamagen_state(hf)
    want = {k: v for k, v in sd.items() if k != "freqs_cis"}
    assert out.keys() == want.keys() and all(torch.equal(out[k], want[k]) for k in want)


def test_registry_import_of_a_t2i_pt_with_vq(tmp_path):
    from cli.main import app
    from specgen import checkpoints, registry
    from specgen.models.vq import VQ_CONFIGS, VQModel

    vq_cfg = VQ_CONFIGS["vq-tiny"]
    registry.save("vq", "t-vq", VQModel(vq_cfg).state_dict(), {"builder": "vq", "kwargs": vq_cfg.to_dict()})
    ckpt = t2i_checkpoint()
    path = tmp_path / "t2i_tiny_stage1.pt"
    torch.save(ckpt, path)
    kw = tmp_path / "kwargs.json"
    kw.write_text(json.dumps(config_kwargs()))
    runner = CliRunner()
    r = runner.invoke(app, ["registry", "import", str(path), "--name", "t2i-tiny", "--builder", "llamagen-gpt",
                            "--kwargs", str(kw), "--vq", "t-vq"])
    assert r.exit_code == 2 and "512 codes" in r.stderr  # the tiny VQ does not fit a 48-code GPT
    vq48 = dataclasses.replace(vq_cfg, codebook_size=V)
    registry.save("vq", "t-vq48", VQModel(vq48).state_dict(), {"builder": "vq", "kwargs": vq48.to_dict()})
    r = runner.invoke(app, ["registry", "import", str(path), "--name", "t2i-tiny", "--builder", "llamagen-gpt",
                            "--kwargs", str(kw), "--vq", "t-vq48"])
    assert r.exit_code == 0, r.output
    entry = checkpoints.find("t2i-tiny")
    assert entry.meta["modality"] == "image" and entry.meta["vq"] == "vq/t-vq48" and entry.meta["grid"] == G
    assert entry.meta["conditioning"] == "caption"
    model = checkpoints.load_module(entry)
    torch.testing.assert_close(model.cls_embedding.uncond_embedding, ckpt["model"]["cls_embedding.uncond_embedding"])
    # a config whose cls_token_num does not fit the checkpoint: one line, no traceback, nothing written
    kw.write_text(json.dumps({**config_kwargs(), "n_cond": N + 1, "max_seq_len": N + 1 + G * G}))
    r = runner.invoke(app, ["registry", "import", str(path), "--name", "bad", "--builder", "llamagen-gpt",
                            "--kwargs", str(kw)])
    assert r.exit_code == 1 and "does not fit" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    with pytest.raises(Exception):
        checkpoints.find("bad")
