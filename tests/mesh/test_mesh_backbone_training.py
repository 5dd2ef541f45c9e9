"""Mesh backbone training: the coordinate-factored token table and its fold into a plain MeshGPT."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from specgen.mesh.tokenizers import BPTTokenizer
from specgen.models.mesh import MeshGPT
from specgen.train.mesh import MeshTrainConfig, eval_set, evaluate, train
from specgen.train.mesh_embedding import FactoredTable, token_features

TINY = dict(dim=32, n_layers=1, n_heads=2, ffn_dim=64, max_seq_len=128, enc_width=32, num_latents=8,
            enc_layers=1, num_points=64, max_tokens=96, batch_size=2, pool_batches=2, eval_meshes=2,
            warmup_steps=2, lr=3e-3, ckpt_every=2, log_every=1, eval_every=100)


def test_token_features_are_kind_and_per_axis_coordinates():
    tok = BPTTokenizer()
    f = token_features(tok)  # [V, F]
    assert f.shape == (5121, 4 + 3 * 8 + 3 * 16)
    sums = f.sum(1)
    assert (sums[:5120] == 4).all() and sums[5120] == 1  # kind + x/y/z; EOS: kind only
    block, offset = tok.block_and_offset(torch.tensor([[17, 40, 127], [17, 40, 126]]).numpy())
    # same block -> identical block features; offsets differ only in z
    assert torch.equal(f[block[0]], f[block[1]])
    assert float((f[offset[0]] * f[offset[1]]).sum()) == 3.0
    # a special block has the coordinates of its plain block and the special kind
    special = f[block[0] + tok.special_base]
    assert float((special * f[block[0]]).sum()) == 3.0 and special[2] == 1 and special[0] == 0


def test_fold_gives_a_plain_model_with_the_same_outputs():
    torch.manual_seed(0)
    cfg = MeshTrainConfig(**TINY)
    model, table = MeshGPT(**cfg.model_kwargs()), FactoredTable(BPTTokenizer(), cfg.dim, std=0.5)
    examples = eval_set(2, cfg.num_points, cfg.max_tokens)
    before = evaluate(model, examples, table=table)
    assert before != evaluate(model, examples)  # the table changes the model
    table.fold(model.decoder.tok_embeddings)
    after = evaluate(model, examples)
    assert abs(before["val_loss"] - after["val_loss"]) < 1e-5 and before["val_acc"] == after["val_acc"]


def test_factored_training_exports_a_plain_backbone(tmp_path):
    cfg = MeshTrainConfig(**TINY, steps=6, factored_embedding=True, ship_dir=str(tmp_path / "assets" / "my-mesh"),
                          max_parts=1, rotation="axis")
    lines: list[str] = []
    metrics = train(cfg, tmp_path, lines.append)
    shipped = json.loads((tmp_path / "assets" / "my-mesh" / "config.json").read_text())
    assert (shipped["kind"], shipped["name"], shipped["builder"]) == ("target", "my-mesh", "mesh_gpt")
    assert shipped["procedural"] == {"max_parts": 1, "rotation": "axis"}  # heads / benchmark / generate use it
    losses = [float(x.split(" loss ")[1].split()[0]) for x in lines if x.startswith("step ")]
    assert len(losses) == 6 and losses[-1] < losses[0]
    state = load_file(str(tmp_path / "model.safetensors"))
    assert not any("axes" in k for k in state)  # nothing of the reparametrisation ships
    meta = json.loads((tmp_path / "config.json").read_text())
    model = MeshGPT(**meta["kwargs"])
    state["decoder.output.weight"] = state["decoder.tok_embeddings.weight"]
    model.load_state_dict({k: v.float() for k, v in state.items()})
    ev = evaluate(model, eval_set(cfg.eval_meshes, cfg.num_points, cfg.max_tokens, cfg.spec()))
    assert abs(ev["val_loss"] - metrics["val_loss"]) < 2e-2  # fp16 export of the folded table
