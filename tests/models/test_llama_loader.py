"""Loaders: specgen logits equal transformers' on the same weights (tiny random configs; SmolLM2 slow)."""

from __future__ import annotations

import json

import pytest
import torch

from specgen.errors import CheckpointError
from specgen.models.hf_export import hf_state, to_hf
from specgen.models.llama import load_hf_folder
from tests.conftest import tiny_model


@pytest.mark.parametrize("layout,bias,nope", [("half", False, ()), ("interleaved", False, ()), ("half", True, ()),
                                             ("half", False, (1,)), ("interleaved", False, (0, 2))])
def test_logits_equal_transformers(layout, bias, nope):
    """The `hf` row's export computes specgen's logits; NoPE layers (`nope_layers`) export as SmolLM3's
    no_rope_layers (a Llama export rotated them: other logits)."""
    model = tiny_model(0, rope_layout=layout, qkv_bias=bias, n_kv_heads=2, tie_embeddings=not bias, nope_layers=nope,
                       n_layers=3)
    if bias:
        for blk in model.layers:
            torch.nn.init.normal_(blk.attention.wqkv.bias, std=0.2)
    hf = to_hf(model)
    tokens = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(0))
    ours, _ = model(tokens, torch.arange(17).expand(2, 17))
    with torch.no_grad():
        theirs = hf(tokens).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert type(hf).__name__ == ("SmolLM3ForCausalLM" if nope else "LlamaForCausalLM" if not bias else
                                 "Qwen2ForCausalLM")
    if nope:
        assert hf.config.no_rope_layers == [int(i not in nope) for i in range(3)]


@pytest.mark.parametrize("over", [dict(qk_norm=True), dict(qkv_bias=True), dict(rope_dim=4, head_dim=8)])
def test_nope_layers_beside_what_smollm3_lacks_are_not_exported(over):
    """SmolLM3, the class NoPE layers export as, has no q/k norms, q/k/v-only biases or partial RoPE: a model with
    them is refused (a tied export loads its state non-strictly, so q/k norms were dropped silently)."""
    with pytest.raises(ValueError, match="SmolLM3"):
        to_hf(tiny_model(0, nope_layers=(1,), **over))


def test_hf_folder_roundtrip(tmp_path):
    from safetensors.torch import save_file

    model = tiny_model(1, tie_embeddings=False)
    hf = to_hf(model)
    hf.config.architectures = ["LlamaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    save_file({k: v.contiguous() for k, v in hf_state(model).items()}, str(tmp_path / "model.safetensors"))
    got = load_hf_folder(tmp_path)
    cfg, state = got.cfg, got.state
    assert cfg.rope_layout == "half" and cfg.n_kv_heads == 2
    from specgen.models.transformer import Transformer

    loaded = Transformer(cfg)
    loaded.load_state_dict(state, strict=True)
    tokens = torch.randint(0, 64, (1, 9))
    a, _ = loaded(tokens, torch.arange(9)[None])
    with torch.no_grad():
        b = hf(tokens).logits
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_a_missing_tensor_is_named_with_its_checkpoint(tmp_path):
    from safetensors.torch import save_file

    model = tiny_model(1, tie_embeddings=False)
    hf = to_hf(model)
    hf.config.architectures = ["LlamaForCausalLM"]
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf.config.to_dict()))
    state = {k: v.contiguous() for k, v in hf_state(model).items() if k != "model.layers.1.mlp.down_proj.weight"}
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="^my-llama lacks tensor model.layers.1.mlp.down_proj.weight$"):
        load_hf_folder(folder)


@pytest.mark.slow
def test_smollm2_gguf_matches_transformers_gguf_loader():
    """The built-in GGUF conversion equals transformers' own GGUF loading of the same file."""
    from transformers import AutoModelForCausalLM

    from specgen import checkpoints
    from specgen.builtins import smollm2_gguf_path

    path = smollm2_gguf_path()
    ours = checkpoints.load_module(checkpoints.find("smollm2-135m"))
    theirs = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, torch_dtype=torch.float32).eval()
    tokens = torch.randint(0, 49152, (1, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, _ = ours(tokens, torch.arange(32)[None])
        b = theirs(tokens).logits
    torch.testing.assert_close(a, b, atol=2e-3, rtol=1e-3)
    assert (a.argmax(-1) == b.argmax(-1)).all()


def sharded_folder(folder):
    """A tiny model saved as an HF folder in two shards with their model.safetensors.index.json."""
    from safetensors.torch import save_file

    model = tiny_model(1, tie_embeddings=False)
    hf = to_hf(model)
    hf.config.architectures = ["LlamaForCausalLM"]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf.config.to_dict()))
    state = {k: v.contiguous() for k, v in hf_state(model).items()}
    names = sorted(state)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: state[k] for k in part}, str(folder / shard))
        weight_map.update(dict.fromkeys(part, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def test_a_missing_or_truncated_shard_is_named(tmp_path):
    # a missing shard was reported as its first tensor ("checkpoint lacks tensor model.norm.weight"), a truncated one
    # by its bare file name
    folder = sharded_folder(tmp_path / "m")
    load_hf_folder(folder)
    shard = folder / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match=f"cannot read {shard}: .*truncated, or not a safetensors file"):
        load_hf_folder(folder)
    shard.unlink()
    with pytest.raises(CheckpointError, match="m lacks model-00002-of-00002.safetensors, which "
                                              "model.safetensors.index.json lists"):
        load_hf_folder(folder)


def test_a_folder_of_pickled_weights_only_is_refused_with_the_safe_conversion(tmp_path):
    """Nothing is unpickled: a `pytorch_model.bin`-only folder is refused, naming how transformers converts it."""
    from specgen.errors import UsageError

    hf = to_hf(tiny_model(1, tie_embeddings=False))
    hf.config.architectures = ["LlamaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    (tmp_path / "pytorch_model.bin").write_bytes(b"a pickle, never opened")
    with pytest.raises(UsageError, match=r"no \.safetensors weights .*safe_serialization=True"):
        load_hf_folder(tmp_path)
