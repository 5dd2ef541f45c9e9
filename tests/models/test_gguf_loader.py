"""GGUF files (models/gguf_loader.py) load as their HF folders do: each written here as llama.cpp's converter writes
one from a transformers model's folder, its logits transformers' (1e-4); what the loader does not map is refused."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest
import torch
from gguf import GGUFWriter, RopeScalingType

from specgen.errors import CheckpointError, UsageError
from specgen.models.gguf_loader import load_gguf
from specgen.models.hf_export import to_hf
from specgen.models.llama import layer_map, load_hf_folder
from specgen.models.rope import per_head, spread_order
from specgen.models.transformer import Transformer
from tests.models.test_hf_configs import (GRANITE, LLAMA3, SMOLLM3, assert_same, cached_logits, gemma1_model,
                                          exaone4_model, gemma2_model, gemma3_model, granite_model, hf_model, logits,
                                          olmo2_model, tokens)


def llama3_factors(hd: int, theta: float, scaling: dict) -> list[float]:
    """The rope_freqs.weight llama.cpp's converter stores for a Llama 3 scaling: a frequency's divisor, 1 where its
    wavelength is under original / high_freq_factor, `factor` over original / low_freq_factor, and between them the
    blend's, 1 / ((1 - s) / factor + s), s = (original / wavelength - low) / (high - low)."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for f in (1.0 / theta ** (torch.arange(0, hd, 2).float() / hd)).tolist():
        wavelength = 2 * math.pi / f
        s = (old / wavelength - low) / (high - low)
        out.append(1.0 if wavelength < old / high else factor if wavelength > old / low else 1 / ((1 - s) / factor + s))
    return out


def write_gguf(path, cfg, state: dict[str, torch.Tensor], extra: dict | None = None, arch: str = "llama",
               **keys) -> None:
    """A GGUF of specgen weights in HF's rotate-half layout, as llama.cpp's converter writes one: for `llama`,
    `smollm3` and `granite` (their converters are Llama's), q and k rows permuted to interleaved rotary pairs (`qwen2`,
    `qwen3`, `phi3`, `gemma3` keep the halves; `phi3` fuses q, k, v into attn_qkv and gate, up into ffn_up; `gemma3`'s
    norms are specgen's 1 + w, which its converter writes; routed experts stacked [E, out, in], Mixtral's); `extra`
    tensors (name -> float32 array) besides; `keys`:
    more metadata, by the writer's `add_<key>` (sliding_window=4, rope_scaling_type="yarn", ...; a callable writes the
    key its own way: `lambda w: None` leaves it out)."""
    w = GGUFWriter(str(path), arch)
    for key, value in {**dict(block_count=cfg.n_layers, context_length=cfg.max_seq_len, embedding_length=cfg.dim,
                              feed_forward_length=cfg.ffn_dim, head_count=cfg.n_heads, head_count_kv=cfg.n_kv_heads,
                              layer_norm_rms_eps=cfg.norm_eps, rope_freq_base=cfg.rope_theta, key_length=cfg.hd,
                              value_length=cfg.hd, rope_dimension_count=cfg.rotary_dim), **keys}.items():
        value(w) if callable(value) else getattr(w, f"add_{key}")(value)
    sizes = [cfg.n_heads * cfg.hd] + [cfg.n_kv_heads * cfg.hd] * 2
    tensors = {}  # GGUF name -> tensor
    for ours, theirs in layer_map(cfg, "gguf").items():
        tensors |= dict(zip(theirs, state[ours].split(sizes) if len(theirs) == 3 else (state[ours],)))
    for name in [n for n in tensors if n.endswith(("attn_q.weight", "attn_k.weight")) and cfg.rope_dim]:
        tensors[name] = per_head(tensors[name], spread_order(cfg.hd, cfg.rope_dim).argsort())  # HF's order
    for name in sorted(n for n in tensors if re.search(r"_exps\.weight\.0$", n)):  # experts: llama.cpp's [E, out, in]
        whole = name.removesuffix(".0")
        tensors[whole] = torch.stack([tensors.pop(f"{whole}.{e}") for e in range(cfg.n_experts)])
    if arch == "phi3":
        for i in range(cfg.n_layers):
            b = f"blk.{i}."
            tensors[b + "attn_qkv.weight"] = torch.cat([tensors.pop(b + f"attn_{x}.weight") for x in "qkv"])
            tensors[b + "ffn_up.weight"] = torch.cat([tensors.pop(b + "ffn_gate.weight"), tensors[b + "ffn_up.weight"]])
    for name, t in tensors.items():
        if arch in ("llama", "smollm3", "granite") and name.endswith(("attn_q.weight", "attn_k.weight")):  # -> pairs
            heads = t.shape[0] // cfg.hd
            t = t.reshape(heads, 2, cfg.hd // 2, -1).transpose(1, 2).reshape(t.shape)
        w.add_tensor(name, t.float().numpy())
    for name, array in (extra or {}).items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_llama3_gguf_decodes_as_transformers_llama3(tmp_path):
    """Llama 3.x GGUFs carry their RoPE scaling as rope_freqs.weight (a divisor a frequency), which the loader refused:
    it now divides each frequency by its factor, as llama.cpp does, so the GGUF of a transformers Llama 3 model gives
    that model's logits, and so does the `hf` row's export of it. Control: the same GGUF without the factors."""
    theirs = hf_model("LlamaForCausalLM", rope_scaling=LLAMA3, tie_word_embeddings=False)
    theirs.save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    cfg, state = loaded.cfg, loaded.state
    factors = llama3_factors(cfg.hd, cfg.rope_theta, LLAMA3)
    assert factors[0] == 1 and 1 < factors[1] < 8 and factors[-1] == 8  # every band of the scaling is tested
    write_gguf(tmp_path / "l3.gguf", cfg, state, {"rope_freqs.weight": np.array(factors, dtype=np.float32)})
    write_gguf(tmp_path / "plain.gguf", cfg, state)
    models = {}
    for name in ("l3", "plain"):
        loaded = load_gguf(tmp_path / f"{name}.gguf")
        got_cfg, got_state = loaded.cfg, loaded.state
        models[name] = Transformer(got_cfg).eval()
        models[name].load_state_dict(got_state)
    assert models["l3"].cfg.rope_scaling == {"rope_type": "factors",
                                             "factors": np.array(factors, dtype=np.float32).tolist()}
    x = tokens(96)  # past original_max_position_embeddings (32): the scaling shows
    assert_same(models["l3"], theirs, x)
    assert_same(to_hf(models["l3"]), theirs, x)
    assert not torch.allclose(logits(models["plain"], x), logits(theirs, x), atol=1e-2)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "phi3", "phi4"])
def test_a_qwen_or_phi3_gguf_decodes_as_transformers_model(arch, tmp_path):
    """Qwen2 (q/k/v biases), Qwen3 (per-head q and k norms, a head size that is not hidden / heads) and Phi-3 GGUFs
    (fused attn_qkv and ffn_up: gate, then up; Phi-4-mini's with partial RoPE, rope.dimension_count below the head
    size) give the logits transformers' model of the same weights gives (Qwen3 and Phi-3 were refused as unsupported
    architectures before, partial RoPE after them)."""
    hf_arch, over = {"qwen2": ("Qwen2ForCausalLM", {}), "qwen3": ("Qwen3ForCausalLM", dict(head_dim=16)),
                     "phi3": ("Phi3ForCausalLM", dict(pad_token_id=0)),
                     "phi4": ("Phi3ForCausalLM", dict(pad_token_id=0, hidden_size=64, partial_rotary_factor=0.75)),
                     }[arch]
    theirs = hf_model(hf_arch, tie_word_embeddings=False, **over)
    theirs.save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    cfg, state = loaded.cfg, loaded.state
    write_gguf(tmp_path / "q.gguf", cfg, state, arch=arch.replace("phi4", "phi3"))
    seen = []  # the progress callback: each stored tensor converted once, a fused one too
    loaded = load_gguf(tmp_path / "q.gguf", lambda i, n: seen.append((i, n)))
    got_cfg, got_state = loaded.cfg, loaded.state
    assert seen == [(i, seen[0][1]) for i in range(1, seen[0][1] + 1)]
    ours = Transformer(got_cfg).eval()
    ours.load_state_dict(got_state)
    assert (got_cfg.qk_norm, got_cfg.qkv_bias, got_cfg.hd, got_cfg.rotary_dim) == {
        "qwen2": (False, True, 8, 8), "qwen3": (True, False, 16, 16), "phi3": (False, False, 8, 8),
        "phi4": (False, False, 16, 12)}[arch]
    assert_same(ours, theirs, tokens(40))


@pytest.mark.parametrize("no_rope_layers,same", [(None, True), ([0, 1, 1, 1, 0, 1, 1, 1], False)])
def test_a_smollm3_gguf_skips_rope_on_every_fourth_layer_as_llama_cpp_does(no_rope_layers, same, tmp_path):
    """A smollm3 GGUF holds no NoPE layers key: llama.cpp skips RoPE on layer i when (i + 1) % 4 == 0, and so does the
    loader, which gives transformers' logits for SmolLM3's default layers (3 and 7 of 8), also through the hf row's
    export. A SmolLM3 whose no_rope_layers is another pattern converts to the same GGUF keys and loads with that step:
    not its HF folder's model, as in llama.cpp (docs/architectures.md). Control: no NoPE layers differs."""
    theirs = hf_model("SmolLM3ForCausalLM", **{**SMOLLM3, "num_hidden_layers": 8, "no_rope_layers": no_rope_layers})
    theirs.save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    write_gguf(tmp_path / "s.gguf", loaded.cfg, loaded.state, arch="smollm3")
    loaded = load_gguf(tmp_path / "s.gguf")
    ours = Transformer(loaded.cfg).eval()
    assert ours.load_state_dict(loaded.state, strict=False) == (["output.weight"], [])  # tied: the embedding's
    assert (loaded.cfg.nope_layers, loaded.cfg.rope_layout, loaded.cfg.tie_embeddings) == ((3, 7), "interleaved", True)
    x = tokens(64)
    if not same:
        assert not torch.allclose(logits(ours, x), logits(theirs, x), atol=1e-2)
        return
    assert_same(ours, theirs, x)
    assert_same(to_hf(ours), theirs, x)
    wrong = Transformer(dataclasses.replace(loaded.cfg, nope_layers=())).eval()
    wrong.load_state_dict(loaded.state, strict=False)
    assert not torch.allclose(logits(wrong, x), logits(theirs, x), atol=1e-2)


@pytest.mark.parametrize("window,context", [(None, 256), (100, 100), (4096, 256), (0, None)])
def test_a_gguf_sliding_window_of_unplaced_layers_caps_the_context(window, context, tmp_path):
    """A llama GGUF naming a sliding window (Mistral's) names no layers that slide (gemma3's are its local ones):
    below the window every key is in it, so the context is capped there and the model is the same; a window that is
    no positive count is refused."""
    theirs = hf_model("LlamaForCausalLM", tie_word_embeddings=False)
    theirs.save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    cfg, state = loaded.cfg, loaded.state
    write_gguf(tmp_path / "w.gguf", cfg, state, **({} if window is None else dict(sliding_window=window)))
    if context is None:
        with pytest.raises(UsageError, match="sliding_window=0: not a positive window"):
            load_gguf(tmp_path / "w.gguf")
        return
    loaded = load_gguf(tmp_path / "w.gguf")
    got_cfg, got_state = loaded.cfg, loaded.state
    ours = Transformer(got_cfg).eval()
    ours.load_state_dict(got_state)
    assert got_cfg.max_seq_len == context
    assert_same(ours, theirs, tokens(40))


@pytest.mark.parametrize("factors", [[1.0, 2.0], [1.0, 0.0, 8.0, 8.0], [1.0, float("nan"), 8.0, 8.0]])
def test_rope_freqs_of_another_length_or_not_positive_are_refused(factors, tmp_path):
    """rope_freqs.weight holds one positive divisor a frequency; any other is one line naming what it must be."""
    theirs = hf_model("LlamaForCausalLM")
    theirs.save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    cfg, state = loaded.cfg, loaded.state
    write_gguf(tmp_path / "bad.gguf", cfg, state, {"rope_freqs.weight": np.array(factors, dtype=np.float32)})
    with pytest.raises(CheckpointError, match="bad.gguf: RoPE factors must be a list of 4 positive finite numbers"):
        load_gguf(tmp_path / "bad.gguf")


@pytest.mark.parametrize("arch,rotary,error,needle", [
    ("qwen2", 4, UsageError, "qwen2.rope.dimension_count=4 for a head size of 8"),
    ("qwen2", 12, UsageError, "qwen2.rope.dimension_count=12 for a head size of 8"),
    ("phi3", 3, CheckpointError, "3 of 8 dims"),
    # 0 rotary dims: the model's rope_dim 0 reads as whole heads, which decoded this file silently wrong
    ("phi3", 0, UsageError, "phi3.rope.dimension_count=0 for a head size of 8"),
])
def test_partial_rope_other_than_phi3s_even_dims_is_refused(arch, rotary, error, needle, tmp_path):
    """Partial RoPE loads for phi3, the one architecture transformers computes it for (Phi-4-mini); elsewhere, over
    an odd number of dims or over none, one line names it."""
    theirs = hf_model("Phi3ForCausalLM" if arch == "phi3" else "Qwen2ForCausalLM", pad_token_id=0)
    theirs.save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    cfg, state = loaded.cfg, loaded.state
    write_gguf(tmp_path / "p.gguf", cfg, state, arch=arch, rope_dimension_count=rotary)
    with pytest.raises(error, match=re.escape(needle)):
        load_gguf(tmp_path / "p.gguf")


@pytest.mark.parametrize("kind", ["linear", "yarn"])
def test_a_gguf_rope_scaling_loads_as_the_hf_config_it_came_from(kind, tmp_path):
    """A GGUF's rope.scaling keys (linear; YaRN with llama.cpp's defaults, which are transformers') were refused: they
    now give the rope_scaling the HF config they were converted from gives, and transformers' logits."""
    scaling = {"rope_type": kind, "factor": 4.0, **({"original_max_position_embeddings": 32} if kind == "yarn" else {})}
    theirs = hf_model("LlamaForCausalLM", rope_scaling=scaling, tie_word_embeddings=False)
    theirs.save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    cfg, state = loaded.cfg, loaded.state
    keys = dict(rope_scaling_type=RopeScalingType(kind), rope_scaling_factor=4.0)
    write_gguf(tmp_path / "s.gguf", cfg, state, **keys, **({"rope_scaling_orig_ctx_len": 32} if kind == "yarn" else {}))
    loaded = load_gguf(tmp_path / "s.gguf")
    got_cfg, got_state = loaded.cfg, loaded.state
    assert got_cfg.rope_scaling == cfg.rope_scaling
    ours = Transformer(got_cfg).eval()
    ours.load_state_dict(got_state)
    assert_same(ours, theirs, tokens(96))


def test_a_phi3_longrope_gguf_loads_as_its_hf_folder(tmp_path):
    """Phi-3.5-mini's GGUF as llama.cpp's converter writes it: the short and long factors as tensors, the attention
    factor it computed and the original context as keys (no scaling type); the same table and context as the HF
    folder's, transformers' logits."""
    longrope = {"rope_type": "longrope", "short_factor": [1.0, 1.5, 3.0, 6.0], "long_factor": [1.0, 2.0, 8.0, 16.0]}
    theirs = hf_model("Phi3ForCausalLM", pad_token_id=0, rope_scaling=longrope, original_max_position_embeddings=32,
                      tie_word_embeddings=False)
    theirs.save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    cfg, state = loaded.cfg, loaded.state
    tensors = {f"rope_factors_{x}.weight": np.array(longrope[f"{x}_factor"], dtype=np.float32)
               for x in ("short", "long")}
    write_gguf(tmp_path / "p.gguf", dataclasses.replace(cfg, max_seq_len=256), state, tensors, arch="phi3",
               rope_scaling_attn_factors=math.sqrt(1 + math.log(256 / 32) / math.log(32)), rope_scaling_orig_ctx_len=32)
    loaded = load_gguf(tmp_path / "p.gguf")
    got_cfg, got_state = loaded.cfg, loaded.state
    got, want = dict(got_cfg.rope_scaling), dict(cfg.rope_scaling)  # the attention factor as the file's float32
    assert got.pop("attention_factor") == pytest.approx(want.pop("attention_factor"), rel=1e-7) and got == want
    assert got_cfg.max_seq_len == 32
    ours = Transformer(got_cfg).eval()
    ours.load_state_dict(got_state)
    assert_same(ours, theirs, tokens(32))
    del tensors["rope_factors_long.weight"]
    write_gguf(tmp_path / "half.gguf", cfg, state, tensors, arch="phi3", rope_scaling_orig_ctx_len=32)
    with pytest.raises(CheckpointError, match="holds one of rope_factors_short/long.weight; LongRoPE needs both"):
        load_gguf(tmp_path / "half.gguf")


@pytest.mark.parametrize("keys,needle", [
    (dict(rope_scaling_type=RopeScalingType("longrope"), rope_scaling_factor=4.0), "rope.scaling.type=longrope"),
    (dict(rope_scaling_type=RopeScalingType("yarn"), rope_scaling_factor=4.0, rope_scaling_yarn_log_mul=0.1),
     "rope.scaling.yarn_log_multiplier"),
    (dict(rope_scaling_type=RopeScalingType("linear"), rope_scaling_factor=0.0), "rope.scaling.factor=0.0"),
])
def test_a_gguf_rope_scaling_the_loader_does_not_map_is_refused(keys, needle, tmp_path):
    """A RoPE key the loader does not map (or a factor that scales nothing) is one line naming it."""
    hf_model("LlamaForCausalLM", tie_word_embeddings=False).save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    cfg, state = loaded.cfg, loaded.state
    write_gguf(tmp_path / "s.gguf", cfg, state, **keys)
    with pytest.raises(UsageError, match=f"s.gguf sets llama.{needle}, which specgen's GGUF loader does not map"):
        load_gguf(tmp_path / "s.gguf")


def test_a_gemma_gguf_decodes_as_transformers_gemma(tmp_path):
    """A gemma (Gemma 1) GGUF: norms with the converter's + 1, GeGLU and the sqrt(dim) embedding scale, which no key
    holds (llama.cpp's gemma loader sets them), give transformers' logits, and so does the hf row's export of it.
    Control: no embedding scale."""
    theirs = gemma1_model()
    theirs.save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    write_gguf(tmp_path / "g.gguf", loaded.cfg, loaded.state, arch="gemma")
    got = load_gguf(tmp_path / "g.gguf")
    assert dataclasses.replace(got.cfg, norm_eps=1e-6) == loaded.cfg  # (the epsilon: a float32 key)
    ours = Transformer(got.cfg).eval()
    ours.load_state_dict(got.state, strict=False)
    x = tokens(40)
    assert_same(ours, theirs, x)
    assert_same(to_hf(ours), theirs, x)
    wrong = Transformer(dataclasses.replace(got.cfg, embed_scale=1.0)).eval()
    wrong.load_state_dict(got.state, strict=False)
    assert not torch.allclose(logits(wrong, x), logits(theirs, x), atol=1e-2)


def gemma3_gguf(tmp_path, **keys) -> tuple:
    """A transformers Gemma 3 (7 layers, layer 5 global; linear scaling on it; the local base and attention scale
    llama.cpp fixes) and its gemma3 GGUF as llama.cpp's converter writes it (`keys`: more metadata)."""
    theirs = gemma3_model(query_pre_attn_scalar=16, rope_local_base_freq=10000.0,
                          rope_scaling={"rope_type": "linear", "factor": 4.0})
    theirs.save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    write_gguf(tmp_path / "g.gguf", loaded.cfg, loaded.state, arch="gemma3", sliding_window=loaded.cfg.window,
               rope_scaling_type=RopeScalingType.LINEAR, rope_scaling_factor=4.0, **keys)
    return theirs, tmp_path / "g.gguf"


def test_a_gemma3_gguf_decodes_as_transformers_gemma3(tmp_path):
    """A gemma3 GGUF (norms with the converter's + 1, q/k norms, post-attention and post-FFN norms, no key for the
    local layers, their base or the attention scale: llama.cpp fixes them; the window of 16 over 100 tokens) gives
    transformers' logits, uncached and through a cache, and so does the hf row's export of it. Controls: one RoPE
    base in every layer, no window, or no embedding scale, differ."""
    theirs, path = gemma3_gguf(tmp_path)
    loaded = load_gguf(path)
    ours = Transformer(loaded.cfg).eval()
    assert ours.load_state_dict(loaded.state, strict=False) == (["output.weight"], [])  # tied: the embedding's
    # the HF folder's config, its window and context included (but the epsilon, a float32 key)
    assert dataclasses.replace(loaded.cfg, norm_eps=1e-6) == load_hf_folder(tmp_path / "hf").cfg
    assert (loaded.cfg.window, loaded.cfg.max_seq_len) == (16, 256)
    x = tokens(100)
    assert_same(ours, theirs, x)
    torch.testing.assert_close(cached_logits(ours, x), logits(theirs, x), atol=1e-4, rtol=1e-4)
    assert_same(to_hf(ours), theirs, x)
    for over in (dict(local_rope_theta=0.0), dict(window=0), dict(embed_scale=1.0)):
        wrong = Transformer(dataclasses.replace(loaded.cfg, **over)).eval()
        wrong.load_state_dict(loaded.state, strict=False)
        assert not torch.allclose(logits(wrong, x), logits(theirs, x), atol=1e-2)


@pytest.mark.parametrize("keys,needle", [
    (dict(final_logit_softcapping=30.0), "gemma3.final_logit_softcapping: a gemma3 GGUF's softcapping is not mapped"),
    (dict(attn_logit_softcapping=50.0), "gemma3.attn_logit_softcapping: a gemma3 GGUF's softcapping is not mapped"),
    (dict(rope_freq_base_swa=1e6), "gemma3.rope.freq_base_swa, which llama.cpp's gemma3 loader fixes"),
    (dict(sliding_window_pattern=[True, False] * 3 + [True]), "gemma3.attention.sliding_window_pattern, which"),
    (dict(pattern=lambda w: w.add_uint32("gemma3.attention.sliding_window_pattern", 6)),  # a count, not one a layer
     "gemma3.attention.sliding_window_pattern, which"),
])
def test_a_gemma3_gguf_key_llama_cpp_ignores_or_specgen_lacks_is_refused(keys, needle, tmp_path):
    """Softcapping (not mapped for gemma3), or a local base or layer pattern other than the ones llama.cpp's
    gemma3 loader fixes (the file would say one model, llama.cpp run another): one line naming the key."""
    _, path = gemma3_gguf(tmp_path, **keys)
    with pytest.raises(UsageError, match=needle):
        load_gguf(path)


def test_a_gemma3_gguf_of_the_default_pattern_and_base_written_out_loads(tmp_path):
    """The same pattern and base written as keys are what llama.cpp fixes: the file loads as without them."""
    _, path = gemma3_gguf(tmp_path, rope_freq_base_swa=10000.0, sliding_window_pattern=[True] * 5 + [False, True])
    assert load_gguf(path).cfg.local_layers == (0, 1, 2, 3, 4, 6)


def gemma2_gguf(tmp_path, layers: int, **keys) -> tuple:
    """A transformers Gemma 2 (window 16, caps 2 and 3) of `layers` layers whose query_pre_attn_scalar is the one
    llama.cpp's gemma2 scales by (the head size 16; hidden / heads = 8 for the 46-layer 27B), and its gemma2 GGUF as
    llama.cpp's converter writes it: norms with its + 1, q's projection as stored (the HF loader's fold undone), the
    window and caps as keys (`keys`: others, or `lambda w: None` to leave one out)."""
    theirs = gemma2_model(num_hidden_layers=layers, query_pre_attn_scalar=8 if layers == 46 else 16)
    theirs.save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    cfg, q_rows = loaded.cfg, loaded.cfg.n_heads * loaded.cfg.hd
    scale = (cfg.hd / theirs.config.query_pre_attn_scalar) ** 0.5
    state = {k: torch.cat([v[:q_rows] / scale, v[q_rows:]]) if k.endswith("wqkv.weight") else v
             for k, v in loaded.state.items()}
    write_gguf(tmp_path / "g.gguf", cfg, state, arch="gemma2",
               **{"sliding_window": 16, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0, **keys})
    return theirs, tmp_path / "g.gguf"


@pytest.mark.parametrize("layers", [5, 46])
def test_a_gemma2_gguf_decodes_as_transformers_gemma2(layers, tmp_path):
    """A gemma2 GGUF (norms with the converter's + 1, sandwich norms, the caps and window as keys; the layers that
    slide and the attention scale as llama.cpp's gemma2 fixes them: layers 0, 2, 4, ..., 1/sqrt(head size) but for
    the 46-layer 27B's 1/sqrt(hidden / heads)) gives transformers' logits, uncached and through a cache, and so does
    the hf row's export of it. Controls: no attention cap, no logit cap, no window, no embedding scale, and (27B)
    the head size's scale each differ."""
    theirs, path = gemma2_gguf(tmp_path, layers)
    loaded = load_gguf(path)
    ours = Transformer(loaded.cfg).eval()
    assert ours.load_state_dict(loaded.state, strict=False) == (["output.weight"], [])  # tied: the embedding's
    # the HF folder's config, its window, caps and context included (but the epsilon, a float32 key)
    assert dataclasses.replace(loaded.cfg, norm_eps=1e-6) == load_hf_folder(tmp_path / "hf").cfg
    assert loaded.cfg.local_layers == tuple(range(0, layers, 2)) and loaded.cfg.window == 16
    assert (loaded.cfg.attn_softcap, loaded.cfg.logit_softcap, loaded.cfg.max_seq_len) == (2.0, 3.0, 256)
    x = tokens(100 if layers < 46 else 40)
    assert_same(ours, theirs, x)
    torch.testing.assert_close(cached_logits(ours, x), logits(theirs, x), atol=1e-4, rtol=1e-4)
    assert_same(to_hf(ours), theirs, x)
    controls = [(dict(attn_softcap=0.0), {}), (dict(logit_softcap=0.0), {}), (dict(window=0, local_layers=()), {}),
                (dict(embed_scale=1.0), {})]
    if layers == 46:  # llama.cpp's 27B scale undone: the fold's q rows back as stored
        q_rows = loaded.cfg.n_heads * loaded.cfg.hd
        controls.append(({}, {k: torch.cat([v[:q_rows] / 2**0.5, v[q_rows:]]) for k, v in loaded.state.items()
                              if k.endswith("wqkv.weight")}))
    for over, weights in controls:
        wrong = Transformer(dataclasses.replace(loaded.cfg, **over)).eval()
        wrong.load_state_dict(loaded.state | weights, strict=False)
        assert not torch.allclose(logits(wrong, x), logits(theirs, x), atol=1e-2), over or "scale"


def test_a_gemma2_gguf_without_its_window_or_caps_takes_llama_cpps_defaults(tmp_path):
    """llama.cpp's gemma2 loader defaults: a 4096 window, caps 50 and 30 (it always caps both)."""
    none = lambda w: None  # noqa: E731
    _, path = gemma2_gguf(tmp_path, 5, sliding_window=none, attn_logit_softcapping=none, final_logit_softcapping=none)
    cfg = load_gguf(path).cfg
    assert (cfg.window, cfg.local_layers, cfg.attn_softcap, cfg.logit_softcap) == (4096, (0, 2, 4), 50.0, 30.0)


@pytest.mark.parametrize("key,value", [("attn_logit_softcapping", 0.0), ("final_logit_softcapping", -30.0)])
def test_a_gemma2_gguf_cap_that_is_not_positive_is_one_line(key, value, tmp_path):
    """llama.cpp divides by the cap: 0 or less is no model (one line naming the key)."""
    _, path = gemma2_gguf(tmp_path, 5, **{key: value})
    with pytest.raises(CheckpointError, match=f"^GGUF file g.gguf sets gemma2.{key}={json.dumps(value)}: not a "
                                              "positive number$"):
        load_gguf(path)


def test_a_truncated_gguf_says_so(tmp_path):
    """A GGUF cut short (an interrupted download) was 'cannot reshape array of size 3214336 into shape (49152,612)'."""
    path = tmp_path / "tiny.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    path.write_bytes(path.read_bytes()[:-4096])
    with pytest.raises(CheckpointError, match="cannot parse GGUF file .*tiny.gguf: .* \\(truncated, or not a GGUF "
                                              "file: fetch it again\\)"):
        load_gguf(path)


def test_a_gguf_without_an_architecture_is_not_a_model(tmp_path):
    """A GGUF naming no general.architecture (not a model's weights) read 'unsupported GGUF architecture None'."""
    w = GGUFWriter(str(tmp_path / "data.gguf"), "llama")
    w.kv_data[0].pop("general.architecture")
    w.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UsageError, match="^GGUF file data.gguf names no general.architecture: not a model's weights$"):
        load_gguf(tmp_path / "data.gguf")


def test_a_gguf_import_records_its_own_context_as_an_hf_folders_does(tmp_path):
    """A GGUF's context_length past specgen's cap (8192) was not recorded: its entry said nothing of the 32768 tokens
    the checkpoint declares, where the entry of its HF folder records them as source_context."""
    from specgen.importer import import_checkpoint

    hf_model("LlamaForCausalLM", tie_word_embeddings=False, max_position_embeddings=32768).save_pretrained(
        tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    tokenizer = dict(tokenizer_model="gpt2", token_list=[chr(i) for i in range(33, 97)], token_types=[1] * 64,
                     token_scores=[0.0] * 64, token_merges=[], eos_token_id=0)  # transformers converts it on import
    write_gguf(tmp_path / "l.gguf", dataclasses.replace(loaded.cfg, max_seq_len=32768), loaded.state, **tokenizer)
    for source in ("hf", "l.gguf"):
        entry = import_checkpoint(tmp_path / source, source.replace(".", "-"))
        assert entry.meta["source_context"] == 32768 and entry.meta["kwargs"]["max_seq_len"] == 8192


@pytest.mark.parametrize("method,key,value,says", [
    ("uint32", "attention.head_count", 0, "=0: not a positive integer"),
    ("string", "attention.head_count", "4", '="4": not a positive integer'),
    ("array", "attention.head_count", [4, 4], "=[4, 4]: not a positive integer"),
    ("bool", "attention.head_count_kv", True, "=true: not a positive integer"),
    ("int32", "block_count", -1, "=-1: not a positive integer"),
    ("float32", "embedding_length", 32.0, "=32.0: not a positive integer"),
    ("string", "feed_forward_length", "48", '="48": not a positive integer'),
    ("string", "context_length", "x", '="x": not a positive integer'),
    ("uint32", "attention.key_length", 0, "=0: not a positive integer"),
    ("float32", "attention.layer_norm_rms_epsilon", 0.0, "=0.0: not a positive number"),
    ("string", "rope.freq_base", "x", '="x": not a positive number'),
    ("string", "rope.dimension_count", "x", '="x": not a count of rotary dims'),
    ("array", "rope.dimension_count", [8], "=[8]: not a count of rotary dims"),
    (None, "attention.head_count", None, None),
    (None, "feed_forward_length", None, None),
])
def test_a_gguf_shape_key_that_builds_no_model_is_one_line_naming_it(method, key, value, says, tmp_path):
    """As config.json's counts (llama.count, positive_number): a head count of 0 was a ZeroDivisionError, a string
    or an array a TypeError or a broken entry; a required key left out, a TypeError."""
    hf_model("LlamaForCausalLM", tie_word_embeddings=False).save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    name = key.split(".")[-1].replace("layer_norm_rms_epsilon", "layer_norm_rms_eps").replace("freq_base",
                                                                                           "rope_freq_base")
    name = name.replace("dimension_count", "rope_dimension_count")
    add = (lambda w: None) if method is None else (lambda w: getattr(w, f"add_{method}")(f"llama.{key}", value))
    write_gguf(tmp_path / "b.gguf", loaded.cfg, loaded.state, **{name: add})
    with pytest.raises(CheckpointError) as err:
        load_gguf(tmp_path / "b.gguf")
    assert str(err.value) == f"GGUF file b.gguf {'lacks llama.' + key if says is None else f'sets llama.{key}{says}'}"


def test_a_gguf_tensor_of_another_shape_than_its_keys_give_is_named(tmp_path):
    """As an HF folder's: a tensor cut short was converted into an entry that broke at its first use."""
    hf_model("LlamaForCausalLM", tie_word_embeddings=False).save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    state = {**loaded.state, "layers.1.feed_forward.w2.weight": loaded.state["layers.1.feed_forward.w2.weight"][:, :40]}
    write_gguf(tmp_path / "cut.gguf", loaded.cfg, state)
    with pytest.raises(CheckpointError, match=r"^cut.gguf: tensor blk.1.ffn_down.weight has shape \[32, 40\]; its "
                                              r"config gives \[32, 48\]$"):
        load_gguf(tmp_path / "cut.gguf")


def test_a_gguf_without_a_tokenizer_is_one_line_naming_it(tmp_path):
    """A GGUF holding no tokenizer printed transformers' 'Can't find a way to retrieve missing config vocab_size' and
    then 'ValueError: Cannot build a tokenizer ...', naming no file; now the one line, and nothing registered."""
    import logging

    from specgen import registry
    from specgen.importer import import_checkpoint

    hf_model("LlamaForCausalLM", tie_word_embeddings=False).save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    write_gguf(tmp_path / "bare.gguf", loaded.cfg, loaded.state)
    said = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = said.append
    logging.getLogger("transformers").addHandler(handler)
    try:
        with pytest.raises(CheckpointError, match=f"^cannot load the tokenizer of {tmp_path / 'bare.gguf'}: "
                                                  "ValueError: Cannot build a tokenizer from a GGUF file"):
            import_checkpoint(tmp_path / "bare.gguf", "bare")
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert [r.getMessage() for r in said] == []
    assert not (registry.checkpoints_dir() / "target" / "bare").exists()


def olmo2_gguf(tmp_path, **keys) -> tuple:
    """A transformers OLMo 2 and its olmo2 GGUF as llama.cpp's converter writes it: the tensors as stored (NEOX RoPE:
    q and k keep their halves), the output norms as post_attention_norm and post_ffw_norm, the whole-span q/k norms as
    attn_q_norm [dim] and attn_k_norm [Hkv hd] (`keys`: more metadata)."""
    theirs = olmo2_model()
    theirs.save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    write_gguf(tmp_path / "o.gguf", loaded.cfg, loaded.state, arch="olmo2", **keys)
    return theirs, tmp_path / "o.gguf"


def test_an_olmo2_gguf_decodes_as_transformers_olmo2(tmp_path):
    """An olmo2 GGUF loads as its HF folder does (no pre-norms, sandwich norms, whole-span q/k norms, rotate-half
    RoPE, untied) and gives transformers' logits, uncached and through a cache, and so does the hf row's export of it.
    Control: the interleaved layout (llama's RoPE pairs) differs."""
    theirs, path = olmo2_gguf(tmp_path)
    loaded = load_gguf(path)
    ours = Transformer(loaded.cfg).eval()
    assert ours.load_state_dict(loaded.state) == ([], [])
    assert dataclasses.replace(loaded.cfg, norm_eps=1e-6) == load_hf_folder(tmp_path / "hf").cfg
    x = tokens(60)
    assert_same(ours, theirs, x)
    torch.testing.assert_close(cached_logits(ours, x), logits(theirs, x), atol=1e-4, rtol=1e-4)
    assert_same(to_hf(ours), theirs, x)
    wrong = Transformer(dataclasses.replace(loaded.cfg, rope_layout="interleaved")).eval()
    wrong.load_state_dict(loaded.state)
    assert not torch.allclose(logits(wrong, x), logits(theirs, x), atol=1e-2)


def test_an_olmo2_gguf_with_a_sliding_window_is_refused_in_one_line(tmp_path):
    """llama.cpp's olmo2 slides some layers where the file sets a window (OLMo 3's): refused, naming the key."""
    _, path = olmo2_gguf(tmp_path, sliding_window=16)
    with pytest.raises(UsageError, match="^GGUF file o.gguf sets olmo2.attention.sliding_window: .*OLMo 3") as err:
        load_gguf(path)
    assert "\n" not in str(err.value)


def exaone4_gguf(tmp_path, layers: int, scaled: bool = False, **keys) -> tuple:
    """A transformers EXAONE 4 of `layers` layers as llama.cpp's exaone4 loader builds one (64: the 32B's switch, every
    layer but each fourth sliding, here over 16 positions, the others NoPE; another count: no window, every layer full
    with RoPE) and its exaone4 GGUF as llama.cpp's converter writes it: the tensors as stored (NEOX RoPE), the output
    norms as post_attention_norm and post_ffw_norm, the per-head q/k norms as attn_q_norm and attn_k_norm, the window
    as a key, `scaled`: Llama 3's RoPE scaling (EXAONE 4.0 32B's) as rope_freqs.weight (`keys`: more metadata)."""
    full = dict(sliding_window=None, layer_types=["full_attention"] * layers)
    over = (dict(sliding_window=16) if layers == 64 else full) | (dict(rope_scaling=LLAMA3) if scaled else {})
    theirs = exaone4_model(num_hidden_layers=layers, **over)
    theirs.save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    cfg, window = loaded.cfg, {"sliding_window": 16} if layers == 64 else {}
    factors = {"rope_freqs.weight": np.array(llama3_factors(cfg.hd, cfg.rope_theta, LLAMA3), dtype=np.float32)}
    write_gguf(tmp_path / "e.gguf", cfg, loaded.state, factors if scaled else None, arch="exaone4",
               **{**window, **keys})
    return theirs, tmp_path / "e.gguf"


@pytest.mark.parametrize("layers,scaled", [(5, False), (64, False), (5, True)])
def test_an_exaone4_gguf_decodes_as_transformers_exaone4(layers, scaled, tmp_path):
    """An exaone4 GGUF loads as its HF folder does (no pre-norms, sandwich norms, per-head q/k norms, rotate-half RoPE;
    the 64-layer model's sliding layers over the file's window and its NoPE global layers, as llama.cpp fixes them;
    Llama 3's scaling as its frequency divisors) and gives transformers' logits, uncached and through a cache, and so
    does the hf row's export of it. Controls: the interleaved layout, and (64 layers) RoPE in every layer or no
    window, each differ."""
    theirs, path = exaone4_gguf(tmp_path, layers, scaled)
    loaded = load_gguf(path)
    ours = Transformer(loaded.cfg).eval()
    assert ours.load_state_dict(loaded.state) == ([], [])
    hf_cfg = load_hf_folder(tmp_path / "hf").cfg  # (the scaling: the file's divisors, not the HF dict)
    assert dataclasses.replace(loaded.cfg, norm_eps=1e-6, rope_scaling=hf_cfg.rope_scaling) == hf_cfg
    assert (loaded.cfg.rope_scaling or {}).get("rope_type") == ("factors" if scaled else None)
    assert (loaded.cfg.window, len(loaded.cfg.nope_layers), loaded.cfg.max_seq_len) == (
        (16, 16, 256) if layers == 64 else (0, 0, 256))
    x = tokens(96 if scaled else 60)  # past the scaling's original context (32)
    assert_same(ours, theirs, x)
    torch.testing.assert_close(cached_logits(ours, x), logits(theirs, x), atol=1e-4, rtol=1e-4)
    assert_same(to_hf(ours), theirs, x)
    controls = [dict(rope_layout="interleaved")] + ([dict(rope_scaling=None)] if scaled else [])
    controls += [dict(nope_layers=()), dict(window=0, local_layers=())] if layers == 64 else []
    for over in controls:
        wrong = Transformer(dataclasses.replace(loaded.cfg, **over)).eval()
        wrong.load_state_dict(loaded.state)
        assert not torch.allclose(logits(wrong, x), logits(theirs, x), atol=1e-2), over


def test_an_exaone4_gguf_of_the_fixed_pattern_written_out_or_without_its_window_loads(tmp_path):
    """The 32B's pattern written as a key (the converter's array from layer_types) is what llama.cpp fixes; without
    the window key llama.cpp's default 4096 slides."""
    local = [(i + 1) % 4 != 0 for i in range(64)]
    _, path = exaone4_gguf(tmp_path, 64, sliding_window=lambda w: None, sliding_window_pattern=local)
    cfg = load_gguf(path).cfg
    assert (cfg.window, cfg.local_layers) == (4096, tuple(i for i in range(64) if local[i]))


@pytest.mark.parametrize("layers,keys,key", [
    (5, dict(sliding_window=16), "sliding_window"),  # llama.cpp slides no layer of a model of another size
    (5, dict(sliding_window_pattern=[True] * 4 + [False]), "sliding_window_pattern"),
    (64, dict(sliding_window_pattern=[True, False] * 32), "sliding_window_pattern"),
])
def test_an_exaone4_gguf_window_llama_cpp_ignores_is_refused_in_one_line(layers, keys, key, tmp_path):
    """llama.cpp's exaone4 loader fixes its sliding layers by the layer count: a window or pattern it would ignore
    (the file says another model than it runs) is refused, naming the key."""
    _, path = exaone4_gguf(tmp_path, layers, **keys)
    with pytest.raises(UsageError, match=f"^GGUF file e.gguf sets exaone4.attention.{key}, which llama.cpp") as err:
        load_gguf(path)
    assert "\n" not in str(err.value)


GRANITE_GGUF_KEYS = {"embedding_scale": 12.0, "attention_scale": 0.1, "residual_scale": 0.3, "logit_scale": 4.0}


def granite_gguf(tmp_path, tied: bool = True, **keys) -> tuple:
    """A transformers Granite (GRANITE's multipliers) and its granite GGUF as llama.cpp's converter writes it: HF's
    weights unscaled (the HF loader's folds undone), q and k permuted to interleaved pairs, the multipliers as
    granite.embedding_scale, .attention.scale, .residual_scale and .logit_scale (`keys`: others, or `lambda w: None`
    to leave one out)."""
    theirs = granite_model(tie_word_embeddings=tied)
    theirs.save_pretrained(tmp_path / "hf")
    loaded = load_hf_folder(tmp_path / "hf")
    cfg, q_rows = loaded.cfg, loaded.cfg.n_heads * loaded.cfg.hd
    attention, residual = GRANITE["attention_multiplier"] * cfg.hd**0.5, GRANITE["residual_multiplier"]

    def unfolded(k: str, v: torch.Tensor) -> torch.Tensor:
        if k.endswith("wqkv.weight"):
            return torch.cat([v[:q_rows] / attention, v[q_rows:]])
        return v / residual if k.endswith(("wo.weight", "w2.weight")) else v

    write_gguf(tmp_path / "g.gguf", cfg, {k: unfolded(k, v) for k, v in loaded.state.items()}, arch="granite",
               **{**GRANITE_GGUF_KEYS, **keys})
    return theirs, tmp_path / "g.gguf"


@pytest.mark.parametrize("tied", [True, False])
def test_a_granite_gguf_decodes_as_transformers_granite(tied, tmp_path):
    """A granite GGUF (llama.cpp's NORM RoPE over the converter's permuted q/k, its four scales as keys, the weights
    unscaled) loads as its HF folder does and gives transformers' logits, uncached and through a cache, and so does
    the hf row's export of it. Controls: each scale left out (llama.cpp's default: 1, or 1/sqrt(head size)) and the
    rotate-half layout differ."""
    theirs, path = granite_gguf(tmp_path, tied)
    loaded = load_gguf(path)
    ours = Transformer(loaded.cfg).eval()
    assert ours.load_state_dict(loaded.state, strict=False) == (["output.weight"] if tied else [], [])
    assert dataclasses.replace(loaded.cfg, norm_eps=1e-6, rope_layout="half") == load_hf_folder(tmp_path / "hf").cfg
    assert (loaded.cfg.embed_scale, loaded.cfg.logit_scale, loaded.cfg.rope_layout) == (12.0, 4.0, "interleaved")
    x = tokens(60)
    assert_same(ours, theirs, x)
    torch.testing.assert_close(cached_logits(ours, x), logits(theirs, x), atol=1e-4, rtol=1e-4)
    assert_same(to_hf(ours), theirs, x)
    for key in ("embedding_scale", "attention_scale", "residual_scale"):
        _, other = granite_gguf(tmp_path / key, tied, **{key: lambda w: None})
        wrong = load_gguf(other)
        model = Transformer(wrong.cfg).eval()
        model.load_state_dict(wrong.state, strict=False)
        assert not torch.allclose(logits(model, x), logits(theirs, x), atol=1e-2), key
    wrong = Transformer(dataclasses.replace(loaded.cfg, rope_layout="half")).eval()
    wrong.load_state_dict(loaded.state, strict=False)
    assert not torch.allclose(logits(wrong, x), logits(theirs, x), atol=1e-2)


@pytest.mark.parametrize("keys,says", [
    (dict(logit_scale=lambda w: None), "^GGUF file g.gguf lacks granite.logit_scale"),
    (dict(rope_scaling_finetuned=False), "^GGUF file g.gguf sets granite.rope.scaling.finetuned=false"),
    (dict(residual_scale=-0.3), "^GGUF file g.gguf sets granite.residual_scale=-0.3.*: not a positive number"),
])
def test_a_granite_gguf_that_llama_cpp_builds_otherwise_is_refused_in_one_line(keys, says, tmp_path):
    """Without the logit scale llama.cpp refuses the file; with RoPE switched off (rope.scaling.finetuned false) it
    builds a model specgen's loader does not map; a negative scale is no model's."""
    _, path = granite_gguf(tmp_path, **keys)
    with pytest.raises((UsageError, CheckpointError), match=says) as err:
        load_gguf(path)
    assert "\n" not in str(err.value)




def test_a_qwen3moe_gguf_decodes_as_transformers_qwen3_moe_does_with_norm_topk_prob(tmp_path):
    """A qwen3moe GGUF (q/k rows in halves, per-head q/k norms, `qwen3moe.expert_feed_forward_length` the experts'
    width, stacks [E, out, in]) gives transformers' Qwen3-MoE logits where norm_topk_prob is true: llama.cpp's
    qwen3moe graph always renormalises the k weights, so a checkpoint without it converts to that model; the control:
    its own (unrenormalised) transformers logits differ."""
    from tests.models.test_hf_configs import moe_model

    for renorm in (True, False):
        theirs = moe_model("Qwen3MoeForCausalLM", norm_topk_prob=renorm)
        theirs.save_pretrained(tmp_path)
        loaded = load_hf_folder(tmp_path)
        path = tmp_path / "qwen3moe.gguf"
        write_gguf(path, loaded.cfg, loaded.state, arch="qwen3moe", expert_count=4, expert_used_count=2,
                   expert_feed_forward_length=24)
        got = load_gguf(path)
        cfg = got.cfg
        assert (cfg.n_experts, cfg.experts_per_token, cfg.expert_renorm, cfg.ffn_dim) == (4, 2, True, 24)
        ours = Transformer(got.cfg).eval()
        ours.load_state_dict(got.state)
        x = tokens(60)
        gap = (logits(ours, x) - logits(theirs, x)).abs().max()
        assert gap < 1e-4 if renorm else gap > 1e-2
        if renorm:
            torch.testing.assert_close(cached_logits(ours, x), logits(theirs, x), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("gate_rows", [1, 0], ids=["gate-1xdim", "gate-dim"])
def test_a_qwen2moe_gguf_decodes_as_transformers_qwen2_moe_does_without_norm_topk_prob(gate_rows, tmp_path):
    """A qwen2moe GGUF (q/k/v biases, `qwen2moe.expert_feed_forward_length` the routed experts' width and
    `expert_shared_feed_forward_length` the shared expert's, its `_shexp` tensors, its gate `ffn_gate_inp_shexp`
    stored [1, dim] or llama.cpp's [dim]) gives transformers' Qwen2-MoE logits where norm_topk_prob is false:
    llama.cpp's qwen2moe graph never renormalises the k weights; the control: a renormalising checkpoint's own
    transformers logits differ."""
    from tests.models.test_hf_configs import moe_model

    for renorm in (False, True):
        theirs = moe_model("Qwen2MoeForCausalLM", norm_topk_prob=renorm)
        theirs.save_pretrained(tmp_path)
        loaded = load_hf_folder(tmp_path)
        state = {k: v.reshape(-1) if k.endswith("shared_expert_gate.weight") and not gate_rows else v
                 for k, v in loaded.state.items()}
        path = tmp_path / "qwen2moe.gguf"
        write_gguf(path, loaded.cfg, state, arch="qwen2moe", expert_count=4, expert_used_count=2,
                   expert_feed_forward_length=24, expert_shared_feed_forward_length=40)
        got = load_gguf(path)
        cfg = got.cfg
        assert (cfg.n_experts, cfg.experts_per_token, cfg.expert_renorm, cfg.ffn_dim, cfg.shared_expert_dim,
                cfg.qkv_bias) == (4, 2, False, 24, 40, True)
        ours = Transformer(got.cfg).eval()
        ours.load_state_dict(got.state)
        x = tokens(60)
        gap = (logits(ours, x) - logits(theirs, x)).abs().max()
        assert gap > 1e-2 if renorm else gap < 1e-4
        if not renorm:
            torch.testing.assert_close(cached_logits(ours, x), logits(theirs, x), atol=1e-4, rtol=1e-4)


def test_an_olmoe_gguf_decodes_as_transformers_olmoe(tmp_path):
    """An olmoe GGUF (NEOX RoPE: q/k rows in halves; `attn_q_norm` and `attn_k_norm` over the whole projections,
    [dim] each as llama.cpp shapes them, one key/value head a query head; experts of the feed-forward length, never
    renormalised, as llama.cpp's olmoe graph) gives transformers' OLMoE logits, uncached and cached, and so does the
    `hf` row's export of it; an `olmoe.expert_weights_norm` of false, the graph's, loads. Control: its q/k norms read
    per head (Qwen3's span) are visibly wrong."""
    from tests.models.test_hf_configs import block_controls, moe_model

    theirs = moe_model("OlmoeForCausalLM", num_key_value_heads=4)
    theirs.save_pretrained(tmp_path)
    loaded = load_hf_folder(tmp_path)
    path = tmp_path / "olmoe.gguf"
    write_gguf(path, loaded.cfg, loaded.state, arch="olmoe", expert_count=4, expert_used_count=2,
               expert_weights_norm=False)
    got = load_gguf(path)
    cfg = got.cfg
    assert (cfg.n_experts, cfg.experts_per_token, cfg.expert_renorm, cfg.ffn_dim, cfg.qk_norm_span) == (
        4, 2, False, 48, "all")
    ours = Transformer(got.cfg).eval()
    ours.load_state_dict(got.state)
    x = tokens(60)
    assert_same(ours, theirs, x)
    torch.testing.assert_close(cached_logits(ours, x), logits(theirs, x), atol=1e-4, rtol=1e-4)
    assert_same(to_hf(ours), theirs, x)
    assert (logits(block_controls(ours)["per_head_norms"], x) - logits(theirs, x)).abs().max() > 1e-2


@pytest.mark.parametrize("arch,norm", [("qwen2moe", True), ("olmoe", True), ("qwen3moe", False), ("llama", False)])
def test_an_expert_weights_norm_other_than_the_graphs_is_one_line(arch, norm, tmp_path):
    """`<arch>.expert_weights_norm`, which llama.cpp's llama, qwen2moe, qwen3moe and olmoe graphs never read (their
    norm_w is fixed: renormalised for llama and qwen3moe, not for qwen2moe and olmoe), is refused where it says
    otherwise than the graph: the file describes another model than llama.cpp runs."""
    from tests.models.test_hf_configs import moe_model

    hf_arch = {"qwen2moe": "Qwen2MoeForCausalLM", "olmoe": "OlmoeForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM",
               "llama": "MixtralForCausalLM"}[arch]
    moe_model(hf_arch).save_pretrained(tmp_path)
    loaded = load_hf_folder(tmp_path)
    width = dict(expert_feed_forward_length=24) if arch in ("qwen2moe", "qwen3moe") else {}
    shared = dict(expert_shared_feed_forward_length=40) if arch == "qwen2moe" else {}
    write_gguf(tmp_path / "n.gguf", loaded.cfg, loaded.state, arch=arch, expert_count=4, expert_used_count=2,
               expert_weights_norm=norm, **width, **shared)
    never = "never" if norm else "always"
    with pytest.raises(UsageError, match=f"^GGUF file n.gguf sets {arch}.expert_weights_norm={str(norm).lower()}: "
                                         f"llama.cpp's {arch} graph {never} renormalises the k expert weights"):
        load_gguf(tmp_path / "n.gguf")


def test_a_mixtral_gguf_decodes_as_transformers_mixtral(tmp_path):
    """A Mixtral GGUF as llama.cpp's converter writes one (llama, `llama.expert_count` and `expert_used_count`, the
    router `ffn_gate_inp`, each layer's experts stacked [E, out, in] in `ffn_{gate,up,down}_exps`, q/k rows permuted)
    gives transformers' Mixtral logits (the k weights renormalised, as llama.cpp's llama graph does); control: a stack
    read with its experts reversed is visibly wrong."""
    from tests.models.test_hf_configs import moe_model

    theirs = moe_model("MixtralForCausalLM")
    theirs.save_pretrained(tmp_path)
    loaded = load_hf_folder(tmp_path)
    path = tmp_path / "mixtral.gguf"
    write_gguf(path, loaded.cfg, loaded.state, expert_count=4, expert_used_count=2)
    got = load_gguf(path)
    assert (got.cfg.n_experts, got.cfg.experts_per_token, got.cfg.expert_renorm) == (4, 2, True)
    ours = Transformer(got.cfg).eval()
    ours.load_state_dict(got.state)
    x = tokens(60)
    assert_same(ours, theirs, x)
    torch.testing.assert_close(cached_logits(ours, x), logits(theirs, x), atol=1e-4, rtol=1e-4)
    flip = lambda m: f"experts.{3 - int(m.group(1))}."  # noqa: E731 - expert j's weights under 3 - j
    flipped = {re.sub(r"experts\.(\d+)\.", flip, k): v for k, v in got.state.items()}
    ours.load_state_dict(flipped)
    assert (logits(ours, x) - logits(theirs, x)).abs().max() > 1e-2


@pytest.mark.parametrize("case,says", [("three-experts", "has shape \\[3, 32\\]; its config gives \\[4, 32\\]"),
                                       ("no-used-count", "^GGUF file bad.gguf lacks llama.expert_used_count$")])
def test_a_mixtral_gguf_with_stacks_of_other_experts_or_no_used_count_is_one_line(case, says, tmp_path):
    """A Mixtral GGUF whose tensors hold 3 experts where `llama.expert_count` says 4, or without
    `llama.expert_used_count` (llama.cpp requires it), is refused in one line."""
    from tests.models.test_hf_configs import moe_model

    moe_model("MixtralForCausalLM").save_pretrained(tmp_path)
    cfg, state = load_hf_folder(tmp_path).cfg, load_hf_folder(tmp_path).state
    if case == "three-experts":
        cfg = dataclasses.replace(cfg, n_experts=3)
        state = {k: v[:3] if k.endswith("gate.weight") else v for k, v in state.items() if ".experts.3." not in k}
    keys = dict(expert_count=4) | ({} if case == "no-used-count" else dict(expert_used_count=2))
    write_gguf(tmp_path / "bad.gguf", cfg, state, **keys)
    with pytest.raises(CheckpointError, match=says) as err:
        load_gguf(tmp_path / "bad.gguf")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("arch", ["dbrx", "deepseek2"])
def test_a_mixture_of_experts_gguf_other_than_mixtrals_is_refused_in_one_line(arch, tmp_path):
    """A routed GGUF of another architecture than llama (Mixtral's), a router `ffn_gate_inp` and 3-D expert stacks
    per layer, is refused in one line naming the key and where such models load (HF folders), never loaded with its
    experts dropped, even beside dense FFN tensors a dense reading would take."""
    theirs = hf_model("LlamaForCausalLM")
    theirs.save_pretrained(tmp_path)
    loaded = load_hf_folder(tmp_path)
    e, cfg = 4, loaded.cfg
    stacks = {f"blk.{i}.{name}": np.random.rand(*shape).astype(np.float32) for i in range(cfg.n_layers)
              for name, shape in (("ffn_gate_inp.weight", (e, cfg.dim)), ("ffn_gate_exps.weight", (e, 48, cfg.dim)),
                                  ("ffn_up_exps.weight", (e, 48, cfg.dim)), ("ffn_down_exps.weight", (e, cfg.dim, 48)))}
    path = tmp_path / "moe.gguf"
    write_gguf(path, cfg, loaded.state, stacks, arch=arch, expert_count=e, expert_used_count=2)
    with pytest.raises(UsageError, match=f"^GGUF file moe.gguf sets {arch}.expert_count=4: a mixture of experts; "
                                         "specgen loads routed GGUFs of llama, qwen3moe, qwen2moe, olmoe only$"):
        load_gguf(path)


def test_a_mixtral_gguf_with_scaled_expert_weights_is_one_line(tmp_path):
    """`llama.expert_weights_scale` (llama.cpp multiplies the k weights by it; other models' converters write it) is
    refused rather than dropped."""
    from tests.models.test_hf_configs import moe_model

    moe_model("MixtralForCausalLM").save_pretrained(tmp_path)
    loaded = load_hf_folder(tmp_path)
    write_gguf(tmp_path / "scaled.gguf", loaded.cfg, loaded.state, expert_count=4, expert_used_count=2,
               expert_weights_scale=2.5)
    with pytest.raises(UsageError, match="^GGUF file scaled.gguf sets llama.expert_weights_scale=2.5: scaled expert "
                                         "weights are not implemented$"):
        load_gguf(tmp_path / "scaled.gguf")
