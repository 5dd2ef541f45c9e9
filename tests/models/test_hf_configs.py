"""HF configs load exactly or are refused: for every implemented architecture / RoPE scaling, specgen's logits
(loaded through the HF folder loader) equal transformers' on the same saved folder, on sequences long enough for
the scaling to matter; every refused key is named by its one-line error."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from gguf import RopeScalingType

from tests.conftest import decode
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.errors import CheckpointError, ContextOverflowError, UsageError
from specgen.methods.text import EmptyDrafter
from specgen.models.hf_export import to_hf
from specgen.models.llama import hf_config, load_hf_folder
from specgen.models.transformer import Transformer

transformers = pytest.importorskip("transformers")

SHAPE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=100.0, max_position_embeddings=256)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}


def hf_model(arch: str, **over):
    """A random tiny transformers model with large weights (so RoPE differences show in the logits)."""
    config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    cfg = config_cls(**{**SHAPE, **over})
    cfg.architectures = [arch]
    torch.manual_seed(0)
    model = getattr(transformers, arch)(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0, 0.3)
    return model


def load(folder) -> Transformer:
    cfg, state = load_hf_folder(folder)
    model = Transformer(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and missing == (["output.weight"] if cfg.tie_embeddings else [])
    return model.eval()


def tokens(n: int) -> torch.Tensor:
    return torch.randint(0, 64, (1, n), generator=torch.Generator().manual_seed(1))


def logits(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        if isinstance(model, Transformer):
            return model(x, torch.arange(x.shape[1])[None])[0]
        return model(x).logits


def assert_same(ours, theirs, x):
    torch.testing.assert_close(logits(ours, x), logits(theirs, x), atol=1e-4, rtol=1e-4)


CASES = {  # name -> (architecture, config overrides, sequence length)
    "llama-head-dim": ("LlamaForCausalLM", dict(head_dim=16), 40),
    "llama-linear": ("LlamaForCausalLM", dict(rope_scaling={"rope_type": "linear", "factor": 4.0}), 96),
    "llama3": ("LlamaForCausalLM", dict(rope_scaling=LLAMA3), 96),
    "llama-yarn": ("LlamaForCausalLM", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                          "original_max_position_embeddings": 32}), 96),
    "llama-yarn-mscale": ("LlamaForCausalLM", dict(rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale": 0.8,
        "mscale_all_dim": 0.5, "beta_fast": 16, "beta_slow": 2}), 96),
    "llama-tied": ("LlamaForCausalLM", dict(tie_word_embeddings=True), 40),
    "qwen2": ("Qwen2ForCausalLM", dict(tie_word_embeddings=True), 64),
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=16), 64),
    "qwen3-llama3-rope": ("Qwen3ForCausalLM", dict(head_dim=8, rope_scaling=LLAMA3), 96),
    "mistral": ("MistralForCausalLM", dict(sliding_window=None), 64),
    "phi3": ("Phi3ForCausalLM", dict(pad_token_id=0), 64),  # fused q/k/v and gate/up products, GQA (SHAPE's)
}


@pytest.mark.parametrize("case", CASES)
def test_logits_equal_transformers(case, tmp_path):
    arch, over, n = CASES[case]
    theirs = hf_model(arch, **over)
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    assert ours.cfg.max_seq_len == 256
    assert_same(ours, theirs, tokens(n))
    assert_same(to_hf(ours), theirs, tokens(n))  # the `hf` benchmark row's export carries the same math
    if "rope_scaling" in over:  # the scaling matters at this length: unscaled RoPE is visibly wrong
        plain = Transformer(type(ours.cfg)(**{**ours.cfg.to_dict(), "rope_scaling": None}))
        plain.load_state_dict(ours.state_dict())
        assert (logits(plain.eval(), tokens(n)) - logits(theirs, tokens(n))).abs().max() > 1e-2


def test_legacy_rope_scaling_key_reads_the_same(tmp_path):
    """transformers 4.x configs: `rope_scaling` with `type`, `rope_theta` at the top level."""
    theirs = hf_model("LlamaForCausalLM", rope_scaling=LLAMA3)
    theirs.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    legacy = {k: v for k, v in raw.items() if k != "rope_parameters"}
    legacy["rope_scaling"] = {**{k: v for k, v in LLAMA3.items() if k != "rope_type"}, "type": "llama3"}
    legacy["rope_theta"] = raw["rope_parameters"]["rope_theta"]
    assert hf_config(legacy) == hf_config(raw)
    assert hf_config(raw).rope_scaling["original_max_position_embeddings"] == 32


def test_dynamic_ntk_is_exact_within_the_context(tmp_path):
    """Dynamic NTK changes nothing up to max_position_embeddings, which specgen's context never exceeds."""
    theirs = hf_model("LlamaForCausalLM", max_position_embeddings=48,
                      rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    assert ours.cfg.max_seq_len == 48 and ours.cfg.rope_scaling is None
    assert_same(ours, theirs, tokens(48))
    with pytest.raises(ContextOverflowError):
        logits(ours, tokens(49))


@pytest.mark.parametrize("arch,over", [
    ("MistralForCausalLM", dict(sliding_window=24)),
    ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=24, max_window_layers=1)),
    ("Phi3ForCausalLM", dict(sliding_window=24, pad_token_id=0)),  # Phi-3-mini-4k's 2047, every layer
])
def test_sliding_window_caps_the_context(arch, over, tmp_path):
    """Below its window sliding attention is full attention: the context is capped there, longer is refused."""
    theirs = hf_model(arch, **over)
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    assert ours.cfg.max_seq_len == 24
    assert_same(ours, theirs, tokens(24))
    with pytest.raises(ContextOverflowError):
        logits(ours, tokens(25))


def test_longrope_loads_its_short_factors_and_caps_the_context_at_the_original(tmp_path):
    """Phi-3.5-mini and Phi-3-128k (LongRoPE) were refused: transformers uses their short factors (and LongRoPE's
    attention factor) while a sequence is within original_max_position_embeddings, and switches every position to the
    long factors past it. So they load with the short factors and that context (the entry records its own)."""
    longrope = {"rope_type": "longrope", "short_factor": [1.0, 1.5, 3.0, 6.0], "long_factor": [1.0, 2.0, 8.0, 16.0]}
    theirs = hf_model("Phi3ForCausalLM", pad_token_id=0, rope_scaling=longrope, original_max_position_embeddings=32)
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    assert ours.cfg.max_seq_len == 32 and ours.cfg.rope_scaling["attention_factor"] == math.sqrt(1 + math.log(8) /
                                                                                                 math.log(32))
    assert_same(ours, theirs, tokens(32))
    assert_same(to_hf(ours), theirs, tokens(32))
    with pytest.raises(ContextOverflowError):
        logits(ours, tokens(33))
    # control: the long factors' table is another model within the original context
    wrong = Transformer(dataclasses.replace(ours.cfg, rope_scaling={**ours.cfg.rope_scaling,
                                                                    "short_factor": longrope["long_factor"]})).eval()
    wrong.load_state_dict(ours.state_dict())
    assert not torch.allclose(logits(wrong, tokens(32)), logits(theirs, tokens(32)), atol=1e-2)


def test_a_fused_product_that_does_not_split_as_its_config_says_is_named(tmp_path):
    """Phi-3's gate_up_proj holds 2 x intermediate_size rows: a config.json that disagrees is one line naming the
    tensor, not a shape error from deep inside a load."""
    hf_model("Phi3ForCausalLM", pad_token_id=0).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "intermediate_size": 40}))
    with pytest.raises(CheckpointError, match="gate_up_proj.weight has 96 rows; its config gives 80"):
        load_hf_folder(tmp_path)


def test_qwen2_window_unused_when_sliding_is_off():
    raw = {**SHAPE, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False, "sliding_window": 16}
    assert hf_config(raw).max_seq_len == 256
    raw |= {"use_sliding_window": True, "max_window_layers": 2}  # no layer at or past max_window_layers
    assert hf_config(raw).max_seq_len == 256


def test_context_above_the_cap_is_capped_and_refused_beyond():
    raw = {**SHAPE, "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 131072}
    assert hf_config(raw).max_seq_len == 8192


def test_greedy_decode_equals_transformers_greedy(tmp_path):
    """AR through specgen's decode loop (KV cache) on a Llama 3 scaled checkpoint equals transformers' greedy
    continuation (full forwards)."""
    theirs = hf_model("LlamaForCausalLM", rope_scaling=LLAMA3)
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    prompt = tokens(40)
    got = decode(ModelTarget(ours), EmptyDrafter(), prompt[0].tolist(), 8, SamplingParams()).tokens
    seq = prompt
    for _ in range(8):
        seq = torch.cat([seq, logits(theirs, seq)[:, -1:].argmax(-1)], 1)
    assert list(got) == seq[0, 40:].tolist()


def raw_llama(**over) -> dict:
    return {**SHAPE, "architectures": ["LlamaForCausalLM"], **over}


@pytest.mark.parametrize("over,named", [
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (dict(quantization_config={"quant_method": "fp8"}), "quantization_config"),
    (dict(rope_scaling={"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}), "short_factor"),
    (dict(rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 4}), "long_factor"),
    (dict(rope_scaling={"type": "su"}), "rope_type"),
    (dict(rope_parameters={"full_attention": {"rope_type": "default"}}), "rope_parameters"),
    (dict(rope_scaling={"rope_type": "linear"}), "factor"),
    (dict(architectures=["GemmaForCausalLM"]), "GemmaForCausalLM"),
    (dict(architectures=["Qwen3ForCausalLM"], attention_bias=True), "attention_bias"),
    (dict(architectures=["Qwen2ForCausalLM"], layer_types=["full_attention", "chunked_attention"]), "layer_types"),
])
def test_refusals_name_the_key(over, named):
    with pytest.raises(UsageError) as err:
        hf_config(raw_llama(**over))
    message = str(err.value)
    assert named in message and "\n" not in message


def test_untied_checkpoint_without_head_is_refused(tmp_path):
    theirs = hf_model("LlamaForCausalLM", tie_word_embeddings=True)
    theirs.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "tie_word_embeddings": False}))
    with pytest.raises(CheckpointError, match="tie_word_embeddings"):
        load_hf_folder(tmp_path)


def test_a_tied_config_with_a_different_stored_head_loads_the_stored_head_as_transformers_does(tmp_path):
    """Issue 48: tie_word_embeddings=true beside an lm_head.weight that differs from the embedding: transformers
    keeps the stored head (untied), so specgen must too; an equal copy stays tied."""
    from safetensors.torch import load_file, save_file

    theirs = hf_model("LlamaForCausalLM", tie_word_embeddings=True)
    theirs.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    state["lm_head.weight"] = torch.randn_like(state["model.embed_tokens.weight"])
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    cfg, ours = load_hf_folder(tmp_path)
    assert not cfg.tie_embeddings and torch.equal(ours["output.weight"], state["lm_head.weight"])
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(loaded.lm_head.weight, state["lm_head.weight"])
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    assert load_hf_folder(tmp_path)[0].tie_embeddings


def test_tensor_the_model_would_ignore_is_refused(tmp_path):
    """A Qwen3 checkpoint labelled Qwen2 carries q/k norms a Qwen2 model lacks: refused, not dropped."""
    theirs = hf_model("Qwen3ForCausalLM", head_dim=8)
    theirs.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(CheckpointError, match="_norm.weight"):
        load_hf_folder(tmp_path)


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
    """A GGUF of specgen weights in HF's rotate-half layout, as llama.cpp's converter writes one: for `llama`, q and k
    rows permuted to interleaved rotary pairs (`qwen2`, `qwen3`, `phi3` keep the halves; `phi3` fuses q, k, v into
    attn_qkv and gate, up into ffn_up); `extra` tensors (name -> float32 array) besides; `keys`: more metadata, by the
    writer's `add_<key>` (sliding_window=4, rope_scaling_type="yarn", ...)."""
    from gguf import GGUFWriter

    from specgen.models.llama import layer_map

    w = GGUFWriter(str(path), arch)
    for key, value in dict(block_count=cfg.n_layers, context_length=cfg.max_seq_len, embedding_length=cfg.dim,
                           feed_forward_length=cfg.ffn_dim, head_count=cfg.n_heads, head_count_kv=cfg.n_kv_heads,
                           layer_norm_rms_eps=cfg.norm_eps, rope_freq_base=cfg.rope_theta, key_length=cfg.hd,
                           value_length=cfg.hd).items():
        getattr(w, f"add_{key}")(value)
    for key, value in keys.items():
        getattr(w, f"add_{key}")(value)
    sizes = [cfg.n_heads * cfg.hd] + [cfg.n_kv_heads * cfg.hd] * 2
    tensors = {}  # GGUF name -> tensor
    for ours, theirs in layer_map(cfg, "gguf").items():
        tensors |= dict(zip(theirs, state[ours].split(sizes) if len(theirs) == 3 else (state[ours],)))
    if arch == "phi3":
        for i in range(cfg.n_layers):
            b = f"blk.{i}."
            tensors[b + "attn_qkv.weight"] = torch.cat([tensors.pop(b + f"attn_{x}.weight") for x in "qkv"])
            tensors[b + "ffn_up.weight"] = torch.cat([tensors.pop(b + "ffn_gate.weight"), tensors[b + "ffn_up.weight"]])
    for name, t in tensors.items():
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):  # halves -> pairs
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
    import numpy as np

    from specgen.models.llama import load_gguf

    theirs = hf_model("LlamaForCausalLM", rope_scaling=LLAMA3, tie_word_embeddings=False)
    theirs.save_pretrained(tmp_path / "hf")
    cfg, state = load_hf_folder(tmp_path / "hf")
    factors = llama3_factors(cfg.hd, cfg.rope_theta, LLAMA3)
    assert factors[0] == 1 and 1 < factors[1] < 8 and factors[-1] == 8  # every band of the scaling is tested
    write_gguf(tmp_path / "l3.gguf", cfg, state, {"rope_freqs.weight": np.array(factors, dtype=np.float32)})
    write_gguf(tmp_path / "plain.gguf", cfg, state)
    models = {}
    for name in ("l3", "plain"):
        got_cfg, got_state = load_gguf(tmp_path / f"{name}.gguf")
        models[name] = Transformer(got_cfg).eval()
        models[name].load_state_dict(got_state)
    assert models["l3"].cfg.rope_scaling == {"rope_type": "factors",
                                             "factors": np.array(factors, dtype=np.float32).tolist()}
    x = tokens(96)  # past original_max_position_embeddings (32): the scaling shows
    assert_same(models["l3"], theirs, x)
    assert_same(to_hf(models["l3"]), theirs, x)
    assert not torch.allclose(logits(models["plain"], x), logits(theirs, x), atol=1e-2)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "phi3"])
def test_a_qwen_or_phi3_gguf_decodes_as_transformers_model(arch, tmp_path):
    """Qwen2 (q/k/v biases), Qwen3 (per-head q and k norms, a head size that is not hidden / heads) and Phi-3 GGUFs
    (fused attn_qkv and ffn_up: gate, then up) give the logits transformers' model of the same weights gives (Qwen3
    and Phi-3 were refused as unsupported architectures before)."""
    from specgen.models.llama import load_gguf

    hf_arch, over = {"qwen2": ("Qwen2ForCausalLM", {}), "qwen3": ("Qwen3ForCausalLM", dict(head_dim=16)),
                     "phi3": ("Phi3ForCausalLM", dict(pad_token_id=0))}[arch]
    theirs = hf_model(hf_arch, tie_word_embeddings=False, **over)
    theirs.save_pretrained(tmp_path / "hf")
    cfg, state = load_hf_folder(tmp_path / "hf")
    write_gguf(tmp_path / "q.gguf", cfg, state, arch=arch)
    seen = []  # the progress callback: each stored tensor converted once, a fused one too
    got_cfg, got_state = load_gguf(tmp_path / "q.gguf", lambda i, n: seen.append((i, n)))
    assert seen == [(i, seen[0][1]) for i in range(1, seen[0][1] + 1)]
    ours = Transformer(got_cfg).eval()
    ours.load_state_dict(got_state)
    assert (got_cfg.qk_norm, got_cfg.qkv_bias, got_cfg.hd) == {"qwen2": (False, True, 8), "qwen3": (True, False, 16),
                                                               "phi3": (False, False, 8)}[arch]
    assert_same(ours, theirs, tokens(40))


@pytest.mark.parametrize("window,context", [(None, 256), (100, 100), (4096, 256), (0, None)])
def test_a_gguf_sliding_window_caps_the_context_as_an_hf_folders_does(window, context, tmp_path):
    """A GGUF naming a sliding window (Mistral's) was refused; below the window every key is in it, so the context is
    capped there, as for an HF folder, and the model is the same; a window that is no positive count is refused."""
    from specgen.models.llama import load_gguf

    theirs = hf_model("LlamaForCausalLM", tie_word_embeddings=False)
    theirs.save_pretrained(tmp_path / "hf")
    cfg, state = load_hf_folder(tmp_path / "hf")
    write_gguf(tmp_path / "w.gguf", cfg, state, **({} if window is None else dict(sliding_window=window)))
    if context is None:
        with pytest.raises(UsageError, match="sliding_window=0: not a positive window"):
            load_gguf(tmp_path / "w.gguf")
        return
    got_cfg, got_state = load_gguf(tmp_path / "w.gguf")
    ours = Transformer(got_cfg).eval()
    ours.load_state_dict(got_state)
    assert got_cfg.max_seq_len == context
    assert_same(ours, theirs, tokens(40))


@pytest.mark.parametrize("factors", [[1.0, 2.0], [1.0, 0.0, 8.0, 8.0], [1.0, float("nan"), 8.0, 8.0]])
def test_rope_freqs_of_another_length_or_not_positive_are_refused(factors, tmp_path):
    import numpy as np

    from specgen.models.llama import load_gguf

    theirs = hf_model("LlamaForCausalLM")
    theirs.save_pretrained(tmp_path / "hf")
    cfg, state = load_hf_folder(tmp_path / "hf")
    write_gguf(tmp_path / "bad.gguf", cfg, state, {"rope_freqs.weight": np.array(factors, dtype=np.float32)})
    with pytest.raises(CheckpointError, match="bad.gguf: RoPE factors must be a list of 4 positive finite numbers"):
        load_gguf(tmp_path / "bad.gguf")


@pytest.mark.parametrize("kind", ["linear", "yarn"])
def test_a_gguf_rope_scaling_loads_as_the_hf_config_it_came_from(kind, tmp_path):
    """A GGUF's rope.scaling keys (linear; YaRN with llama.cpp's defaults, which are transformers') were refused: they
    now give the rope_scaling the HF config they were converted from gives, and transformers' logits."""
    from specgen.models.llama import load_gguf

    scaling = {"rope_type": kind, "factor": 4.0, **({"original_max_position_embeddings": 32} if kind == "yarn" else {})}
    theirs = hf_model("LlamaForCausalLM", rope_scaling=scaling, tie_word_embeddings=False)
    theirs.save_pretrained(tmp_path / "hf")
    cfg, state = load_hf_folder(tmp_path / "hf")
    keys = dict(rope_scaling_type=RopeScalingType(kind), rope_scaling_factor=4.0)
    write_gguf(tmp_path / "s.gguf", cfg, state, **keys, **({"rope_scaling_orig_ctx_len": 32} if kind == "yarn" else {}))
    got_cfg, got_state = load_gguf(tmp_path / "s.gguf")
    assert got_cfg.rope_scaling == cfg.rope_scaling
    ours = Transformer(got_cfg).eval()
    ours.load_state_dict(got_state)
    assert_same(ours, theirs, tokens(96))


def test_a_phi3_longrope_gguf_loads_as_its_hf_folder(tmp_path):
    """Phi-3.5-mini's GGUF as llama.cpp's converter writes it: the short and long factors as tensors, the attention
    factor it computed and the original context as keys (no scaling type); the same table and context as the HF
    folder's, transformers' logits."""
    import numpy as np

    from specgen.models.llama import load_gguf

    longrope = {"rope_type": "longrope", "short_factor": [1.0, 1.5, 3.0, 6.0], "long_factor": [1.0, 2.0, 8.0, 16.0]}
    theirs = hf_model("Phi3ForCausalLM", pad_token_id=0, rope_scaling=longrope, original_max_position_embeddings=32,
                      tie_word_embeddings=False)
    theirs.save_pretrained(tmp_path / "hf")
    cfg, state = load_hf_folder(tmp_path / "hf")
    tensors = {f"rope_factors_{x}.weight": np.array(longrope[f"{x}_factor"], dtype=np.float32)
               for x in ("short", "long")}
    write_gguf(tmp_path / "p.gguf", dataclasses.replace(cfg, max_seq_len=256), state, tensors, arch="phi3",
               rope_scaling_attn_factors=math.sqrt(1 + math.log(256 / 32) / math.log(32)), rope_scaling_orig_ctx_len=32)
    got_cfg, got_state = load_gguf(tmp_path / "p.gguf")
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
    from specgen.models.llama import load_gguf

    hf_model("LlamaForCausalLM", tie_word_embeddings=False).save_pretrained(tmp_path / "hf")
    cfg, state = load_hf_folder(tmp_path / "hf")
    write_gguf(tmp_path / "s.gguf", cfg, state, **keys)
    with pytest.raises(UsageError, match=f"s.gguf sets llama.{needle}, which specgen's GGUF loader does not map"):
        load_gguf(tmp_path / "s.gguf")


def test_a_truncated_gguf_says_so(tmp_path):
    """A GGUF cut short (an interrupted download) was 'cannot reshape array of size 3214336 into shape (49152,612)'."""
    import numpy as np
    from gguf import GGUFWriter

    from specgen.models.llama import load_gguf

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


def test_registry_import_keeps_the_math(tmp_path, specgen_home):
    """`registry import` of a Qwen3 folder with YaRN: the registry entry rebuilds the same model (its config.json
    carries qk_norm and rope_scaling) and records the checkpoint's own context when specgen's is capped."""
    from specgen import checkpoints
    from specgen.importer import import_checkpoint

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    theirs = hf_model("Qwen3ForCausalLM", head_dim=8, rope_scaling=yarn, max_position_embeddings=32768)
    theirs.save_pretrained(tmp_path / "qwen3")
    entry = import_checkpoint(tmp_path / "qwen3", "tiny-qwen3")
    assert entry.meta["source_context"] == 32768 and entry.meta["kwargs"]["max_seq_len"] == 8192
    ours = checkpoints.load_module(checkpoints.find("target/tiny-qwen3")).eval()
    assert ours.cfg.qk_norm and ours.cfg.rope_scaling["rope_type"] == "yarn"
    assert_same(ours, theirs, tokens(96))
