"""Mesh GPT, heads and LoRA: cached == uncached, condition K/V once, merge == wrapped, registry loading."""

from __future__ import annotations

import pytest
import torch

from specgen import checkpoints, registry
from specgen.errors import IncompatibleError
from specgen.methods.xspecmesh import load_mesh
from specgen.models.heads import HeadsConfig
from specgen.models.lora import merge_lora_state
from specgen.train.lora import apply_lora, lora_state, merge_lora
from tests.mesh.mesh_fixtures import NUM_POINTS, register_tiny, tiny_heads, tiny_mesh_model


def all_features(heads, hidden, kv, emb=None):
    """Every head's `head_features` (the training path) stacked: [B, S, D, dim]."""
    return torch.stack([heads.head_features(d, hidden, kv[d], emb) for d in range(heads.num_heads)], dim=2)


def test_a_mesh_prefill_runs_the_point_encoder_in_prompt_mode_and_the_start_step_not():
    """The encoder runs once a mesh, alike in every method, so it takes a prompt's products (on a GPU 256-row
    slices); the start's decoder step stays a decode step's, as every later step is."""
    from specgen.mesh.target import MeshTarget
    from specgen.models import prompt

    model, seen = tiny_mesh_model(), {}
    encoder, step = model.encoder.forward, model.decoder.hidden_states

    def recorded(name, run):
        def call(*args, **kwargs):
            seen.setdefault(name, prompt.active())
            return run(*args, **kwargs)
        return call

    model.encoder.forward, model.decoder.hidden_states = recorded("encoder", encoder), recorded("start step", step)
    target = MeshTarget(model, [torch.randn(NUM_POINTS, 6)])
    target.prefill(torch.tensor([[0]]), target.new_cache(1, 8))
    assert seen == {"encoder": True, "start step": False}


def test_cached_decoding_matches_teacher_forcing():
    torch.manual_seed(0)
    model = tiny_mesh_model()
    pc, tokens = torch.randn(1, NUM_POINTS, 6), torch.randint(0, 5120, (1, 12))
    with torch.no_grad():
        logits, hidden, cond = model.forward_train(pc, tokens)  # rows 0..11 (start + tokens[:11])
        cache = model.new_cache(1, 32)
        first, _ = model.prefill(cache, model.condition(pc)[1])
        assert cache.cross is not None and len(cache.cross) == model.dec_cfg.n_layers  # K/V stored once
        chunk, _ = model.decoder(tokens[:, :5], torch.arange(1, 6)[None], cache)  # positions 1..5 in one forward
        cache.commit(0, list(range(5)))
        one, _ = model.decoder(tokens[:, 5:6], torch.tensor([[6]]), cache)
    torch.testing.assert_close(first[0], logits[0, 0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(chunk[0], logits[0, 1:6], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(one[0, 0], logits[0, 6], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("token_input,res_layers,history", [(False, 1, 0), (True, 1, 0), (False, 3, 0), (True, 1, 4)])
def test_untrained_heads_start_as_the_backbone_head(token_input, res_layers, history):
    model = tiny_mesh_model()
    heads = tiny_heads(scramble=False, token_input=token_input, res_layers=res_layers, history=history)
    h, cond, emb = torch.randn(2, 3, 32), torch.randn(2, 8, 32), torch.randn(2, 3, 32)
    out = model.decoder.output(all_features(heads, h, heads.context_kv(cond), emb))  # [B, S, D, V]
    assert out.shape == (2, 3, 3, 5121)
    torch.testing.assert_close(out[:, :, 1], model.decoder.output(h))


def test_token_input_heads_read_the_next_token():
    heads, h, cond = tiny_heads(token_input=True), torch.randn(1, 2, 32), torch.randn(1, 8, 32)
    kv = heads.context_kv(cond)
    with torch.no_grad():
        a, b = all_features(heads, h, kv, torch.randn(1, 2, 32)), all_features(heads, h, kv, torch.randn(1, 2, 32))
    assert not torch.allclose(a, b)  # the embedding moves every head
    with pytest.raises(ValueError, match="token_input"):
        all_features(heads, h, kv)


PLAIN_VARIANTS = [(False, 1, 0), (True, 1, 0), (False, 3, 0), (True, 2, 0)]


@pytest.mark.parametrize("kind,token_input,res_layers,history", [(k, *v) for k in ("ca", "mlp") for v in PLAIN_VARIANTS]
                         + [("ca", False, 1, 3), ("ca", True, 2, 8)])
def test_stacked_heads_equal_the_per_head_modules(kind, token_input, res_layers, history):
    """Decode-time stacked heads on the last row (+ its window, newest first) == the training-time modules on a
    5-row sequence; history 3 cuts the window, history 8 is longer than the sequence (start of a mesh)."""
    heads = tiny_heads(kind, token_input=token_input, res_layers=res_layers, history=history)
    with torch.no_grad():
        for p in heads.parameters():
            if p.dim() == 1:  # biases and norm weights too
                p.normal_(std=0.5)
    seq, cond, emb = torch.randn(1, 5, 32), torch.randn(1, 8, 32), torch.randn(1, 5, 32)
    with torch.no_grad():
        ref = all_features(heads, seq, heads.context_kv(cond), emb)[0, -1]  # [D, dim]
        stacked = heads.stacked()
        past = stacked.project_history(seq[0].flip(0)) if history else None  # the loop's window, newest first
        got = stacked.features(seq[0, -1:], stacked.context_kv(heads.context_kv(cond)), emb[0, -1:], past)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("token_input", [False, True])
def test_stacked_heads_on_rows_read_each_rows_own_condition(token_input):
    """Three rows' states in one call, each row with its own condition K/V ([R, D, H, M, hd]: the read-ahead heads of a
    batch, `ReadAhead`) == each row's call alone; the control: every row under row 0's condition differs."""
    heads = tiny_heads(token_input=token_input)
    stacked = heads.stacked()
    h, emb = torch.randn(3, 4, 32), torch.randn(3, 4, 32)
    kvs = [stacked.context_kv(heads.context_kv(torch.randn(1, 8, 32))) for _ in range(3)]  # [D, H, M, hd] x 2 each
    rows = tuple(torch.stack([kv[i] for kv in kvs]) for i in (0, 1))  # [R, D, H, M, hd] x 2
    with torch.no_grad():
        got = stacked.features(h.flatten(0, 1), rows, emb.flatten(0, 1)).view(-1, 3, 4, 32)  # [D, R, S, dim]
        alone = torch.stack([stacked.features(h[i], kvs[i], emb[i]).view(-1, 4, 32) for i in range(3)], 1)
        same = stacked.features(h.flatten(0, 1), tuple(t[:1].expand_as(t) for t in rows), emb.flatten(0, 1))
    torch.testing.assert_close(got, alone, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(same.view(-1, 3, 4, 32), alone)


def test_history_heads_read_earlier_hidden_states_only():
    """Row s of a history head depends on rows s - W + 1 .. s and on no later row (causal); the window slides."""
    heads, cond = tiny_heads(history=2), torch.randn(1, 8, 32)
    kv = heads.context_kv(cond)
    seq = torch.randn(1, 6, 32)
    with torch.no_grad():
        base = all_features(heads, seq, kv)
        moved = seq.clone()
        moved[0, 2] += 1.0
        out = all_features(heads, moved, kv)
    changed = [bool(not torch.allclose(out[0, s], base[0, s])) for s in range(6)]
    assert changed == [False, False, True, True, False, False]
    with pytest.raises(ValueError, match="history"):
        HeadsConfig(kind="mlp", history=2)


def test_deeper_heads_keep_the_one_block_keys():
    """res_layers > 1 only adds `more.*` keys: heads saved before the option existed still load."""
    one, three = tiny_heads(res_layers=1).state_dict(), tiny_heads(res_layers=3).state_dict()
    assert set(one) < set(three)
    assert {k for k in three if k not in one} == {f"heads.{d}.more.{i}.linear.{w}" for d in range(3)
                                                  for i in range(2) for w in ("weight", "bias")}
    with pytest.raises(ValueError, match="res_layers"):
        HeadsConfig(res_layers=0)


def test_lora_merge_equals_wrapped_and_saved_adapter():
    model = tiny_mesh_model()
    x = torch.randn(1, NUM_POINTS, 6), torch.randint(0, 5120, (1, 9))
    paths = apply_lora(model.decoder, ("wqkv", "wo", "w1"), rank=4, alpha=8)
    assert paths and all(p.startswith("layers.") for p in paths)
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)
    with torch.no_grad():
        wrapped = model.forward_train(*x)[0]
    state = {f"decoder.{k}": v for k, v in lora_state(model.decoder).items()}
    merge_lora(model)
    with torch.no_grad():
        merged = model.forward_train(*x)[0]
    torch.testing.assert_close(merged, wrapped, atol=1e-4, rtol=1e-4)
    fresh = tiny_mesh_model()
    assert merge_lora_state(fresh, state, 4, 8) == len(paths)
    with torch.no_grad():
        torch.testing.assert_close(fresh.forward_train(*x)[0], wrapped, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError):
        merge_lora_state(fresh, {"decoder.nope.lora_A": torch.zeros(1), "decoder.nope.lora_B": torch.zeros(1)}, 4, 8)
    first = min(k for k in state if k.endswith("lora_B"))
    poisoned = {**state, first: state[first].clone().index_fill_(0, torch.tensor([0]), float("nan"))}
    with pytest.raises(ValueError, match=rf"adapter layer {first.removesuffix('.lora_B')} holds NaN or infinite"):
        merge_lora_state(tiny_mesh_model(), poisoned, 4, 8)  # merged, it would make the layer's weights NaN
    huge = {**state, first: state[first].clone().fill_(1e30)}  # finite, but B @ A overflows float32
    huge[first.replace("lora_B", "lora_A")] = torch.full_like(state[first.replace("lora_B", "lora_A")], 1e30)
    with pytest.raises(ValueError, match=rf"adapter layer {first.removesuffix('.lora_B')} overflows"):
        merge_lora_state(tiny_mesh_model(), huge, 4, 8)


def test_registry_round_trip_and_foreign_heads():
    register_tiny("tiny-mesh", "tiny-heads")
    register_tiny("other-mesh", "foreign-heads", parent="other-mesh")
    loaded = load_mesh(None, "tiny-heads")
    assert loaded.target.name == "tiny-mesh" and loaded.decoder.heads.num_heads == 3
    ref = tiny_mesh_model()
    for (k, a), b in zip(loaded.decoder.model.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, msg=k)
    with pytest.raises(IncompatibleError, match="trained for other-mesh"):
        load_mesh("tiny-mesh", "foreign-heads")
    assert checkpoints.find("tiny-mesh").meta["modality"] == "mesh"


def test_heads_refuse_a_retrained_backbone_of_the_same_name():
    register_tiny("tiny-mesh", None)
    target = checkpoints.find("tiny-mesh")
    digest = registry.weights_digest(target)
    heads = tiny_heads()
    registry.save("heads", "pinned-heads", heads.state_dict(),
                  {"builder": "xspecmesh_heads", "kwargs": heads.cfg.to_dict(), "parent": "tiny-mesh",
                   "parent_digest": digest, "vocab_size": 5121, "modality": "mesh"})
    assert load_mesh(None, "pinned-heads").decoder.heads is not None
    # a re-saved copy of the same weights keeps its digest
    registry.save("target", "tiny-mesh", registry.read_state(target), target.meta, force=True)
    assert registry.weights_digest(checkpoints.find("tiny-mesh")) == digest
    # retrained (other weights, same name): refused with one line
    state = {k: v + 0.01 if v.is_floating_point() else v for k, v in registry.read_state(target).items()}
    registry.save("target", "tiny-mesh", state, target.meta, force=True)
    with pytest.raises(IncompatibleError, match="other weights of target/tiny-mesh"):
        load_mesh(None, "pinned-heads")
