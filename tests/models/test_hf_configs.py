"""HF configs load exactly or are refused: for every implemented architecture / RoPE scaling, specgen's logits
(loaded through the HF folder loader) equal transformers' on the same saved folder, on sequences long enough for
the scaling to matter; every refused key is named by its one-line error."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch

from tests.conftest import decode
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.target import ModelTarget
from specgen.errors import CheckpointError, ContextOverflowError, UsageError
from specgen.methods.text import EmptyDrafter
from specgen.models.hf_export import to_hf
from specgen.models.llama import HF_ARCHITECTURES, hf_config, load_hf_folder
from specgen.models.transformer import Transformer, TransformerConfig

transformers = pytest.importorskip("transformers")

SHAPE = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=100.0, max_position_embeddings=256)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
# SmolLM3 over 4 layers: its class defaults make layer 3 NoPE; token ids inside the tiny vocabulary
SMOLLM3 = dict(num_hidden_layers=4, pad_token_id=0, bos_token_id=0, eos_token_id=0)


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
    loaded = load_hf_folder(folder)
    cfg, state = loaded.cfg, loaded.state
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
    # Phi-4-mini's partial RoPE: 12 of a head's 16 dims rotate
    "phi4-partial-rope": ("Phi3ForCausalLM", dict(pad_token_id=0, hidden_size=64, partial_rotary_factor=0.75), 64),
    "smollm3": ("SmolLM3ForCausalLM", SMOLLM3, 64),  # layer 3 without RoPE (no_rope_layer_interval 4), tied
    "smollm3-nope-pattern": ("SmolLM3ForCausalLM", dict(SMOLLM3, no_rope_layers=[0, 1, 0, 1], tie_word_embeddings=False,
                                                        rope_scaling=LLAMA3), 96),
}
# a TransformerConfig field a case sets -> its plain value: loaded with it the case's logits are visibly wrong
CONTROLS = {"rope_scaling": None, "rope_dim": 0, "nope_layers": ()}


@pytest.mark.parametrize("case", CASES)
def test_logits_equal_transformers(case, tmp_path):
    arch, over, n = CASES[case]
    theirs = hf_model(arch, **over)
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    assert ours.cfg.max_seq_len == 256
    assert_same(ours, theirs, tokens(n))
    assert_same(to_hf(ours), theirs, tokens(n))  # the `hf` benchmark row's export carries the same math
    assert ours.cfg.nope_layers == {"smollm3": (3,), "smollm3-nope-pattern": (0, 2)}.get(case, ())
    for field, plain in CONTROLS.items():  # controls: without the scaling (it matters at this length), rotating
        if getattr(ours.cfg, field) != plain:  # whole heads, or RoPE in every layer, is visibly wrong
            wrong = Transformer(dataclasses.replace(ours.cfg, **{field: plain}))
            wrong.load_state_dict(ours.state_dict())
            assert (logits(wrong.eval(), tokens(n)) - logits(theirs, tokens(n))).abs().max() > 1e-2


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


def cached_logits(model: Transformer, x: torch.Tensor, chunks=(13, 1, 1, 7, 2, 30)) -> torch.Tensor:
    """The logits [1, N, V] of x [1, N] fed through a KV cache in chunks (the last one takes the rest): a prompt,
    single steps and chains, each over the committed slots (the list kernel's plans on a CPU)."""
    cache, out, at = model.new_cache(1, x.shape[1]), [], 0
    with torch.no_grad():
        for i, n in enumerate(chunks):
            n = x.shape[1] - at if i == len(chunks) - 1 else n
            out.append(model(x[:, at : at + n], torch.arange(at, at + n)[None], cache)[0])
            cache.commit(0, list(range(n)))
            at += n
    return torch.cat(out, 1)


def assert_exact_and_exported(ours: Transformer, theirs, x: torch.Tensor, cls: str) -> None:
    """`ours` gives `theirs`' logits on x, uncached and through its cache in chunks, and its `to_hf` export (the `hf`
    benchmark rows') is transformers' `cls` with the same logits."""
    assert_same(ours, theirs, x)
    torch.testing.assert_close(cached_logits(ours, x), logits(theirs, x), atol=1e-4, rtol=1e-4)
    exported = to_hf(ours)
    assert type(exported).__name__ == cls
    assert_same(exported, theirs, x)


def assert_windowed(ours: Transformer, theirs, n: int = 80) -> None:
    """Over n tokens (several windows) specgen's logits equal transformers' uncached, through a cache and from its
    `hf` export; control: the same model without its window differs (> 1e-2), so the window is what matched."""
    x = tokens(n)
    assert_same(ours, theirs, x)
    torch.testing.assert_close(cached_logits(ours, x), logits(theirs, x), atol=1e-4, rtol=1e-4)
    assert_same(to_hf(ours), theirs, x)
    unwindowed = dataclasses.replace(ours.cfg, window=0, local_layers=ours.cfg.local_layers
                                     if ours.cfg.local_rope_theta else ())
    wrong = Transformer(unwindowed).eval()
    wrong.load_state_dict(ours.state_dict())
    assert (logits(wrong, x) - logits(theirs, x)).abs().max() > 1e-2


@pytest.mark.parametrize("arch,over", [
    ("MistralForCausalLM", dict(sliding_window=8)),
    ("Qwen2ForCausalLM", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)),  # layer 1 slides
    ("Qwen3ForCausalLM", dict(use_sliding_window=True, sliding_window=8, num_hidden_layers=3,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    ("Phi3ForCausalLM", dict(sliding_window=8, pad_token_id=0)),  # Phi-3-mini-4k's 2047, every layer
    ("SmolLM3ForCausalLM", dict(SMOLLM3, use_sliding_window=True, sliding_window=8)),  # its NoPE layer slides
])
def test_sliding_layers_slide_as_transformers(arch, over, tmp_path):
    """The layers each class slides attend over their window (a query at p sees keys p - window + 1 .. p), the others
    over everything; the context is the checkpoint's, no longer capped at the window."""
    theirs = hf_model(arch, **over)
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    kinds = theirs.config.layer_types if hasattr(theirs.config, "layer_types") else ["sliding_attention"] * 2
    assert ours.cfg.max_seq_len == 256 and ours.cfg.window == 8
    assert ours.cfg.local_layers == tuple(i for i, kind in enumerate(kinds) if kind == "sliding_attention")
    assert_windowed(ours, theirs)


@pytest.mark.parametrize("partial", [{}, dict(hidden_size=64, partial_rotary_factor=0.5)])  # Phi-4-mini's kind
def test_longrope_loads_its_short_factors_and_caps_the_context_at_the_original(partial, tmp_path):
    """Phi-3.5-mini and Phi-3-128k (LongRoPE) were refused: transformers uses their short factors (and LongRoPE's
    attention factor) while a sequence is within original_max_position_embeddings, and switches every position to the
    long factors past it. So they load with the short factors and that context (the entry records its own). With
    partial RoPE (Phi-4-mini) the factors are the rotary dims' and the attention factor scales only them."""
    longrope = {"rope_type": "longrope", "short_factor": [1.0, 1.5, 3.0, 6.0], "long_factor": [1.0, 2.0, 8.0, 16.0]}
    theirs = hf_model("Phi3ForCausalLM", pad_token_id=0, rope_scaling=longrope, original_max_position_embeddings=32,
                      **partial)
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


@pytest.mark.parametrize("name,shape", [("model.layers.1.mlp.down_proj.weight", [32, 40]),  # imported, broken
                                        ("model.layers.0.self_attn.k_proj.weight", [16, 16]),  # a RuntimeError
                                        ("model.norm.weight", [33])])
def test_a_tensor_of_another_shape_than_its_config_gives_is_named(name, shape, tmp_path):
    """A tensor cut to another shape than config.json gives it was imported into an entry that failed at its first
    use (or, among q/k/v, was torch.cat's bare 'Sizes of tensors must match'): now one line naming it."""
    from safetensors.torch import load_file, save_file

    hf_model("LlamaForCausalLM").save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    state[name] = torch.zeros(shape)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    want = {"model.layers.1.mlp.down_proj.weight": [32, 48], "model.layers.0.self_attn.k_proj.weight": [16, 32],
            "model.norm.weight": [32]}[name]
    with pytest.raises(CheckpointError) as err:
        load_hf_folder(tmp_path)
    assert str(err.value) == f"{tmp_path.name}: tensor {name} has shape {shape}; its config gives {want}"


def test_a_fused_product_that_does_not_split_as_its_config_says_is_named(tmp_path):
    """Phi-3's gate_up_proj holds 2 x intermediate_size rows: a config.json that disagrees is one line naming the
    tensor, not a shape error from deep inside a load."""
    hf_model("Phi3ForCausalLM", pad_token_id=0).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "intermediate_size": 40}))
    with pytest.raises(CheckpointError, match=r"tensor model.layers.0.mlp.gate_up_proj.weight has shape \[96, 32\]; "
                                              r"its config gives \[80, 32\]"):
        load_hf_folder(tmp_path)


def test_qwen2_window_unused_when_sliding_is_off():
    raw = {**SHAPE, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False, "sliding_window": 16}
    assert (hf_config(raw).window, hf_config(raw).local_layers) == (0, ())
    raw |= {"use_sliding_window": True, "max_window_layers": 2}  # no layer at or past max_window_layers
    assert (hf_config(raw).window, hf_config(raw).local_layers) == (0, ())


def test_context_above_the_cap_is_capped_and_refused_beyond():
    raw = {**SHAPE, "architectures": ["LlamaForCausalLM"], "max_position_embeddings": 131072}
    assert hf_config(raw).max_seq_len == 8192


# a checkpoint to decode greedily: Llama 3 scaled; SmolLM3 with NoPE layers; Gemma 3 and Gemma 2 (capped) past their
# window (a 40-token prompt, window 16)
GREEDY = {"llama3": lambda: hf_model("LlamaForCausalLM", rope_scaling=LLAMA3),
          "smollm3": lambda: hf_model("SmolLM3ForCausalLM", **dict(SMOLLM3, no_rope_layers=[1, 0, 1, 0])),
          "gemma3": lambda: gemma3_model(**GEMMA3_CASES["gemma3-linear"]),
          "gemma2": lambda: gemma2_model()}


@pytest.mark.parametrize("case", GREEDY)
def test_greedy_decode_equals_transformers_greedy(case, tmp_path):
    """AR through specgen's decode loop (KV cache, native CPU attention) equals transformers' greedy continuation
    (full forwards)."""
    theirs = GREEDY[case]()
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
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),  # transformers' Llama: not partial RoPE
    (dict(architectures=["Phi3ForCausalLM"], partial_rotary_factor=0.4), "partial_rotary_factor"),  # 3 of 8 dims
    (dict(quantization_config={"quant_method": "fp8"}), "quantization_config"),
    (dict(rope_scaling={"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}), "short_factor"),
    (dict(rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 4}), "long_factor"),
    (dict(rope_scaling={"type": "su"}), "short_factor"),  # LongRoPE's first name
    (dict(rope_scaling={"type": "ntk-by-parts"}), "rope_type"),
    (dict(rope_parameters={"full_attention": {"rope_type": "default"}}), "rope_parameters"),
    (dict(rope_scaling={"rope_type": "linear"}), "factor"),
    *[(dict(architectures=["GemmaForCausalLM"], **{key: value}), key)
      for key, value in (("attention_bias", True), ("use_bidirectional_attention", True), ("hidden_act", "silu"))],
    *[(dict(architectures=["Gemma2ForCausalLM"], **{key: value}), key)
      for key, value in (("use_bidirectional_attention", True), ("attention_bias", True),
                         ("hidden_activation", "gelu"), ("hidden_activation", "silu"))],
    (dict(architectures=["Gemma2ForCausalLM"], sliding_window=None), "sliding_window"),
    (dict(architectures=["Gemma2ForCausalLM"], layer_types=["full_attention", "chunked_attention"]), "layer_types"),
    (dict(architectures=["Gemma3ForConditionalGeneration"]), "import a text-only one (Gemma3ForCausalLM"),
    *[(dict(architectures=["Gemma3ForCausalLM"], **{key: value}), key)
      for key, value in (("use_bidirectional_attention", True), ("attention_bias", True),
                         ("attn_logit_softcapping", 50.0), ("hidden_activation", "gelu"),
                         ("hidden_activation", "silu"))],
    (dict(architectures=["Gemma3ForCausalLM"], rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
     "rope_parameters"),  # flat: Gemma 3 reads one dict per layer kind
    (dict(architectures=["Gemma3ForCausalLM"], rope_parameters={"sliding_attention": {
        "rope_type": "linear", "factor": 2.0}}), "rope_parameters.sliding_attention.rope_type"),
    (dict(architectures=["Gemma3ForCausalLM"], rope_parameters={"full_attention": {
        "rope_type": "default", "partial_rotary_factor": 0.5}}), "partial_rotary_factor"),
    (dict(architectures=["Gemma3ForCausalLM"], rope_parameters={"full_attention": {"rope_type": "ntk-by-parts"}}),
     "rope_type"),
    (dict(architectures=["Gemma3ForCausalLM"], sliding_window=None), "sliding_window"),
    (dict(architectures=["Qwen3ForCausalLM"], attention_bias=True), "attention_bias"),
    *[(dict(architectures=["Olmo2ForCausalLM"], **{key: value}), key)
      for key, value in (("attention_bias", True), ("hidden_act", "gelu"))],
    *[(dict(architectures=["GraniteForCausalLM"], **{key: value}), key)
      for key, value in (("attention_bias", True), ("mlp_bias", True), ("hidden_act", "gelu"))],
    (dict(architectures=["Qwen2ForCausalLM"], layer_types=["full_attention", "chunked_attention"]), "layer_types"),
    (dict(architectures=["SmolLM3ForCausalLM"], attention_bias=True), "attention_bias"),
    (dict(architectures=["SmolLM3ForCausalLM"], mlp_bias=True), "mlp_bias"),
    (dict(architectures=["SmolLM3ForCausalLM"], layer_types=["full_attention", "chunked_attention"]), "layer_types"),
    (dict(architectures=["SmolLM3ForCausalLM"], layer_types=["full_attention", "sliding_attention"]),
     "sliding_window"),  # a sliding layer without a window: transformers fails to build its mask
])
def test_refusals_name_the_key(over, named):
    with pytest.raises(UsageError) as err:
        hf_config(raw_llama(**over))
    message = str(err.value)
    assert named in message and "\n" not in message


@pytest.mark.parametrize("over,says", [
    (dict(num_attention_heads="4"), 'num_attention_heads="4": not a positive integer'),
    (dict(vocab_size=None), "vocab_size=null: not a positive integer"),
    (dict(num_key_value_heads=0), "num_key_value_heads=0: not a positive integer"),
    (dict(num_hidden_layers=True), "num_hidden_layers=true: not a positive integer"),
    (dict(intermediate_size=48.0), "intermediate_size=48.0: not a positive integer"),
    (dict(max_position_embeddings=-1), "max_position_embeddings=-1: not a positive integer"),
    (dict(rms_norm_eps="x"), 'rms_norm_eps="x": not a positive number'),
    (dict(rope_theta="x"), 'rope_theta="x": not a positive number'),
    (dict(rope_parameters={"rope_type": "default", "rope_theta": -1}), "rope_theta=-1: not a positive number"),
    (dict(num_key_value_heads=3), "num_attention_heads=4 over num_key_value_heads=3: the query heads do not share "
                                  "the key/value heads evenly"),
    *[(dict(architectures=["GraniteForCausalLM"], **{key: value}), f"{key}={json.dumps(value)}: not a positive number")
      for key, value in (("embedding_multiplier", 0), ("attention_multiplier", -0.1), ("residual_multiplier", None),
                         ("logits_scaling", "8"))],
    *[(dict(architectures=["SmolLM3ForCausalLM"], no_rope_layers=marks), f"no_rope_layers={json.dumps(marks)}: not "
       "one 0 (no RoPE) or 1 (RoPE) for each of its 2 layers") for marks in ([1, 0, 1], [1], [1, 2], [True, 0], "10")],
    *[(dict(architectures=["SmolLM3ForCausalLM"], no_rope_layer_interval=interval),
       f"no_rope_layer_interval={json.dumps(interval)}: not a positive integer") for interval in (0, "4", None)],
    # layer_types of another length than the layers, or not a list of kinds: Qwen2's and SmolLM3's took the layers
    # it marked (a short list slid fewer layers than it names, where transformers refuses the config), a string's
    # refusal named its characters
    *[(dict(architectures=[arch], use_sliding_window=True, sliding_window=4, layer_types=kinds),
       f"layer_types={json.dumps(kinds)}: not one kind for each of its 2 layers")
      for arch in ("Qwen2ForCausalLM", "SmolLM3ForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM")
      for kinds in (["sliding_attention"], ["full_attention"] * 3, "sliding_attention", [["sliding_attention"]] * 2)],
    # a cap of 0 or less would divide by 0 or flip the scores; a string would break at the entry's first use
    *[(dict(architectures=[arch], **{key: value}), f"{key}={json.dumps(value)}: not a positive number")
      for arch, key, value in (("Gemma2ForCausalLM", "attn_logit_softcapping", 0.0),
                               ("Gemma2ForCausalLM", "attn_logit_softcapping", -50.0),
                               *[(arch, "final_logit_softcapping", value) for value in (0, -30.0, "30")
                                 for arch in ("Gemma2ForCausalLM", "Gemma3ForCausalLM")])],
])
def test_a_config_number_that_builds_no_model_is_one_line(over, says):
    """A count that was a string, null, zero or a float, or an epsilon that was a string, was carried into the entry
    (`registry import` succeeded, the entry failed at its first use); a RoPE base that was a string was a bare
    ValueError."""
    with pytest.raises(CheckpointError) as err:
        hf_config(raw_llama(**over))
    assert str(err.value) == f"config.json sets {says}"


def test_a_smollm3_config_without_its_keys_takes_transformers_class_defaults():
    """SmolLM3's class defaults differ from Llama's: RoPE base 2e6, a tied head, 4 key/value heads, a 32768
    context, a NoPE layer every 4th; a config.json leaving them out means them, as transformers reads it."""
    raw = {k: v for k, v in SHAPE.items() if k not in ("rope_theta", "num_key_value_heads", "max_position_embeddings")}
    raw |= {"architectures": ["SmolLM3ForCausalLM"], "num_hidden_layers": 8}
    theirs = transformers.SmolLM3Config(**raw)
    ours = hf_config(raw)
    assert (ours.rope_theta, ours.tie_embeddings, ours.n_kv_heads, ours.max_seq_len) == (
        theirs.rope_parameters["rope_theta"], theirs.tie_word_embeddings, theirs.num_key_value_heads, 8192)
    assert ours.nope_layers == tuple(i for i, rope in enumerate(theirs.no_rope_layers) if not rope) == (3, 7)
    assert hf_config({**raw, "no_rope_layer_interval": 3}).nope_layers == (2, 5)


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                  "Phi3ForCausalLM", "SmolLM3ForCausalLM", "Olmo3ForCausalLM", "Exaone4ForCausalLM"])
def test_a_null_num_key_value_heads_is_read_as_transformers_reads_it(arch):
    """An explicit null took the class default (Mistral 8, Qwen 32, SmolLM3 4), another model than transformers
    builds: its classes read None as num_attention_heads, but MistralConfig and Exaone4Config type the key int and
    refuse a null.
    An absent key keeps the class default."""
    raw = {**SHAPE, "architectures": [arch], "num_key_value_heads": None, "num_attention_heads": 8}  # not 4: SmolLM3's
    config_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    if arch in ("MistralForCausalLM", "Exaone4ForCausalLM"):
        with pytest.raises(Exception, match="num_key_value_heads"):
            config_cls(**raw)
        with pytest.raises(CheckpointError, match=r"^config.json sets num_key_value_heads=null: not a positive"):
            hf_config(raw)
    else:
        assert hf_config(raw).n_kv_heads == config_cls(**raw).num_key_value_heads == 8
    del raw["num_key_value_heads"]
    raw |= {"hidden_size": 64, "num_attention_heads": 32}  # so that every class default divides the query heads
    assert hf_config(raw).n_kv_heads == config_cls(**raw).num_key_value_heads


@pytest.mark.parametrize("over,window", [(dict(use_sliding_window=True, sliding_window=24), 24),
                                         (dict(use_sliding_window=True, sliding_window=24, num_hidden_layers=3), None),
                                         (dict(use_sliding_window=False, sliding_window=24), None),
                                         (dict(use_sliding_window=True, sliding_window=None), None)])
def test_a_smollm3_config_without_layer_types_slides_its_nope_layers_as_transformers_derives(over, window):
    """Without `layer_types` transformers slides the NoPE layers where use_sliding_window and a window are set (3
    layers: no NoPE layer, nothing slides); the context stays the checkpoint's."""
    raw = {**SHAPE, "architectures": ["SmolLM3ForCausalLM"], "num_hidden_layers": 4, **over}
    theirs = transformers.SmolLM3Config(**raw)
    assert ("sliding_attention" in theirs.layer_types) == (window is not None)
    cfg = hf_config(raw)
    assert (cfg.max_seq_len, cfg.window) == (256, window or 0)
    assert cfg.local_layers == tuple(i for i, kind in enumerate(theirs.layer_types) if kind == "sliding_attention")


@pytest.mark.parametrize("factor,dims", [(0.4, 3), (0.0, 0), (1.5, 12)])
def test_a_phi3_partial_rotary_factor_of_no_even_dims_says_which_it_needs(factor, dims):
    """A factor giving an odd count, none or more than a head's dims is refused with the count and what it must be
    (0 and 12 dims were each called 'not an even number')."""
    with pytest.raises(UsageError, match=rf"rotates {dims} of a head's 8 dims; partial RoPE needs an even number of "
                                         r"them from 2 to 8"):
        hf_config(raw_llama(architectures=["Phi3ForCausalLM"], partial_rotary_factor=factor))


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
    loaded = load_hf_folder(tmp_path)
    cfg, ours = loaded.cfg, loaded.state
    assert not cfg.tie_embeddings and torch.equal(ours["output.weight"], state["lm_head.weight"])
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(loaded.lm_head.weight, state["lm_head.weight"])
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    assert load_hf_folder(tmp_path).cfg.tie_embeddings


def test_tensor_the_model_would_ignore_is_refused(tmp_path):
    """A Qwen3 checkpoint labelled Qwen2 carries q/k norms a Qwen2 model lacks: refused, not dropped."""
    theirs = hf_model("Qwen3ForCausalLM", head_dim=8)
    theirs.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(CheckpointError, match="_norm.weight"):
        load_hf_folder(tmp_path)


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


def test_the_hf_export_of_a_longrope_model_prints_nothing(tmp_path):
    """to_hf (the `hf` benchmark row) of a LongRoPE model (Phi-3.5-mini's kind) printed transformers' advice to set
    rope_parameters' factor instead of original_max_position_embeddings: the export left the factor out. Run in a
    fresh interpreter, as a user's is: transformers prints each such warning once a process."""
    import subprocess
    import sys
    from pathlib import Path

    longrope = {"rope_type": "longrope", "short_factor": [1.0, 1.5, 3.0, 6.0], "long_factor": [1.0, 2.0, 8.0, 16.0]}
    hf_model("Phi3ForCausalLM", pad_token_id=0, rope_scaling=longrope,
             original_max_position_embeddings=32).save_pretrained(tmp_path)
    code = ("import pathlib, sys\n"
            "from specgen.models.hf_export import to_hf\n"
            "from tests.models.test_hf_configs import load\n"
            "assert to_hf(load(pathlib.Path(sys.argv[1]))).config.rope_parameters['rope_type'] == 'longrope'\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0 and done.stderr == ""


def test_registry_import_of_a_published_longrope_config_prints_nothing_but_the_entry(tmp_path):
    """`registry import` of a Phi-3.5-mini style folder (rope_scaling type longrope without a factor, the original
    context at the top level, as published) printed transformers' advice to set rope_parameters' factor: its tokenizer
    loads through AutoTokenizer, which reads the config.json and validates it. Run as a user's command is: a fresh
    interpreter (transformers prints each such warning once a process)."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.pcllm_fixtures import char_tokenizer

    longrope = {"type": "longrope", "short_factor": [1.0, 1.5, 3.0, 6.0], "long_factor": [1.0, 2.0, 8.0, 16.0]}
    hf_model("Phi3ForCausalLM", pad_token_id=0, rope_scaling={**longrope, "rope_type": "longrope"},
             original_max_position_embeddings=32).save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(str(tmp_path))
    raw = {k: v for k, v in json.loads((tmp_path / "config.json").read_text()).items() if k != "rope_parameters"}
    (tmp_path / "config.json").write_text(json.dumps({**raw, "rope_scaling": longrope, "rope_theta": 100.0,
                                                      "max_position_embeddings": 131072, "eos_token_id": 2}))
    done = subprocess.run([sys.executable, "-m", "cli.main", "registry", "import", str(tmp_path), "--name", "phi"],
                          capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert (done.returncode, done.stdout, done.stderr) == (0, "target/phi\n", "")


def test_a_tokenizer_that_does_not_load_is_one_line_naming_the_folder(tmp_path):
    """A folder whose tokenizer.json is no JSON was 'JSONDecodeError: Expecting property name ...', naming no file;
    nothing is registered."""
    from specgen import registry
    from specgen.importer import import_checkpoint
    from tests.pcllm_fixtures import char_tokenizer

    hf_model("LlamaForCausalLM").save_pretrained(tmp_path / "m")
    char_tokenizer().save_pretrained(str(tmp_path / "m"))
    (tmp_path / "m" / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=f"^cannot load the tokenizer of {tmp_path / 'm'}: JSONDecodeError: "
                                              "Expecting property name"):
        import_checkpoint(tmp_path / "m", "m")
    assert not (registry.checkpoints_dir() / "target" / "m").exists()


# Gemma 3 text over 7 layers: layer 5 global (the default pattern), the others local with their own RoPE base and a
# window of 16 (sequences of 100 tokens: several windows); a query_pre_attn_scalar other than the head size
GEMMA3 = dict(num_hidden_layers=7, head_dim=16, query_pre_attn_scalar=24, sliding_window=16, rope_theta=1000.0,
              rope_local_base_freq=100.0, pad_token_id=0, bos_token_id=0, eos_token_id=0)
GEMMA3_CASES = {"gemma3": {}, "gemma3-linear": dict(rope_scaling={"rope_type": "linear", "factor": 4.0}),
                "gemma3-untied-head-size-scalar": dict(tie_word_embeddings=False, query_pre_attn_scalar=16),
                # Gemma 3's class caps the logits where its config sets a final cap (its attention cap: refused)
                "gemma3-softcap": dict(final_logit_softcapping=3.0)}


def gemma3_model(**over):
    """A random tiny transformers Gemma3ForCausalLM; its norms store offsets around 0 (it multiplies by 1 + w)."""
    return gemma_model("Gemma3ForCausalLM", transformers.Gemma3TextConfig(**{**SHAPE, **GEMMA3, **over}))


def gemma1_model(**over):
    """A random tiny transformers GemmaForCausalLM (Gemma 1), its norms' offsets around 0."""
    return gemma_model("GemmaForCausalLM", transformers.GemmaConfig(
        **{**SHAPE, "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0, **over}))


def gemma_model(arch: str, cfg):
    """A random tiny transformers Gemma of class `arch` and config `cfg`, its norms' offsets around 0."""
    cfg.architectures = [arch]
    torch.manual_seed(0)
    model = getattr(transformers, arch)(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(0.2 * torch.randn_like(p) if name.endswith("norm.weight") else 0.3 * torch.randn_like(p))
    return model


def built(wrong: dict[str, tuple[TransformerConfig, dict]]) -> dict[str, Transformer]:
    """Each control's model: name -> (its config, its state dict), built and loaded."""
    out = {}
    for name, (c, s) in wrong.items():
        out[name] = Transformer(c).eval()
        out[name].load_state_dict(s)
    return out


def gemma3_controls(ours: Transformer, scalar: int) -> dict[str, Transformer]:
    """The loaded model with one Gemma detail undone each: no norm offsets, no embedding scale, one RoPE base in
    every layer, no window (the local layers attending fully), and (where the checkpoint's query_pre_attn_scalar is
    not its head size) the head size's scale."""
    cfg, state = ours.cfg, ours.state_dict()
    scale = (cfg.hd / scalar) ** 0.5  # folded into q's norm at load
    wrong = {"offsets": (cfg, {k: v - 1 if k.endswith("norm.weight") else v for k, v in state.items()}),
             "embed_scale": (dataclasses.replace(cfg, embed_scale=1.0), state),
             "one_base": (dataclasses.replace(cfg, local_rope_theta=0.0), state),  # the local layers still slide
             "no_window": (dataclasses.replace(cfg, window=0), state)}
    if scale != 1:
        wrong["scalar"] = (cfg, {k: v / scale if k.endswith("q_norm.weight") else v for k, v in state.items()})
    wrong |= uncapped(cfg, state)
    return built(wrong)


def uncapped(cfg, state: dict) -> dict[str, tuple]:
    """The controls of a capped config: each cap it sets undone (0: none), as (config, state)."""
    return {field: (dataclasses.replace(cfg, **{field: 0.0}), state) for field in ("attn_softcap", "logit_softcap")
            if getattr(cfg, field)}


@pytest.mark.parametrize("case", GEMMA3_CASES)
def test_gemma3_logits_equal_transformers(case, tmp_path):
    """Gemma 3 text loads exactly: norm offsets and the attention scale folded into the weights, the scaled
    embedding, GeGLU, sandwich and q/k norms, the local layers' own RoPE base and window, the global layers' scaling;
    the context is the checkpoint's (256), not the window. Controls: each detail undone is visibly wrong."""
    theirs = gemma3_model(**GEMMA3_CASES[case])
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    assert ours.cfg.max_seq_len == 256 and ours.cfg.local_layers == (0, 1, 2, 3, 4, 6) and ours.cfg.window == 16
    x = tokens(100)
    assert_exact_and_exported(ours, theirs, x, "Gemma3ForCausalLM")
    controls = gemma3_controls(ours, theirs.config.query_pre_attn_scalar)
    assert ("scalar" in controls) == (case != "gemma3-untied-head-size-scalar")
    assert ("logit_softcap" in controls) == (case == "gemma3-softcap") and "attn_softcap" not in controls
    assert (ours.cfg.attn_softcap, ours.cfg.logit_softcap) == (0.0, 3.0 if case == "gemma3-softcap" else 0.0)
    for name, wrong in controls.items():
        assert (logits(wrong, x) - logits(theirs, x)).abs().max() > 1e-2, name


@pytest.mark.parametrize("case", ["tied", "untied", "legacy-gelu"])
def test_gemma1_logits_equal_transformers(case, tmp_path):
    """Gemma 1 loads exactly: each norm's offset folded (1 + w), the sqrt(hidden) embedding scale, GeGLU (its legacy
    `hidden_act: gelu` read as the tanh form, as its class reads it), Llama's attention; the hf row's export is
    transformers' GemmaForCausalLM. Controls: no norm offsets, no embedding scale, SwiGLU, each visibly wrong."""
    theirs = gemma1_model(tie_word_embeddings=case != "untied")
    theirs.save_pretrained(tmp_path)
    if case == "legacy-gelu":  # gemma-2b's and gemma-7b's config.json
        raw = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**raw, "hidden_act": "gelu"}))
    ours = load(tmp_path)
    cfg = ours.cfg
    assert (cfg.ffn_act, cfg.embed_scale, cfg.sandwich_norms, cfg.qk_norm, cfg.local_layers) == (
        "gelu_tanh", 32**0.5, False, False, ())
    x = tokens(60)
    assert_exact_and_exported(ours, theirs, x, "GemmaForCausalLM")
    state = ours.state_dict()
    for c, s in ((cfg, {k: v - 1 if k.endswith("norm.weight") else v for k, v in state.items()}),
                 (dataclasses.replace(cfg, embed_scale=1.0), state), (dataclasses.replace(cfg, ffn_act="silu"), state)):
        wrong = Transformer(c).eval()
        wrong.load_state_dict(s)
        assert (logits(wrong, x) - logits(theirs, x)).abs().max() > 1e-2


@pytest.mark.parametrize("arch", HF_ARCHITECTURES)
def test_a_config_without_an_epsilon_takes_its_classes_default(arch):
    """Every supported class's `rms_norm_eps` default (Phi-3's and OLMo 2's 1e-5, not 1e-6: a Phi-3 config without
    the key read 1e-6), over the architecture table itself."""
    raw = {**SHAPE, "architectures": [arch]}
    raw.pop("rms_norm_eps", None)
    cls = getattr(transformers, {"Gemma3ForCausalLM": "Gemma3TextConfig"}.get(arch, arch.replace("ForCausalLM",
                                                                                                  "Config")))
    assert hf_config(raw).norm_eps == cls().rms_norm_eps


def test_a_gemma1_config_without_its_keys_takes_transformers_class_defaults():
    """Gemma 1's class defaults: head size 256, 16 KV heads, RoPE base 1e4, a tied head, an 8192 context, GeGLU."""
    raw = {k: v for k, v in SHAPE.items() if k not in ("rope_theta", "num_key_value_heads", "max_position_embeddings")}
    raw |= {"num_attention_heads": 16}
    theirs = transformers.GemmaConfig(**raw)
    cfg = hf_config({**raw, "architectures": ["GemmaForCausalLM"]})
    assert (cfg.hd, cfg.n_kv_heads, cfg.tie_embeddings, cfg.max_seq_len) == (
        theirs.head_dim, theirs.num_key_value_heads, True, theirs.max_position_embeddings) == (256, 16, True, 8192)
    assert cfg.rope_theta == theirs.rope_parameters["rope_theta"] == 1e4
    assert cfg.embed_scale == 32**0.5 and cfg.ffn_act == "gelu_tanh" and theirs.hidden_act == "gelu_pytorch_tanh"


def test_a_legacy_gemma3_config_reads_the_same(tmp_path):
    """transformers 4.x Gemma 3 configs: `rope_theta`, `rope_local_base_freq` and `rope_scaling` at the top level
    (the scaling the global layers'), the pattern `sliding_window_pattern` instead of `layer_types`."""
    theirs = gemma3_model(**GEMMA3_CASES["gemma3-linear"])
    theirs.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    legacy = {k: v for k, v in raw.items() if k not in ("rope_parameters", "layer_types")}
    legacy |= {"rope_theta": 1000.0, "rope_local_base_freq": 100.0, "sliding_window_pattern": 6,
               "rope_scaling": {"type": "linear", "factor": 4.0}}
    assert hf_config(legacy) == hf_config(raw)
    assert hf_config({**legacy, "sliding_window_pattern": 2}).local_layers == (0, 2, 4, 6)


def test_a_gemma3_config_without_its_keys_takes_transformers_class_defaults():
    """Gemma 3's class defaults: head size 256, 4 KV heads, RoPE bases 1e6 (global) and 1e4 (local), a tied head, a
    4096 window over a 131072 context, every sixth layer global, query_pre_attn_scalar 256 (the head size)."""
    raw = {k: v for k, v in SHAPE.items() if k not in ("rope_theta", "num_key_value_heads", "max_position_embeddings")}
    raw |= {"num_hidden_layers": 12, "num_attention_heads": 8}
    theirs = transformers.Gemma3TextConfig(**raw)
    cfg = hf_config({**raw, "architectures": ["Gemma3ForCausalLM"]})
    assert (cfg.hd, cfg.n_kv_heads, cfg.tie_embeddings) == (theirs.head_dim, theirs.num_key_value_heads, True)
    assert cfg.rope_theta == theirs.rope_parameters["full_attention"]["rope_theta"] == 1e6
    assert cfg.local_rope_theta == theirs.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    assert cfg.local_layers == tuple(i for i, t in enumerate(theirs.layer_types) if t == "sliding_attention")
    assert cfg.local_layers == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10)
    assert cfg.window == theirs.sliding_window == 4096 and theirs.query_pre_attn_scalar == cfg.hd
    assert cfg.max_seq_len == 8192  # the cap (llama.MAX_CONTEXT), not the window
    assert cfg.embed_scale == 32**0.5 and cfg.ffn_act == "gelu_tanh" and cfg.sandwich_norms and cfg.qk_norm


@pytest.mark.parametrize("make", ["gemma3", "gemma2", "olmo2", "olmo3", "exaone4"])
def test_sandwich_blocks_in_bfloat16_are_as_close_to_float32_as_transformers_bfloat16(make, tmp_path):
    """The folded offsets (1 + w rounded to bfloat16 once, at load) and Llama's norm formula (normed x rounded before
    the weight) round differently from transformers' float32 (1 + w) product, and from OLMo 2's norm (the weight
    times the float32 normed x, rounded after); in bfloat16 specgen's logits stay as near the float32 ones as
    transformers' own bfloat16 logits (measured: Gemma 3 0.15-0.19 against 0.16-0.17 of logits up to 8; Gemma 2, its
    capped scores on the CPU's chunked path, 0.14 against 0.10 of logits capped at 3; OLMo 2 0.24 against 0.18 of
    logits up to 7)."""
    theirs = {"gemma3": gemma3_model, "gemma2": gemma2_model, "olmo2": olmo2_model, "olmo3": olmo3_model,
              "exaone4": exaone4_model}[make]()
    theirs.save_pretrained(tmp_path)
    ours, x = load(tmp_path), tokens(100)
    exact = logits(theirs, x)
    their_error = (logits(theirs.to(torch.bfloat16), x).float() - exact).abs().max()
    our_error = (logits(ours.to(torch.bfloat16), x).float() - exact).abs().max()
    assert our_error <= 2 * their_error


@pytest.mark.parametrize("over", [dict(ffn_act="silu"), dict(embed_scale=2.0), dict(qk_norm=False),
                                  dict(nope_layers=(1,)), dict(rope_layout="interleaved")])
def test_a_gemma_block_that_gemma3_cannot_express_is_not_exported(over):
    """to_hf builds Gemma3ForCausalLM for sandwich norms only with the rest of Gemma 3's block, and GemmaForCausalLM
    for Gemma's fields without them only with the rest of Gemma 1's (here: q/k norms, which it has not)."""
    from tests.conftest import GEMMA, tiny_model

    # (NoPE layers: SmolLM3's, which has no q/k norms; without q/k norms: Gemma 2's class, which has one RoPE base)
    with pytest.raises(ValueError, match="Gemma 2|Gemma 3|SmolLM3"):
        to_hf(tiny_model(0, **{**GEMMA, "local_layers": (0,) if "nope_layers" in over else (1,), **over}))
    with pytest.raises(ValueError, match="as Gemma 1"):  # without sandwich norms: Gemma 1's class, no q/k norms
        to_hf(tiny_model(0, **{**GEMMA, "sandwich_norms": False}))


# Gemma 2 over 5 layers: layers 0, 2 and 4 slide (its class's derivation) over a window of 16 (sequences of 100
# tokens: several windows), one RoPE base; caps small enough that this tiny model's scores and logits (up to ~10
# uncapped) pass them, so each cap shows; a query_pre_attn_scalar other than the head size
GEMMA2 = dict(num_hidden_layers=5, head_dim=16, query_pre_attn_scalar=24, sliding_window=16, rope_theta=1000.0,
              attn_logit_softcapping=2.0, final_logit_softcapping=3.0, pad_token_id=0, bos_token_id=0, eos_token_id=0)
GEMMA2_CASES = {"gemma2": {}, "gemma2-untied": dict(tie_word_embeddings=False),
                "gemma2-head-size-scalar": dict(query_pre_attn_scalar=16)}


def gemma2_model(**over):
    """A random tiny transformers Gemma2ForCausalLM (eager attention: its class has no SDPA), norm offsets around 0."""
    return gemma_model("Gemma2ForCausalLM", transformers.Gemma2Config(**{**SHAPE, **GEMMA2, **over}))


def gemma2_controls(ours: Transformer, scalar: int) -> dict[str, Transformer]:
    """The loaded model with one Gemma 2 detail undone each: no norm offsets, no embedding scale, no attention cap,
    no logit cap, no window (every layer attending fully), and (where the checkpoint's query_pre_attn_scalar is not
    its head size) the head size's scale (the fold on q's rows of wqkv undone)."""
    cfg, state = ours.cfg, ours.state_dict()
    q_rows, scale = cfg.n_heads * cfg.hd, (cfg.hd / scalar) ** 0.5

    def unscaled(k: str, v: torch.Tensor) -> torch.Tensor:
        return torch.cat([v[:q_rows] / scale, v[q_rows:]]) if k.endswith("wqkv.weight") else v

    wrong = {"offsets": (cfg, {k: v - 1 if k.endswith("norm.weight") else v for k, v in state.items()}),
             "embed_scale": (dataclasses.replace(cfg, embed_scale=1.0), state),
             "no_window": (dataclasses.replace(cfg, window=0, local_layers=()), state), **uncapped(cfg, state)}
    if scale != 1:
        wrong["scalar"] = (cfg, {k: unscaled(k, v) for k, v in state.items()})
    return built(wrong)


@pytest.mark.parametrize("case", GEMMA2_CASES)
def test_gemma2_logits_equal_transformers(case, tmp_path):
    """Gemma 2 loads exactly: norm offsets and the attention scale folded into the weights, the scaled embedding,
    GeGLU, sandwich norms, every other layer sliding from layer 0, the attention cap on the scaled scores and the
    final cap on the logits; uncached, through a cache, and from the hf row's export (transformers' Gemma 2 of the
    same math). Controls: each detail undone is visibly wrong."""
    theirs = gemma2_model(**GEMMA2_CASES[case])
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    cfg = ours.cfg
    assert (cfg.max_seq_len, cfg.local_layers, cfg.window, cfg.local_rope_theta) == (256, (0, 2, 4), 16, 0.0)
    assert (cfg.attn_softcap, cfg.logit_softcap, cfg.sandwich_norms, cfg.qk_norm) == (2.0, 3.0, True, False)
    assert cfg.tie_embeddings == (case != "gemma2-untied")
    x = tokens(100)
    assert_exact_and_exported(ours, theirs, x, "Gemma2ForCausalLM")
    controls = gemma2_controls(ours, theirs.config.query_pre_attn_scalar)
    assert set(controls) == {"offsets", "embed_scale", "no_window", "attn_softcap", "logit_softcap"} | (
        set() if case == "gemma2-head-size-scalar" else {"scalar"})
    for name, wrong in controls.items():
        assert (logits(wrong, x) - logits(theirs, x)).abs().max() > 1e-2, name


def test_a_gemma2_config_without_its_keys_takes_transformers_class_defaults():
    """Gemma 2's class defaults: head size 256, 4 KV heads, RoPE base 1e4 in every layer, a tied head, an 8192
    context, a 4096 window over every other layer from layer 0, caps 50 (scores) and 30 (logits),
    query_pre_attn_scalar 256 (the head size: no fold), GeGLU."""
    raw = {k: v for k, v in SHAPE.items() if k not in ("rope_theta", "num_key_value_heads", "max_position_embeddings")}
    raw |= {"num_hidden_layers": 5, "num_attention_heads": 8}
    theirs = transformers.Gemma2Config(**raw)
    cfg = hf_config({**raw, "architectures": ["Gemma2ForCausalLM"]})
    assert (cfg.hd, cfg.n_kv_heads, cfg.tie_embeddings, cfg.max_seq_len) == (
        theirs.head_dim, theirs.num_key_value_heads, True, theirs.max_position_embeddings) == (256, 4, True, 8192)
    assert cfg.rope_theta == theirs.rope_parameters["rope_theta"] == 1e4 and cfg.local_rope_theta == 0
    assert cfg.local_layers == tuple(i for i, t in enumerate(theirs.layer_types) if t == "sliding_attention")
    assert cfg.local_layers == (0, 2, 4) and cfg.window == theirs.sliding_window == 4096
    assert (cfg.attn_softcap, cfg.logit_softcap) == (
        theirs.attn_logit_softcapping, theirs.final_logit_softcapping) == (50.0, 30.0)
    assert theirs.query_pre_attn_scalar == cfg.hd and theirs.hidden_activation == "gelu_pytorch_tanh"
    assert cfg.embed_scale == 32**0.5 and cfg.ffn_act == "gelu_tanh" and cfg.sandwich_norms and not cfg.qk_norm


def test_a_legacy_gemma2_config_reads_the_same(tmp_path):
    """transformers 4.x Gemma 2 configs (gemma-2-2b's, 9b's, 27b's): `rope_theta` at the top level, no `layer_types`
    (every other layer slides, from layer 0), `hidden_act` beside `hidden_activation` (which the class reads); null
    caps are none."""
    theirs = gemma2_model()
    theirs.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    legacy = {k: v for k, v in raw.items() if k not in ("rope_parameters", "layer_types")}
    legacy |= {"rope_theta": 1000.0, "hidden_act": "gelu_pytorch_tanh", "sliding_window_size": 16}
    assert hf_config(legacy) == hf_config(raw)
    assert hf_config({**legacy, "num_hidden_layers": 6}).local_layers == (0, 2, 4)
    uncapped_cfg = hf_config({**raw, "attn_logit_softcapping": None, "final_logit_softcapping": None})
    assert (uncapped_cfg.attn_softcap, uncapped_cfg.logit_softcap) == (0.0, 0.0)
    marked = hf_config({**raw, "layer_types": ["full_attention"] * 4 + ["sliding_attention"]})
    assert marked.local_layers == (4,)


# OLMo 2 over 3 layers, SHAPE's grouped heads (4 query heads over 2 key/value heads), untied (its class default)
OLMO2 = dict(num_hidden_layers=3, pad_token_id=0, bos_token_id=0, eos_token_id=0)
OLMO2_CASES = {"olmo2": {}, "olmo2-head-dim": dict(head_dim=16),  # heads of 16, not hidden / heads = 8
               "olmo2-tied": dict(tie_word_embeddings=True)}


def olmo2_model(**over):
    """A random tiny transformers Olmo2ForCausalLM: `hf_model`'s, its norms' weights around 1."""
    return hf_model("Olmo2ForCausalLM", **{**OLMO2, **over})


class PerHeadNorm(torch.nn.Module):
    """A whole-span q or k norm's weights [heads hd] over each head's rows normed alone (Qwen3's span): x [..., heads
    hd] -> [..., heads hd]."""

    def __init__(self, norm, hd: int) -> None:
        super().__init__()
        self.weight, self.eps, self.hd = norm.weight, norm.eps, hd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = torch.nn.functional.rms_norm(x.unflatten(-1, (-1, self.hd)), (self.hd,), eps=self.eps)
        return self.weight * heads.flatten(-2)


def olmo2_controls(ours: Transformer) -> dict[str, Transformer]:
    """The loaded model with one OLMo 2 detail undone each: its q/k norms per head (the same weights), pre-norms added
    (each sublayer's output norm's weights also before it), its norms before the sublayers instead of after (Llama's
    places), its output norms removed."""
    cfg, state = ours.cfg, ours.state_dict()
    pre = {k.replace("attention_out_norm", "attention_norm").replace("ffn_out_norm", "ffn_norm"): v
           for k, v in state.items() if "out_norm" in k}
    moved = {k: v for k, v in state.items() if "out_norm" not in k} | pre
    wrong = {"per_head": (cfg, state), "pre_norms_added": (dataclasses.replace(cfg, pre_norms=True), state | pre),
             "norms_before": (dataclasses.replace(cfg, pre_norms=True, sandwich_norms=False), moved),
             "no_out_norms": (cfg, state)}
    out = {}
    for name, (c, s) in wrong.items():
        out[name] = Transformer(c).eval()
        out[name].load_state_dict(s)
    for blk in out["per_head"].layers:
        blk.attention.q_norm = PerHeadNorm(blk.attention.q_norm, cfg.hd)
        blk.attention.k_norm = PerHeadNorm(blk.attention.k_norm, cfg.hd)
    for blk in out["no_out_norms"].layers:
        blk.attention_out_norm, blk.ffn_out_norm = torch.nn.Identity(), torch.nn.Identity()
    return out


@pytest.mark.parametrize("case", OLMO2_CASES)
def test_olmo2_logits_equal_transformers(case, tmp_path):
    """OLMo 2 loads exactly: no norm before the sublayers, each sublayer's output normed before its residual add, q's
    and k's norms over their whole projections before the split into heads and RoPE, SwiGLU; uncached, through a
    cache, and from the hf row's export (transformers' Olmo2ForCausalLM). Controls: each detail undone is visibly
    wrong."""
    theirs = olmo2_model(**OLMO2_CASES[case])
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    cfg = ours.cfg
    assert (cfg.pre_norms, cfg.sandwich_norms, cfg.qk_norm, cfg.qk_norm_span, cfg.ffn_act) == (
        False, True, True, "all", "silu")
    assert cfg.hd == (16 if case == "olmo2-head-dim" else 8) and cfg.tie_embeddings == (case == "olmo2-tied")
    assert ours.layers[0].attention.q_norm.weight.shape == (4 * cfg.hd,)  # whole: [H hd], k's [Hkv hd]
    assert ours.layers[0].attention.k_norm.weight.shape == (2 * cfg.hd,)
    x = tokens(60)
    assert_exact_and_exported(ours, theirs, x, "Olmo2ForCausalLM")
    for name, wrong in olmo2_controls(ours).items():
        assert (logits(wrong, x) - logits(theirs, x)).abs().max() > 1e-2, name


def test_an_olmo2_config_without_its_keys_takes_transformers_class_defaults():
    """OLMo 2's class defaults: one key/value head per query head, RoPE base 1e4, an untied head, a 2048 context,
    norm epsilon 1e-5 (Llama's 1e-6 elsewhere), SwiGLU."""
    raw = {k: v for k, v in SHAPE.items()
           if k not in ("rope_theta", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps")}
    theirs = transformers.Olmo2Config(**raw)
    cfg = hf_config({**raw, "architectures": ["Olmo2ForCausalLM"]})
    assert (cfg.n_kv_heads, cfg.tie_embeddings, cfg.max_seq_len, cfg.norm_eps) == (
        theirs.num_key_value_heads, theirs.tie_word_embeddings, theirs.max_position_embeddings,
        theirs.rms_norm_eps) == (4, False, 2048, 1e-5)
    assert cfg.rope_theta == theirs.rope_parameters["rope_theta"] == 1e4 and theirs.hidden_act == "silu"


@pytest.mark.parametrize("over,says", [
    (dict(qk_norm_span="all"), "qk_norm_span 'all'"),  # whole-span norms without q/k norms
    (dict(qk_norm=True, qk_norm_span="rows"), "qk_norm_span 'rows'"),
    (dict(pre_norms=False), "needs sandwich_norms"),  # a block that would norm nothing
])
def test_an_olmo2_field_combination_that_builds_no_block_is_one_line(over, says):
    from tests.conftest import tiny_config

    with pytest.raises(ValueError, match=says) as err:
        tiny_config(**over)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("over,says", [(dict(embed_scale=2.0), "as OLMo 2"), (dict(ffn_act="gelu_tanh"), "as OLMo 2"),
                                       (dict(pre_norms=True), "no pre-norms")])
def test_a_block_that_olmo2_cannot_express_is_not_exported(over, says):
    """to_hf builds Olmo2ForCausalLM for a block without pre-norms only with the rest of OLMo 2's block, and refuses
    whole-span q/k norms in a block with pre-norms (no class of transformers' has that block)."""
    from tests.conftest import OLMO2 as TINY_OLMO2, tiny_model

    with pytest.raises(ValueError, match=says):
        to_hf(tiny_model(0, **{**TINY_OLMO2, **over}))


# OLMo 3 over 5 layers: layers 0, 1, 2 and 4 slide (its class's three in four) over a window of 16 (sequences of 100
# tokens: several windows); SHAPE's rope_theta (100) turns the full layers only, the sliding ones take the class's
# 500000 (it reads a top-level rope_theta into the full layers' dict alone)
OLMO3 = dict(num_hidden_layers=5, sliding_window=16, pad_token_id=0, bos_token_id=0, eos_token_id=0)
OLMO3_CASES = {"olmo3": {}, "olmo3-tied": dict(tie_word_embeddings=True),
               # transformers 5's per-kind dicts: the full layers scaled (YaRN, OLMo 3 7B's), the sliding ones' own base
               "olmo3-per-kind-rope": dict(rope_parameters={
                   "full_attention": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                      "rope_theta": 100.0},
                   "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}}),
               "olmo3-layer-types": dict(layer_types=["full_attention", "sliding_attention", "full_attention",
                                                      "sliding_attention", "sliding_attention"], head_dim=16)}


def olmo3_model(**over):
    """A random tiny transformers Olmo3ForCausalLM: `hf_model`'s, its norms' weights around 1."""
    return hf_model("Olmo3ForCausalLM", **{**OLMO3, **over})


def local_controls(ours: Transformer) -> dict[str, Transformer]:
    """The loaded model with its local layers' details undone each: the full layers' RoPE in them (their own base
    dropped), no window (the local layers attending fully)."""
    cfg, state = ours.cfg, ours.state_dict()
    return built({"one_base": (dataclasses.replace(cfg, local_rope_theta=0.0, local_layers=cfg.local_layers), state),
                  "no_window": (dataclasses.replace(cfg, window=0), state)})


@pytest.mark.parametrize("case", OLMO3_CASES)
def test_olmo3_logits_equal_transformers(case, tmp_path):
    """OLMo 3 loads exactly: OLMo 2's block (no pre-norms, output norms, whole-span q/k norms, SwiGLU), its sliding
    layers over their window with their own unscaled RoPE base, the full layers' base and scaling; uncached, through a
    cache, and from the hf row's export (transformers' Olmo3ForCausalLM). Controls: each detail undone is visibly
    wrong."""
    theirs = olmo3_model(**OLMO3_CASES[case])
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    cfg, rope = ours.cfg, theirs.config.rope_parameters
    assert (cfg.pre_norms, cfg.sandwich_norms, cfg.qk_norm, cfg.qk_norm_span, cfg.window) == (
        False, True, True, "all", 16)
    assert cfg.local_layers == tuple(i for i, t in enumerate(theirs.config.layer_types) if t == "sliding_attention")
    assert (cfg.rope_theta, cfg.local_rope_theta) == (rope["full_attention"]["rope_theta"],
                                                      rope["sliding_attention"]["rope_theta"])
    assert cfg.local_rope_theta == (1000.0 if case == "olmo3-per-kind-rope" else 500000.0) and cfg.rope_theta == 100
    assert (cfg.rope_scaling or {}).get("rope_type") == ("yarn" if case == "olmo3-per-kind-rope" else None)
    x = tokens(100)
    assert_exact_and_exported(ours, theirs, x, "Olmo3ForCausalLM")
    for name, wrong in (olmo2_controls(ours) | local_controls(ours)).items():
        assert (logits(wrong, x) - logits(theirs, x)).abs().max() > 1e-2, name


def test_an_olmo3_config_without_its_keys_takes_transformers_class_defaults():
    """OLMo 3's class defaults: OLMo 2's (one key/value head per query head, an untied head, a 2048 context, norm
    epsilon 1e-5), both RoPE bases 500000, three layers in four sliding over a window of 4096; a top-level rope_theta
    sets the full layers' base only (its class's reading); a legacy rope_scaling scales the full layers only."""
    raw = {k: v for k, v in SHAPE.items()
           if k not in ("rope_theta", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps")}
    raw |= {"num_hidden_layers": 8}
    theirs = transformers.Olmo3Config(**raw)
    cfg = hf_config({**raw, "architectures": ["Olmo3ForCausalLM"]})
    assert (cfg.n_kv_heads, cfg.tie_embeddings, cfg.max_seq_len, cfg.norm_eps, cfg.window) == (
        theirs.num_key_value_heads, theirs.tie_word_embeddings, theirs.max_position_embeddings,
        theirs.rms_norm_eps, theirs.sliding_window) == (4, False, 2048, 1e-5, 4096)
    assert cfg.local_layers == tuple(i for i, t in enumerate(theirs.layer_types) if t == "sliding_attention")
    assert cfg.local_layers == (0, 1, 2, 4, 5, 6)
    assert (cfg.rope_theta, cfg.local_rope_theta) == (theirs.rope_parameters["full_attention"]["rope_theta"],
                                                      theirs.rope_parameters["sliding_attention"]["rope_theta"])
    assert cfg.rope_theta == cfg.local_rope_theta == 500000.0
    legacy = {**raw, "rope_theta": 1e4, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    theirs, cfg = transformers.Olmo3Config(**legacy), hf_config({**legacy, "architectures": ["Olmo3ForCausalLM"]})
    assert (cfg.rope_theta, cfg.local_rope_theta) == (theirs.rope_parameters["full_attention"]["rope_theta"],
                                                      theirs.rope_parameters["sliding_attention"]["rope_theta"])
    assert (cfg.rope_theta, cfg.local_rope_theta) == (1e4, 500000.0)
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert theirs.rope_parameters["sliding_attention"]["rope_type"] == "default"


def test_local_layers_without_their_own_base_beside_a_scaling_are_not_exported_as_olmo3():
    """OLMo 3's sliding layers turn with an unscaled RoPE: local layers turning with the full layers' scaled table
    (which no loader builds) have no OLMo 3 class."""
    from tests.conftest import OLMO2 as TINY_OLMO2, tiny_model

    with pytest.raises(ValueError, match="unscaled RoPE"):
        to_hf(tiny_model(0, **{**TINY_OLMO2, "local_layers": (0,), "window": 4,
                               "rope_scaling": {"rope_type": "linear", "factor": 2.0}}))


# EXAONE 4 over 5 layers, heads of 16 (not hidden / heads): layers 0, 1, 2 and 4 slide (its class's pattern 4) over a
# window of 16, layer 3 attends fully without RoPE (a window is set)
EXAONE4 = dict(num_hidden_layers=5, sliding_window=16, head_dim=16, pad_token_id=0, bos_token_id=0, eos_token_id=0)
EXAONE4_CASES = {"exaone4": {}, "exaone4-pattern-3": dict(sliding_window_pattern=3),
                 "exaone4-tied-llama3": dict(tie_word_embeddings=True, rope_scaling=LLAMA3),
                 "exaone4-layer-types": dict(sliding_window_pattern="LLG", layer_types=[
                     "sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"]),
                 # EXAONE 4.0 1.2B's kind: no window, every layer full and turning
                 "exaone4-no-window": dict(sliding_window=None, layer_types=["full_attention"] * 5)}


def exaone4_model(**over):
    """A random tiny transformers Exaone4ForCausalLM: `hf_model`'s, its norms' weights around 1."""
    return hf_model("Exaone4ForCausalLM", **{**EXAONE4, **over})


def exaone4_controls(ours: Transformer) -> dict[str, Transformer]:
    """The loaded model with one EXAONE 4 detail undone each: the norms' places (OLMo 2's controls, its q/k norms
    whole instead of per head), no q/k norms, RoPE in the NoPE layers, no window."""
    cfg, state = ours.cfg, ours.state_dict()
    out = olmo2_controls(ours)
    del out["per_head"]  # (OLMo 2's span control: here the span is per head; the whole span takes other weights)
    no_qk = {k: v for k, v in state.items() if "q_norm" not in k and "k_norm" not in k}
    wrong = {"no_qk_norms": (dataclasses.replace(cfg, qk_norm=False), no_qk)}
    if cfg.nope_layers:
        wrong["rope_everywhere"] = (dataclasses.replace(cfg, nope_layers=()), state)
    if cfg.window:
        wrong["no_window"] = (dataclasses.replace(cfg, window=0, local_layers=()), state)
    return out | built(wrong)


@pytest.mark.parametrize("case", EXAONE4_CASES)
def test_exaone4_logits_equal_transformers(case, tmp_path):
    """EXAONE 4 loads exactly: no norm before the sublayers, each output normed before its add, q and k normed per
    head before RoPE, SwiGLU, its sliding layers (the pattern, or layer_types where given) over their window and,
    where a window is set, its global layers without RoPE; uncached, through a cache, and from the hf row's export
    (transformers' Exaone4ForCausalLM). Controls: each detail undone is visibly wrong."""
    theirs = exaone4_model(**EXAONE4_CASES[case])
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    cfg, kinds = ours.cfg, theirs.config.layer_types
    assert (cfg.pre_norms, cfg.sandwich_norms, cfg.qk_norm, cfg.qk_norm_span, cfg.hd, cfg.local_rope_theta) == (
        False, True, True, "head", 16, 0.0)
    windowed = case != "exaone4-no-window"
    assert cfg.local_layers == tuple(i for i, t in enumerate(kinds) if t == "sliding_attention")
    assert cfg.nope_layers == (tuple(i for i, t in enumerate(kinds) if t == "full_attention") if windowed else ())
    assert cfg.window == (16 if windowed else 0) and cfg.tie_embeddings == (case == "exaone4-tied-llama3")
    assert cfg.nope_layers == {"exaone4": (3,), "exaone4-pattern-3": (2,), "exaone4-tied-llama3": (3,),
                               "exaone4-layer-types": (2, 4), "exaone4-no-window": ()}[case]
    x = tokens(100)
    assert_exact_and_exported(ours, theirs, x, "Exaone4ForCausalLM")
    controls = exaone4_controls(ours)
    assert ("rope_everywhere" in controls) == ("no_window" in controls) == windowed
    for name, wrong in controls.items():
        assert (logits(wrong, x) - logits(theirs, x)).abs().max() > 1e-2, name


def test_an_exaone4_config_without_its_keys_takes_transformers_class_defaults():
    """EXAONE 4's class defaults: 32 key/value heads, RoPE base 1e4, an untied head, a 2048 context, norm epsilon
    1e-5, layer i sliding unless (i + 1) % 4 is 0 (its pattern; the last layer slides where the pattern says so,
    whatever its docstring says) over a window of 4096, the others without RoPE."""
    raw = {k: v for k, v in SHAPE.items()
           if k not in ("rope_theta", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps")}
    raw |= {"num_hidden_layers": 7, "hidden_size": 64, "num_attention_heads": 32}
    theirs = transformers.Exaone4Config(**raw)
    cfg = hf_config({**raw, "architectures": ["Exaone4ForCausalLM"]})
    assert (cfg.n_kv_heads, cfg.tie_embeddings, cfg.max_seq_len, cfg.norm_eps, cfg.window, cfg.rope_theta) == (
        theirs.num_key_value_heads, theirs.tie_word_embeddings, theirs.max_position_embeddings,
        theirs.rms_norm_eps, theirs.sliding_window, theirs.rope_parameters["rope_theta"]) == (
        32, False, 2048, 1e-5, 4096, 1e4)
    assert cfg.local_layers == tuple(i for i, t in enumerate(theirs.layer_types) if t == "sliding_attention")
    assert (cfg.local_layers, cfg.nope_layers) == ((0, 1, 2, 4, 5, 6), (3,))
    assert cfg.hd == 2 and not cfg.local_rope_theta


@pytest.mark.parametrize("over,named", [
    *[(dict(architectures=["Olmo3ForCausalLM"], **{key: value}), key)
      for key, value in (("attention_bias", True), ("hidden_act", "gelu"))],
    (dict(architectures=["Olmo3ForCausalLM"], rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
     "rope_parameters"),  # flat: OLMo 3 reads one dict per layer kind
    (dict(architectures=["Olmo3ForCausalLM"], rope_parameters={"sliding_attention": {
        "rope_type": "linear", "factor": 2.0}}), "rope_parameters.sliding_attention.rope_type"),
    (dict(architectures=["Olmo3ForCausalLM"], sliding_window=None), "sliding_window"),  # its class: no sliding mask
    (dict(architectures=["Olmo3ForCausalLM"], layer_types=["full_attention", "chunked_attention"]), "layer_types"),
    (dict(architectures=["Exaone4ForCausalLM"], hidden_act="gelu"), "hidden_act"),
    (dict(architectures=["Exaone4ForCausalLM"], rope_parameters={"full_attention": {"rope_type": "default"}}),
     "rope_parameters"),
    # without layer_types its class derives no kinds from these (a pattern of 0, an int % str)
    (dict(architectures=["Exaone4ForCausalLM"], sliding_window=None), "sliding_window"),
    (dict(architectures=["Exaone4ForCausalLM"], sliding_window_pattern="LLLG"), "sliding_window_pattern"),
    (dict(architectures=["Exaone4ForCausalLM"], sliding_window=None, layer_types=["full_attention",
                                                                                  "sliding_attention"]),
     "sliding_window"),  # a sliding layer without a window: transformers fails to build its mask
])
def test_an_olmo3_or_exaone4_key_specgen_does_not_implement_is_one_line(over, named):
    """The keys OLMo 3's and EXAONE 4's classes read that specgen does not implement, and the configs their classes
    cannot build, are refused with one line naming the key (EXAONE 4's config class fails on a null window or a
    pattern string without layer_types: checked)."""
    with pytest.raises(UsageError) as err:
        hf_config(raw_llama(**over))
    assert named in str(err.value) and "\n" not in str(err.value)
    if over["architectures"] == ["Exaone4ForCausalLM"] and named.startswith("sliding") and "layer_types" not in over:
        with pytest.raises((ZeroDivisionError, TypeError)):
            transformers.Exaone4Config(**{k: v for k, v in over.items() if k != "architectures"})


@pytest.mark.parametrize("over,says", [
    (dict(ffn_act="gelu_tanh"), "as EXAONE 4"), (dict(embed_scale=2.0), "as EXAONE 4"),
    (dict(nope_layers=(0,)), "as EXAONE 4"),  # NoPE without a window: its class turns every layer then
    (dict(nope_layers=(1,), local_layers=(1,), window=4), "as EXAONE 4"),  # a sliding NoPE layer
    (dict(local_layers=(0,), local_rope_theta=1e4), "as EXAONE 4"),  # one base only
])
def test_a_block_that_exaone4_cannot_express_is_not_exported(over, says):
    """to_hf builds Exaone4ForCausalLM for a block without pre-norms whose q/k norms are per head only with the rest
    of EXAONE 4's block: one RoPE base, and either no NoPE layer or exactly the layers that do not slide."""
    from tests.conftest import OLMO2 as TINY_OLMO2, tiny_model

    with pytest.raises(ValueError, match=says):
        to_hf(tiny_model(0, **{**TINY_OLMO2, "qk_norm_span": "head", **over}))


# Granite over 3 layers, SHAPE's grouped heads, its four multipliers far from 1 (each undone shows: granite_controls)
GRANITE = dict(num_hidden_layers=3, embedding_multiplier=12.0, attention_multiplier=0.1, residual_multiplier=0.3,
               logits_scaling=4.0, pad_token_id=0, bos_token_id=0, eos_token_id=0)
GRANITE_CASES = {"granite": {}, "granite-tied": dict(tie_word_embeddings=True),  # granite-3.x's: tied
                 "granite-head-dim": dict(head_dim=16)}  # heads of 16, not hidden / heads = 8: sqrt(16) in the fold


def granite_model(**over):
    """A random tiny transformers GraniteForCausalLM: `hf_model`'s, its norms' weights around 1."""
    return hf_model("GraniteForCausalLM", **{**GRANITE, **over})


def granite_controls(ours: Transformer, raw: dict) -> dict[str, Transformer]:
    """The loaded model with one multiplier undone each: no embedding multiplier, the attention multiplier's fold on
    q's rows of wqkv undone (scores scaled by 1/sqrt(head_dim)), the residual multiplier's fold on wo and w2 undone,
    no logit divisor."""
    cfg, state = ours.cfg, ours.state_dict()
    q_rows = cfg.n_heads * cfg.hd

    def undone(k: str, v: torch.Tensor, which: str) -> torch.Tensor:
        if which == "attention" and k.endswith("wqkv.weight"):
            return torch.cat([v[:q_rows] / (raw["attention_multiplier"] * cfg.hd**0.5), v[q_rows:]])
        if which == "residual" and k.endswith(("wo.weight", "w2.weight")):
            return v / raw["residual_multiplier"]
        return v

    wrong = {"embedding": (dataclasses.replace(cfg, embed_scale=1.0), state),
             "logits": (dataclasses.replace(cfg, logit_scale=1.0), state),
             **{which: (cfg, {k: undone(k, v, which) for k, v in state.items()})
                for which in ("attention", "residual")}}
    return built(wrong)


@pytest.mark.parametrize("case", GRANITE_CASES)
def test_granite_logits_equal_transformers(case, tmp_path):
    """Granite loads exactly: Llama's block with its embeddings times embedding_multiplier, scores scaled by
    attention_multiplier (folded into q's projection), each sublayer's output times residual_multiplier before its
    add (folded into o_proj and down_proj), the logits divided by logits_scaling; uncached, through a cache, and from
    the hf row's export (transformers' GraniteForCausalLM). Controls: each multiplier undone is visibly wrong."""
    theirs = granite_model(**GRANITE_CASES[case])
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    cfg = ours.cfg
    assert (cfg.embed_scale, cfg.logit_scale, cfg.ffn_act, cfg.sandwich_norms, cfg.qk_norm) == (
        12.0, 4.0, "silu", False, False)
    assert cfg.hd == (16 if case == "granite-head-dim" else 8) and cfg.tie_embeddings == (case == "granite-tied")
    x = tokens(60)
    assert_exact_and_exported(ours, theirs, x, "GraniteForCausalLM")
    for name, wrong in granite_controls(ours, GRANITE).items():
        assert (logits(wrong, x) - logits(theirs, x)).abs().max() > 1e-2, name


def test_a_granite_config_without_its_keys_takes_transformers_class_defaults(tmp_path):
    """Granite's class defaults: every multiplier 1 (scores times 1, not 1/sqrt(head_dim): the fold scales q by
    sqrt(head_dim)), one key/value head per query head, RoPE base 1e4, an untied head, a 2048 context, epsilon 1e-6,
    SwiGLU; such a folder still loads exactly."""
    raw = {k: v for k, v in SHAPE.items()
           if k not in ("rope_theta", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps")}
    theirs = transformers.GraniteConfig(**raw)
    cfg = hf_config({**raw, "architectures": ["GraniteForCausalLM"]})
    assert (cfg.n_kv_heads, cfg.tie_embeddings, cfg.max_seq_len, cfg.norm_eps) == (
        theirs.num_key_value_heads, theirs.tie_word_embeddings, theirs.max_position_embeddings,
        theirs.rms_norm_eps) == (4, False, 2048, 1e-6)
    assert cfg.rope_theta == theirs.rope_parameters["rope_theta"] == 1e4 and theirs.hidden_act == "silu"
    assert (cfg.embed_scale, cfg.logit_scale) == (theirs.embedding_multiplier, theirs.logits_scaling) == (1.0, 1.0)
    assert (theirs.attention_multiplier, theirs.residual_multiplier) == (1.0, 1.0)
    model = hf_model("GraniteForCausalLM", pad_token_id=0, bos_token_id=0, eos_token_id=0)
    config = json.loads(model.config.to_json_string())
    model.save_pretrained(tmp_path)
    multipliers = ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")
    stripped = {k: v for k, v in config.items() if k not in multipliers}  # left to the class
    (tmp_path / "config.json").write_text(json.dumps(stripped))
    assert_same(load(tmp_path), model, tokens(40))


@pytest.mark.parametrize("over,says", [(dict(qk_norm=True), "as Granite"), (dict(window=4, local_layers=(0,)),
                                                                            "as Granite"),
                                       (dict(logit_scale=2.0, sandwich_norms=True, ffn_act="gelu_tanh"), "as Granite")])
def test_a_block_that_granite_cannot_express_is_not_exported(over, says):
    """to_hf builds GraniteForCausalLM for Llama's block with an embedding scale or logit divisor only, and refuses
    a logit divisor in any other block (no other class of transformers' divides the logits)."""
    from tests.conftest import GRANITE as TINY_GRANITE, tiny_model

    with pytest.raises(ValueError, match=says):
        to_hf(tiny_model(0, **{**TINY_GRANITE, **over}))


def test_a_logit_scale_that_divides_by_nothing_is_one_line():
    from tests.conftest import tiny_config

    for value in (0.0, -2.0, float("inf"), "4"):
        with pytest.raises(ValueError, match="logit_scale .* is not a positive number") as err:
            tiny_config(logit_scale=value)
        assert "\n" not in str(err.value)


def test_granite_in_bfloat16_is_as_close_to_float32_as_transformers_bfloat16(tmp_path):
    """The folds round differently in bfloat16 (q's projection times attention * sqrt(head_dim), o_proj and down_proj
    times the residual multiplier, each rounded once at load, where transformers rounds each product of the forward);
    specgen's logits stay as near the float32 ones as transformers' own bfloat16 logits (measured: 0.017 against
    0.017 of logits up to 3)."""
    theirs = granite_model(tie_word_embeddings=True)
    theirs.save_pretrained(tmp_path)
    ours, x = load(tmp_path), tokens(100)
    exact = logits(theirs, x)
    ours_err = (logits(ours.to(torch.bfloat16), x).float() - exact).abs().max()
    theirs_err = (logits(theirs.to(torch.bfloat16), x).float() - exact).abs().max()
    assert ours_err < 2 * theirs_err


# the MoEs over SHAPE: 4 experts (the Qwen MoEs' of moe_intermediate_size 24), 2 a token; Qwen2-MoE's shared expert of
# 40; OLMoE's token ids inside the tiny vocabulary
MOE = {"MixtralForCausalLM": dict(num_local_experts=4, num_experts_per_tok=2),
       "Qwen3MoeForCausalLM": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24),
       "Qwen2MoeForCausalLM": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                   shared_expert_intermediate_size=40),
       "OlmoeForCausalLM": dict(num_experts=4, num_experts_per_tok=2, eos_token_id=None)}
MOE_CASES = {  # name -> (architecture, overrides, the export's class)
    "mixtral": ("MixtralForCausalLM", {}, "MixtralForCausalLM"),
    "mixtral-3-of-4": ("MixtralForCausalLM", dict(num_experts_per_tok=3, head_dim=16), "MixtralForCausalLM"),
    "qwen3-moe": ("Qwen3MoeForCausalLM", {}, "Qwen3MoeForCausalLM"),  # norm_topk_prob false (its class default)
    "qwen3-moe-renorm": ("Qwen3MoeForCausalLM", dict(norm_topk_prob=True), "Qwen3MoeForCausalLM"),
    "qwen3-moe-head-dim": ("Qwen3MoeForCausalLM", dict(norm_topk_prob=True, head_dim=16, tie_word_embeddings=True),
                           "Qwen3MoeForCausalLM"),
    # no experts: every layer Qwen3-MoE's dense MLP of intermediate_size, Qwen3's block (exported as Qwen3)
    "qwen3-moe-dense": ("Qwen3MoeForCausalLM", dict(num_experts=0), "Qwen3ForCausalLM"),
    # Qwen2-MoE: q/k/v biases (its qkv_bias, default true), a gated shared expert beside the routed ones
    "qwen2-moe": ("Qwen2MoeForCausalLM", {}, "Qwen2MoeForCausalLM"),  # norm_topk_prob false (its class default)
    "qwen2-moe-renorm-unbiased": ("Qwen2MoeForCausalLM", dict(norm_topk_prob=True, qkv_bias=False),
                                  "Qwen2MoeForCausalLM"),
    "qwen2-moe-dense": ("Qwen2MoeForCausalLM", dict(num_experts=0), "Qwen2ForCausalLM"),  # Qwen2's block
    # OLMoE: Llama's pre-norms, q and k normed over their whole projections (OLMo 2's), experts of intermediate_size
    "olmoe": ("OlmoeForCausalLM", {}, "OlmoeForCausalLM"),  # norm_topk_prob false (its class default)
    "olmoe-renorm": ("OlmoeForCausalLM", dict(norm_topk_prob=True, tie_word_embeddings=True), "OlmoeForCausalLM"),
}


def moe_model(arch: str, **over):
    """A random tiny transformers MoE (`MOE`'s experts): `hf_model`'s, its norms around 1."""
    return hf_model(arch, **{**MOE[arch], **over})


def moe_controls(ours: Transformer) -> dict[str, Transformer]:
    """The loaded model with one routing detail wrong each: the k weights' renormalisation flipped, one expert fewer
    and one more a token (a wrong top-k), the experts' order reversed (each expert's weights under another's index)."""
    cfg, state = ours.cfg, ours.state_dict()
    e = cfg.n_experts
    reversed_experts = {re_expert(k, e): v for k, v in state.items()}
    wrong = {"renorm": (dataclasses.replace(cfg, expert_renorm=not cfg.expert_renorm), state),
             "k-1": (dataclasses.replace(cfg, experts_per_token=cfg.experts_per_token - 1), state),
             "k+1": (dataclasses.replace(cfg, experts_per_token=cfg.experts_per_token + 1), state),
             "experts_reversed": (cfg, reversed_experts)}
    return built(wrong)


class Ungated(torch.nn.Module):
    """A shared expert's gate whose sigmoid is exactly 1 (+inf logits): the shared expert added unscaled."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_full((*x.shape[:-1], 1), math.inf)


def block_controls(ours: Transformer) -> dict[str, Transformer]:
    """The loaded model with one block detail of Qwen2-MoE's or OLMoE's wrong each: the shared expert ungated
    (`Ungated`) or dropped; q and k normed per head instead of over their whole projections (`PerHeadNorm`)."""
    cfg, state = ours.cfg, ours.state_dict()
    out = {}
    if cfg.shared_expert_dim:
        unshared = {k: v for k, v in state.items() if ".shared_expert" not in k}
        out = built({"ungated": (cfg, state),
                     "no_shared_expert": (dataclasses.replace(cfg, shared_expert_dim=0), unshared)})
        for blk in out["ungated"].layers:
            blk.feed_forward.shared_expert_gate = Ungated()
    if cfg.qk_norm_span == "all":
        out |= built({"per_head_norms": (cfg, state)})
        for blk in out["per_head_norms"].layers:
            att = blk.attention
            att.q_norm, att.k_norm = PerHeadNorm(att.q_norm, cfg.hd), PerHeadNorm(att.k_norm, cfg.hd)
    return out


def re_expert(name: str, e: int) -> str:
    """An expert's parameter name under the mirrored index (expert j -> e - 1 - j); other names as they are."""
    m = re.search(r"\.experts\.(\d+)\.", name)
    return name if m is None else name.replace(m.group(0), f".experts.{e - 1 - int(m.group(1))}.")


@pytest.mark.parametrize("case", MOE_CASES)
def test_moe_logits_equal_transformers(case, tmp_path):
    """The MoEs load exactly: each row's router softmax in float32, its top k, renormalised (Mixtral; the others where
    norm_topk_prob), the experts' SwiGLU outputs weighted and summed (Qwen2-MoE's: plus its shared expert's, scaled by
    the sigmoid of its gate); OLMoE's q and k normed over their whole projections; uncached, through a cache (the
    routed path at each chunk's rows), and from the hf row's export. Controls: each routing or block detail wrong is
    visibly wrong (the renormalisation, k, which weights are which expert's, the shared expert's gate or the expert
    itself, per-head q/k norms)."""
    arch, over, cls = MOE_CASES[case]
    theirs = moe_model(arch, **over)
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    cfg = ours.cfg
    dense, qwen2 = case.endswith("-dense"), arch == "Qwen2MoeForCausalLM"
    assert (cfg.n_experts, cfg.experts_per_token) == ((0, 0) if dense else (4, over.get("num_experts_per_tok", 2)))
    assert cfg.expert_renorm == (arch == "MixtralForCausalLM" or over.get("norm_topk_prob", False))
    assert cfg.expert_weight_round == (arch != "MixtralForCausalLM" and not dense)
    assert cfg.qk_norm == (arch in ("Qwen3MoeForCausalLM", "OlmoeForCausalLM")) and cfg.hd == over.get("head_dim", 8)
    assert cfg.qk_norm_span == ("all" if arch == "OlmoeForCausalLM" else "head")
    assert (cfg.qkv_bias, cfg.shared_expert_dim) == (qwen2 and over.get("qkv_bias", True), 40 if qwen2 and not dense
                                                     else 0)
    assert cfg.ffn_dim == (48 if dense or arch in ("MixtralForCausalLM", "OlmoeForCausalLM") else 24)
    x = tokens(60)
    assert_exact_and_exported(ours, theirs, x, cls)
    for name, wrong in ({} if dense else moe_controls(ours) | block_controls(ours)).items():
        assert (logits(wrong, x) - logits(theirs, x)).abs().max() > 1e-2, name


@pytest.mark.parametrize("arch,over", [("MixtralForCausalLM", dict(sliding_window=5)),
                                       ("Qwen3MoeForCausalLM", dict(use_sliding_window=True, sliding_window=5))])
def test_moe_sliding_windows_slide_every_layer(arch, over, tmp_path):
    """Mixtral's window (where set) and Qwen3-MoE's (with use_sliding_window) slide every layer, as their classes'
    masks; exact uncached, cached and exported; control: the same model unwindowed differs."""
    theirs = moe_model(arch, **over)
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    assert (ours.cfg.window, ours.cfg.local_layers) == (5, (0, 1))
    assert_windowed(ours, theirs)


def test_qwen2_moe_slides_its_classes_layers(tmp_path):
    """Qwen2-MoE's window (with use_sliding_window) slides the layers its class marks: every even one below
    max_window_layers (here 0 and 2 of 4), unlike Qwen2's; exact uncached, cached and exported; control: unwindowed."""
    theirs = moe_model("Qwen2MoeForCausalLM", use_sliding_window=True, sliding_window=5, num_hidden_layers=4,
                       max_window_layers=3)
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path)
    assert (ours.cfg.window, ours.cfg.local_layers) == (5, (0, 2))
    assert_windowed(ours, theirs)


@pytest.mark.parametrize("over", [dict(use_sliding_window=True, sliding_window=5), dict(sliding_window=5),
                                  dict(use_sliding_window=True, sliding_window=5, max_window_layers=3),
                                  dict(use_sliding_window=True, max_window_layers=0), dict(use_sliding_window=False)])
def test_qwen2_moe_sliding_layers_are_derived_as_its_class_derives_them(over):
    """Without layer_types (older config.json), the sliding layers and window are transformers 5's derivation: none
    without use_sliding_window, else the even layers below max_window_layers (default 28), window default 4096."""
    raw = {**SHAPE, **MOE["Qwen2MoeForCausalLM"], "architectures": ["Qwen2MoeForCausalLM"], "num_hidden_layers": 6,
           **over}
    theirs = transformers.Qwen2MoeConfig(**raw)
    marked = tuple(i for i, kind in enumerate(theirs.layer_types) if kind == "sliding_attention")
    cfg = hf_config(raw)
    assert (cfg.local_layers, cfg.window) == (marked, theirs.sliding_window if marked else 0)


def test_a_qwen3_moe_window_without_use_sliding_window_is_dropped_as_its_class_drops_it(tmp_path):
    raw = {**SHAPE, **MOE["Qwen3MoeForCausalLM"], "architectures": ["Qwen3MoeForCausalLM"], "sliding_window": 5}
    assert hf_config(raw).window == 0 and transformers.Qwen3MoeConfig(**raw).sliding_window is None


def test_moe_configs_without_their_keys_take_transformers_class_defaults():
    """Mixtral's class defaults: 8 experts, 2 a token, RoPE base 1e6, 8 key/value heads, epsilon 1e-5, a 131072
    context, untied; Qwen3-MoE's: 128 experts of 768, 8 a token, norm_topk_prob false, RoPE base 1e4, 4 key/value
    heads, epsilon 1e-6, a 32768 context, untied; Qwen2-MoE's: 60 experts of 1408, 4 a token, a shared expert of 5632,
    q/k/v biases, norm_topk_prob false, 16 key/value heads, epsilon 1e-6, a 32768 context; OLMoE's: 64 experts of
    intermediate_size, 8 a token, norm_topk_prob false, a key/value head per query head, epsilon 1e-5, a 4096 context;
    all untied, RoPE base 1e4 but Mixtral's, every layer routed."""
    keys = ("rope_theta", "num_key_value_heads", "max_position_embeddings", "rms_norm_eps")
    raw = {k: v for k, v in SHAPE.items() if k not in keys} | {"num_attention_heads": 16}
    for arch, want in (("MixtralForCausalLM", (8, 2, True, 48, 8, 1e6, 1e-5, 8192)),
                       ("Qwen3MoeForCausalLM", (128, 8, False, 768, 4, 1e4, 1e-6, 8192)),
                       ("Qwen2MoeForCausalLM", (60, 4, False, 1408, 16, 1e4, 1e-6, 8192)),
                       ("OlmoeForCausalLM", (64, 8, False, 48, 16, 1e4, 1e-5, 4096))):
        theirs = getattr(transformers, arch.replace("ForCausalLM", "Config"))(**raw)
        cfg = hf_config({**raw, "architectures": [arch]})
        width = getattr(theirs, "moe_intermediate_size", theirs.intermediate_size)
        renorm = getattr(theirs, "norm_topk_prob", True)  # Mixtral's router always renormalises
        assert (cfg.n_experts, cfg.experts_per_token, cfg.expert_renorm, cfg.ffn_dim, cfg.n_kv_heads, cfg.rope_theta,
                cfg.norm_eps, cfg.max_seq_len) == (
            theirs.num_experts, theirs.num_experts_per_tok, renorm, width, theirs.num_key_value_heads,
            theirs.rope_parameters["rope_theta"], theirs.rms_norm_eps, min(8192, theirs.max_position_embeddings)
        ) == want
        assert not cfg.tie_embeddings and not theirs.tie_word_embeddings and cfg.window == 0
        assert (cfg.shared_expert_dim, cfg.qkv_bias) == ((theirs.shared_expert_intermediate_size, theirs.qkv_bias)
                                                         if arch == "Qwen2MoeForCausalLM" else (0, False))


@pytest.mark.parametrize("arch,over,error,says", [
    ("Qwen3MoeForCausalLM", dict(mlp_only_layers=[1]), UsageError,
     r"sets mlp_only_layers=\[1\]: dense layers among routed ones are not implemented"),
    ("Qwen3MoeForCausalLM", dict(decoder_sparse_step=2), UsageError, "sets decoder_sparse_step=2: dense layers"),
    ("Qwen3MoeForCausalLM", dict(attention_bias=True), UsageError, "sets attention_bias=true: biases"),
    ("Qwen3MoeForCausalLM", dict(norm_topk_prob="yes"), CheckpointError, 'norm_topk_prob="yes": not true or false'),
    ("Qwen3MoeForCausalLM", dict(num_experts=-1), CheckpointError, "num_experts=-1: not a positive integer"),
    ("MixtralForCausalLM", dict(num_local_experts=0), CheckpointError, "num_local_experts=0: not a positive integer"),
    ("MixtralForCausalLM", dict(num_experts_per_tok=5), CheckpointError, "num_experts_per_tok=5: more than its 4"),
    ("MixtralForCausalLM", dict(num_experts_per_tok=0), CheckpointError, "num_experts_per_tok=0: not a positive"),
    ("MixtralForCausalLM", dict(hidden_act="gelu"), UsageError, "hidden_act=\"gelu\": specgen's MixtralForCausalLM"),
    ("Qwen2MoeForCausalLM", dict(mlp_only_layers=[0]), UsageError, r"sets mlp_only_layers=\[0\]: dense layers"),
    ("Qwen2MoeForCausalLM", dict(decoder_sparse_step=2), UsageError, "sets decoder_sparse_step=2: dense layers"),
    ("Qwen2MoeForCausalLM", dict(qkv_bias="yes"), CheckpointError, 'qkv_bias="yes": not true or false'),
    # transformers' class fails to decode both: no sliding mask without a window; a sliding layer's window of 0
    ("Qwen2MoeForCausalLM", dict(use_sliding_window=True, sliding_window=None), UsageError,
     "sets sliding_window=null: use_sliding_window without a window"),
    ("Qwen2MoeForCausalLM", dict(layer_types=["sliding_attention", "full_attention"]), UsageError,
     r'sets layer_types=\["full_attention", "sliding_attention"\]: sliding_attention layers without use_sliding'),
    ("OlmoeForCausalLM", dict(clip_qkv=8.0), UsageError, "sets clip_qkv=8.0: clamping q, k and v is not implemented"),
    ("OlmoeForCausalLM", dict(attention_bias=True), UsageError, "sets attention_bias=true: biases"),
    ("OlmoeForCausalLM", dict(sliding_window=16), UsageError, "sets sliding_window=16: transformers' OlmoeForCausalLM "
                                                              "slides only under flash attention"),
    ("OlmoeForCausalLM", dict(num_experts=0), CheckpointError, "num_experts=0: not a positive integer"),
    ("OlmoeForCausalLM", dict(norm_topk_prob=1), CheckpointError, "norm_topk_prob=1: not true or false"),
])
def test_a_moe_key_specgen_does_not_implement_is_one_line_naming_it(arch, over, error, says):
    raw = {**SHAPE, **MOE[arch], "architectures": [arch], **over}
    with pytest.raises(error, match=says) as err:
        hf_config(raw)
    assert "\n" not in str(err.value)


def test_training_only_router_keys_change_nothing():
    """Router aux loss, jitter noise (transformers applies it in training only) and output_router_logits: ignored."""
    for arch in MOE:
        raw = {**SHAPE, **MOE[arch], "architectures": [arch]}
        knobs = {"router_aux_loss_coef": 0.5, "router_jitter_noise": 0.1, "output_router_logits": True}
        assert hf_config(raw | knobs) == hf_config(raw)


@pytest.mark.parametrize("over,says", [
    (dict(n_experts=-1), "n_experts -1 is not a count"), (dict(n_experts=4), "experts_per_token 0 must be 1 to"),
    (dict(n_experts=4, experts_per_token=5), "experts_per_token 5 must be 1 to n_experts"),
    (dict(experts_per_token=2), "experts_per_token 2 must be 1 to n_experts \\(0\\) with experts, 0 without"),
    (dict(expert_renorm=True), "expert_renorm and expert_weight_round route experts: they need n_experts"),
    (dict(n_experts=4, experts_per_token=2, expert_renorm="yes"), "expert_renorm 'yes' is not true or false"),
    (dict(shared_expert_dim=8), "shared_expert_dim 8 must be a width .* beside routed experts"),
    (dict(n_experts=4, experts_per_token=2, shared_expert_dim=-1), "shared_expert_dim -1 must be a width"),
])
def test_expert_fields_that_build_no_block_are_one_line(over, says):
    from tests.conftest import tiny_config

    with pytest.raises(ValueError, match=says) as err:
        tiny_config(**over)
    assert "\n" not in str(err.value)


def test_a_routed_block_that_no_moe_class_expresses_is_not_exported():
    """to_hf exports routed experts as Mixtral (the k weights renormalised), Qwen2-MoE (a shared expert), Qwen3-MoE
    (per-head q/k norms) or OLMoE (whole-projection q/k norms): none has Gemma's gate, unrenormalised weights without
    q/k norms or a shared expert, a shared expert beside q/k norms, or OLMoE's norms with a window or biases."""
    from tests.conftest import MOE as TINY_MOE, OLMOE, tiny_model

    for over in (dict(TINY_MOE, ffn_act="gelu_tanh"), dict(TINY_MOE, expert_renorm=False),
                 dict(TINY_MOE, shared_expert_dim=16, qk_norm=True), dict(OLMOE, local_layers=(0,), window=4),
                 dict(OLMOE, qkv_bias=True)):
        with pytest.raises(ValueError, match="^to_hf exports routed experts as Mixtral .*, Qwen2-MoE .*, Qwen3-MoE"):
            to_hf(tiny_model(0, **over))


@pytest.mark.parametrize("arch,over", [("MixtralForCausalLM", {}), ("Qwen3MoeForCausalLM", dict(norm_topk_prob=True)),
                                       ("Qwen3MoeForCausalLM", {}), ("Qwen2MoeForCausalLM", {}),
                                       ("OlmoeForCausalLM", dict(norm_topk_prob=True))])
def test_a_bf16_moe_block_gives_transformers_bits(arch, over, tmp_path):
    """In bfloat16 a routed feed-forward is bitwise transformers' (its default experts forward, grouped_mm): router
    logits in the dtype, softmax in float32, top k, renormalised; Mixtral's products with the float32 weights and
    their sum in float32, rounded once; the others' weights rounded to the dtype first, products and sum in it
    (Qwen2-MoE's gated shared expert added in the dtype). The control: the other rounding order (expert_weight_round
    flipped) gives other bits."""
    theirs = moe_model(arch, **over)
    theirs.save_pretrained(tmp_path)
    ours = load(tmp_path).to(torch.bfloat16)
    theirs = theirs.to(torch.bfloat16)
    other = Transformer(dataclasses.replace(ours.cfg, expert_weight_round=not ours.cfg.expert_weight_round))
    other.load_state_dict(ours.state_dict())
    x = torch.randn(1, 50, 32, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.no_grad():
        want = theirs.model.layers[0].mlp(x)
        assert torch.equal(ours.layers[0].feed_forward(x), want)
        assert not torch.equal(other.to(torch.bfloat16).layers[0].feed_forward(x), want)
