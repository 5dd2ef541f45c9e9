"""EAGLE drafter: shapes and alignment, cached == uncached (chains and trees), training lowers the loss."""

from __future__ import annotations

import pytest
import torch

from specgen.models.eagle import EagleNet, drafter_config
from specgen.train.eagle import EagleTrainConfig, eagle_loss, evaluate
from specgen.train.image_gpt import sample_images
from tests.image_fixtures import CLASSES, GRID, VOCAB, one_thread, tiny_image_target

_threads = pytest.fixture(autouse=True)(one_thread)


def test_shapes_embedding_and_head():
    target = tiny_image_target()
    net = EagleNet.from_target(target)
    assert net.cfg == drafter_config(target.cfg) and net.cfg.n_layers == 1
    assert torch.equal(net.tok_embeddings.weight, target.tok_embeddings.weight)
    assert not net.tok_embeddings.weight.requires_grad
    assert not any(k.startswith("output") for k in net.state_dict())  # no head of its own
    assert torch.equal(net.rope_table, target.rope_table)  # same 2D table (zero condition row)
    b, s = 2, 5
    feats = torch.randn(b, s, target.cfg.dim)
    tokens = torch.randint(0, VOCAB, (b, s))
    pos = torch.arange(1, s + 1).expand(b, s)
    hidden = net(feats, tokens, pos)
    assert hidden.shape == (b, s, target.cfg.dim)
    assert EagleNet.logits(hidden, target).shape == (b, s, VOCAB)


def test_cached_equals_uncached_chain_and_tree():
    torch.manual_seed(0)
    target = tiny_image_target()
    net = EagleNet.from_target(target).eval()
    for p in net.parameters():
        torch.nn.init.normal_(p, std=0.3)
    b, n = 2, 9
    feats = torch.randn(b, n, target.cfg.dim)
    tokens = torch.randint(0, VOCAB, (b, n))
    pos = torch.arange(1, n + 1).expand(b, n)
    with torch.no_grad():
        full = net(feats, tokens, pos)
        cache = net.new_cache(b, 32)
        parts = []
        for lo, hi in [(0, 3), (3, 4), (4, 9)]:
            parts.append(net(feats[:, lo:hi], tokens[:, lo:hi], pos[:, lo:hi], cache))
            for row in range(b):
                cache.commit(row, list(range(hi - lo)))
        torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=1e-5)

        # a tree after a committed prefix of 4: two siblings at position 5, a child of the 2nd at position 6
        cache = net.new_cache(b, 32)
        net(feats[:, :4], tokens[:, :4], pos[:, :4], cache)
        for row in range(b):
            cache.commit(row, [0, 1, 2, 3])
        tf = torch.randn(b, 3, target.cfg.dim)
        tt = torch.randint(0, VOCAB, (b, 3))
        tpos = torch.tensor([5, 5, 6]).expand(b, 3)
        mask = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 1, 1]], dtype=torch.bool)
        tree = net(tf, tt, tpos, cache, mask)
        for node, path in [(0, [0]), (1, [1]), (2, [1, 2])]:
            seq_f = torch.cat([feats[:, :4], tf[:, path]], 1)
            seq_t = torch.cat([tokens[:, :4], tt[:, path]], 1)
            seq_p = torch.cat([pos[:, :4], tpos[:, path]], 1)
            ref = net(seq_f, seq_t, seq_p)[:, -1]
            torch.testing.assert_close(tree[:, node], ref, atol=1e-5, rtol=1e-5)


def test_features_alignment_with_target():
    """Features from sampling are the target's hidden states f_t; logits(f_t) predict image token t."""
    target = tiny_image_target()
    labels = torch.tensor([0, 2])
    toks, feats = sample_images(target, labels, cfg_scale=1.0, temperature=0.0, features=True)
    assert toks.shape == (2, GRID * GRID) and feats.shape == (1, 2, GRID * GRID, target.cfg.dim)
    assert torch.equal(target.output(feats[0]).argmax(-1), toks)  # greedy: head(f_t) argmax = token t
    _, feats2 = sample_images(target, labels, cfg_scale=3.0, temperature=1.0,
                              generator=torch.Generator().manual_seed(0), features=True)
    assert feats2.shape[0] == 2  # cond and null branch


def test_training_steps_reduce_loss():
    torch.manual_seed(0)
    target = tiny_image_target()
    for p in target.parameters():
        p.requires_grad_(False)
    labels = torch.arange(CLASSES).repeat(6)
    toks, feats = sample_images(target, labels, cfg_scale=2.0, generator=torch.Generator().manual_seed(1),
                                features=True)
    f = feats.transpose(0, 1).reshape(-1, GRID * GRID, target.cfg.dim)  # rows = (sequence, branch)
    t = toks.repeat_interleave(2, dim=0)
    cfg = EagleTrainConfig(feature_noise=0.0)
    net = EagleNet.from_target(target)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=3e-3)
    first = float(eagle_loss(net, target, f, t, cfg)[0].detach())
    for _ in range(40):
        loss, _ = eagle_loss(net, target, f, t, cfg)
        opt.zero_grad()
        loss.backward()
        opt.step()
    last = float(eagle_loss(net, target, f, t, cfg)[0].detach())
    assert last < 0.7 * first
    ev = evaluate(net, target, {"tokens": toks, "features": feats.transpose(0, 1)}, 2.0)
    assert 0.0 <= ev["top1_vs_target_top1"] <= 1.0
