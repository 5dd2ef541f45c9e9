"""EAGLE drafters for text-conditional (t2i) targets: t2i samples are the decode path's, training rows are what the
tree drafter sees, the loss falls, `train-heads --kind eagle captions=...` end to end (lossless adt-tree with the
trained drafter) and its one-line usage errors."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from cli.main import app
from specgen import checkpoints, registry
from tests.conftest import decode
from specgen.decoding.sampling import SamplingParams
from specgen.image.target import CaptionCFGTarget
from specgen.methods.eagle import EagleTreeDrafter, FixedShape, TreeShape
from specgen.methods.text import EmptyDrafter
from specgen.models.eagle import EagleNet
from specgen.train.eagle import EagleTrainConfig, drafter_inputs, eagle_loss, evaluate, first_image_position
from specgen.train.image_gpt import sample_images
from tests.image.test_t2i_generate import CAP, GRID, N_COND, caption, gen, t2i_registry, tiny_t2i_gpt  # noqa: F401
from tests.image_fixtures import one_thread

_threads = pytest.fixture(autouse=True)(one_thread)

N = GRID * GRID
runner = CliRunner()
QUICK = ["samples_per_class=2", "eval_samples_per_class=1", "steps=2", "batch_size=2", "gen_batch=8",
         "eval_every=1", "ckpt_every=1", "log_every=1", "cfg_scale=3"]


def test_t2i_samples_are_the_decode_path():
    """Batched t2i sampling (captions with different padding in one batch) = CaptionCFGTarget, tokens and features."""
    model = tiny_t2i_gpt(1)
    caps = [caption(1, 2), caption(2, 5)]
    toks, feats = sample_images(model, caps, cfg_scale=3.0, temperature=0.0, features=True)
    assert toks.shape == (2, N) and feats.shape == (2, 2, N, model.cfg.dim)  # [branches, B, N, D]
    for i, cap in enumerate(caps):
        target = CaptionCFGTarget(model, 3.0, cap)
        assert decode(target, EmptyDrafter(), target.prompt(), N, SamplingParams()).tokens == toks[i].tolist()
        cache = target.new_cache(1, N_COND + N)
        first = target.prefill(torch.tensor([target.prompt()]), cache)
        rest = target.forward(toks[i : i + 1, :-1], torch.arange(N_COND, N_COND + N - 1)[None], cache, None)
        ref = torch.cat([first.features[:, -1:], rest.features], 1)  # [2, N, D]: last caption slot, tokens 0..N-2
        torch.testing.assert_close(feats[:, i], ref, atol=1e-5, rtol=1e-5)


class Recorder(torch.nn.Module):
    """Wraps a drafter net and records its catch-up calls (features, tokens, positions of committed pairs)."""

    graphs = None  # the eager growth calls this wrapper per level

    def __init__(self, net: EagleNet) -> None:
        super().__init__()
        self.net, self.calls = net, []

    def new_cache(self, batch, max_len):
        return self.net.new_cache(batch, max_len)

    def forward(self, features, tokens, positions, cache=None, tree_mask=None, attn_mask=None):
        if attn_mask is None:  # tree levels pass an explicit mask; catch-up rows do not
            self.calls.append((features.clone(), tokens.clone(), positions.clone()))
        return self.net(features, tokens, positions, cache, tree_mask, attn_mask)


def test_training_rows_are_what_the_tree_drafter_sees():
    """The rows the loss trains on (features, tokens, positions after n_cond caption slots) equal the rows the
    EAGLE tree drafter is fed while decoding the same caption under CFG."""
    model = tiny_t2i_gpt(2)
    cap = caption(3, 3)
    toks, feats = sample_images(model, [cap], cfg_scale=3.0, temperature=0.0, features=True)
    target = CaptionCFGTarget(model, 3.0, cap)
    rec = Recorder(EagleNet.from_target(model).eval())
    drafter = EagleTreeDrafter(rec, model.output, FixedShape(TreeShape(3, 4, 12)), max_len=64,
                               guidance=target.cfg_scale)
    assert decode(target, drafter, target.prompt(), N, SamplingParams()).tokens == toks[0].tolist()
    seen_f, seen_t, seen_p = (torch.cat([c[k] for c in rec.calls], 1) for k in range(3))
    k = seen_t.shape[1]
    assert k >= N // 2 and seen_p[0, 0] == N_COND == first_image_position(model.cfg)
    inp, tt, pos = drafter_inputs(feats[:, 0], toks.expand(2, -1), first_image_position(model.cfg))
    assert torch.equal(seen_t, tt[:, :k]) and torch.equal(seen_p, pos[:, :k])
    torch.testing.assert_close(seen_f, inp[:, :k], atol=1e-4, rtol=1e-4)


def test_training_steps_reduce_the_loss_on_t2i_samples():
    torch.manual_seed(0)
    model = tiny_t2i_gpt(0)
    for p in model.parameters():
        p.requires_grad_(False)
    caps = [caption(s, n) for s, n in [(1, 2), (2, 6), (3, 4)]] * 4
    toks, feats = sample_images(model, caps, cfg_scale=2.0, generator=torch.Generator().manual_seed(1), features=True)
    data = {"tokens": toks, "features": feats.transpose(0, 1)}
    f, t = data["features"].flatten(0, 1), toks.repeat_interleave(2, 0)  # training rows = (sequence, branch)
    cfg = EagleTrainConfig(feature_noise=0.0)
    net = EagleNet.from_target(model)
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=3e-3)
    first = float(eagle_loss(net, model, f, t, cfg)[0].detach())
    for _ in range(40):
        opt.zero_grad()
        eagle_loss(net, model, f, t, cfg)[0].backward()
        opt.step()
    assert float(eagle_loss(net, model, f, t, cfg)[0].detach()) < 0.7 * first
    ev = evaluate(net, model, data, 2.0)
    assert 0.0 <= ev["top1_vs_target_top1"] <= 1.0


def train_heads(home, out, *args):
    return runner.invoke(app, ["train-heads", "--kind", "eagle", "--out", str(out), "--format", "json", "-q",
                               f"data_cache={home / 'cache'}", *QUICK, *args])


def test_train_heads_eagle_on_a_t2i_target(t2i_registry):  # noqa: F811
    caps = t2i_registry / "caps.safetensors"
    sha = hashlib.sha256(caps.read_bytes()).hexdigest()[:16]
    out = t2i_registry / "run"
    r = train_heads(t2i_registry, out, "target=t2i-gpt", "name=t2i-trained", f"captions={caps}")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout.splitlines()[0])[0]
    assert row["ref"] == "draft/t2i-trained" and row["parent"] == "target/t2i-gpt"
    entry = checkpoints.find("draft/t2i-trained")
    registry.check_pair(entry, checkpoints.find("t2i-gpt"))
    assert entry.meta["captions_sha"] == sha and entry.meta["train_config"]["captions"] == str(caps)
    assert checkpoints.load_module(entry).cfg.n_cond == N_COND
    assert sorted(p.name.split("-seed")[1] for p in (t2i_registry / "cache").iterdir()) == [
        f"1-b8-cap{sha}.safetensors", f"2-b8-cap{sha}.safetensors"]  # train, held-out seeds; gen_batch, captions
    log = (out / "train.log").read_text()
    assert "8 training rows" in log  # 2 captions x samples_per_class 2 x 2 branches

    # the trained drafter decodes the t2i target losslessly (greedy adt-tree == ar)
    docs = {}
    for method in ("ar", "adt-tree"):
        g = gen(t2i_registry / method, "--method", method, "--captions", str(caps), "--cfg-scale", "3",
                "--format", "json", "drafter=t2i-trained")
        assert g.exit_code == 0, g.output
        docs[method] = [i["tokens"] for i in json.loads(g.stdout)["images"]]
    assert docs["adt-tree"] == docs["ar"] and len(docs["ar"]) == 2

    # a rerun resumes (re-registering its own entry); other captions content is other data and refuses this state
    r = train_heads(t2i_registry, out, "target=t2i-gpt", "name=t2i-trained", f"captions={caps}")
    assert r.exit_code == 0, r.output
    assert "resumed at step 2/2" in (out / "train.log").read_text()
    save_file({"features": torch.randn(3, 2, CAP)}, str(caps))
    r = train_heads(t2i_registry, out, "target=t2i-gpt", "name=t2i-trained", f"captions={caps}", "--force")
    assert r.exit_code == 2 and "different captions_sha" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert len(list((t2i_registry / "cache").iterdir())) == 4


@pytest.mark.parametrize("target,make,needle", [
    ("t2i-gpt", None, "text-conditional (t2i): pass captions=FILE"),
    ("c2i-gpt", lambda p: save_file({"features": torch.randn(1, 2, CAP)}, str(p)), "class-conditional (c2i)"),
    ("t2i-gpt", lambda p: save_file({"features": torch.randn(1, 2, CAP + 2)}, str(p)), "18 wide"),
    ("t2i-gpt", lambda p: save_file({"features": torch.randn(1, N_COND + 1, CAP)}, str(p)), "at most 6"),
    ("t2i-gpt", lambda p: p.write_bytes(b"garbage"), "cannot read"),
    ("t2i-gpt", lambda p: None, "not found"),
])
def test_condition_mismatches_are_one_line_usage_errors(t2i_registry, target, make, needle):  # noqa: F811
    path = t2i_registry / "x.safetensors"
    args = [f"target={target}", "name=bad-eagle"]
    if make is not None:
        make(path)
        args.append(f"captions={path}")
    out = t2i_registry / "bad"
    r = train_heads(t2i_registry, out, *args)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists() and not (t2i_registry / "cache").exists()  # refused before any work
    assert "bad-eagle" not in [e.name for e in checkpoints.list_entries("draft")]
