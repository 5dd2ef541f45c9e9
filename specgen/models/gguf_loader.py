"""Llama-family weights from GGUF files (llama.cpp's), mapped as their HF folders are, loaded exactly or refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

from specgen.errors import CheckpointError, UsageError
from specgen.models.llama import (MAX_CONTEXT, Loaded, capped_context, count, folded, granite_scales,
                                  positive_number, remap, rope_scaling, suffix_scales, unfused)
from specgen.models.transformer import TransformerConfig

GGUF_LAYOUTS = {"llama": "interleaved", "qwen2": "half", "qwen3": "half", "phi3": "half", "smollm3": "interleaved",
                "gemma": "half", "gemma2": "half", "gemma3": "half", "olmo2": "half",
                "granite": "interleaved",  # granite: llama.cpp's NORM RoPE, q/k permuted by its (Llama's) converter
                "qwen3moe": "half", "qwen2moe": "half", "olmoe": "half", "exaone4": "half"}
# an architecture -> llama.cpp's fixed NoPE step: layer i attends without RoPE when (i + 1) % step == 0. No GGUF key
# holds it (llama.cpp's loader sets it), so an HF no_rope_layers of another pattern is lost in the conversion
NOPE_STEP = {"smollm3": 4}
# gemma3 as llama.cpp's loader fixes it (no GGUF key holds these): every layer but each sixth slides, with RoPE base
# 1e4 unscaled; the attention scale is 1/sqrt(head size), 1/sqrt(hidden / heads) for the 62-layer 27B
GEMMA3_STEP, GEMMA3_LOCAL_THETA, GEMMA3_27B_LAYERS = 6, 10000.0, 62
# gemma2 as llama.cpp's loader fixes it: every other layer slides, layer 0 first (swa pattern 2), over 4096 positions
# unless the file says; both caps on (50 and 30 unless the file says); the attention scale 1/sqrt(head size),
# 1/sqrt(hidden / heads) for the 46-layer 27B
GEMMA2_WINDOW, GEMMA2_CAPS, GEMMA2_27B_LAYERS = 4096, {"attn_logit_softcapping": 50.0,
                                                       "final_logit_softcapping": 30.0}, 46
# exaone4 as llama.cpp's loader fixes it (its switch on the layer count): the 64-layer 32B slides every layer but each
# fourth over 4096 positions unless the file says (the others NoPE); any other count attends fully with RoPE everywhere
EXAONE4_32B_LAYERS, EXAONE4_STEP, EXAONE4_WINDOW = 64, 4, 4096
GGUF_SCALING_KEYS = ("type", "factor", "original_context_length", "yarn_beta_fast", "yarn_beta_slow", "finetuned")


def gguf_field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def gguf_count(reader, key: str, source: str, default: int | None = None) -> int:
    """A count of the GGUF by config.json's rule (llama.count): carried into the entry, another value would break at
    its first use; a key without a default must be there."""
    value = gguf_field(reader, key, default)
    if value is None:
        raise CheckpointError(f"GGUF file {source} lacks {key}")
    return count(key, value, f"GGUF file {source}")


def gguf_positive(reader, key: str, source: str, default: float) -> float:
    return positive_number(key, gguf_field(reader, key, default), f"GGUF file {source}")


def gguf_rope_scaling(reader, arch: str, context: int, source: str, per_frequency: dict[str, list | None]
                      ) -> dict | None:
    """TransformerConfig.rope_scaling of a GGUF's RoPE: Llama 3's from its `rope_freqs.weight` (`per_frequency`'s
    "freqs": one divisor a frequency, llama.cpp's); the `{arch}.rope.scaling.*` keys read as the HF `rope_scaling` keys
    llama.cpp's converter wrote them from: linear and YaRN, whose llama.cpp defaults are transformers' (beta_fast 32,
    beta_slow 1, attention factor 0.1 ln s + 1, the training context as the original); LongRoPE (Phi-3) from its
    factor tensors ("short", "long"), the attention factor and original context the converter computed. Another
    type, or a key of llama.cpp's own (a YaRN attention or extrapolation factor, DeepSeek's log multiplier), is
    refused."""
    if per_frequency["freqs"] is not None:
        return {"rope_type": "factors", "factors": per_frequency["freqs"]}
    key = f"{arch}.rope.scaling"
    kind, factor = gguf_field(reader, f"{key}.type", "none"), gguf_field(reader, f"{key}.factor")
    own = [k for k in reader.fields if k.startswith(f"{key}.") and k[len(key) + 1:] not in GGUF_SCALING_KEYS]
    longrope = {x: per_frequency[x] for x in ("short", "long")}
    if any(f is not None for f in longrope.values()) and kind in ("none", "longrope"):
        if None in longrope.values():
            raise CheckpointError(f"GGUF file {source} holds one of rope_factors_short/long.weight; LongRoPE needs "
                                  "both")
        original = int(gguf_field(reader, f"{key}.original_context_length", context))
        return {"rope_type": "longrope", "short_factor": longrope["short"], "long_factor": longrope["long"],
                "attention_factor": float(gguf_field(reader, f"{key}.attn_factor", 1.0)),
                "original_max_position_embeddings": original}
    if kind == "none" and not own:
        return None
    if kind not in ("linear", "yarn") or own or not isinstance(factor, (int, float)) or not factor > 0:
        what = (f"{key}.type={kind}" if kind not in ("linear", "yarn") else own[0] if own else
                f"{key}.factor={factor}")
        raise UsageError(f"GGUF file {source} sets {what}, which specgen's GGUF loader does not map; import the HF "
                         "folder instead (docs/architectures.md)")
    params = {"rope_type": kind, "factor": float(factor),
              "original_max_position_embeddings": gguf_field(reader, f"{key}.original_context_length"),
              "beta_fast": gguf_field(reader, f"{key}.yarn_beta_fast"),
              "beta_slow": gguf_field(reader, f"{key}.yarn_beta_slow")}
    return rope_scaling({"rope_scaling": {k: v for k, v in params.items() if v is not None}}, context)[0]


def gemma3_fields(reader, source: str, dim: int, n_layers: int) -> dict:
    """The TransformerConfig fields a gemma3 GGUF adds to Llama's, as llama.cpp builds the model: GeGLU, sandwich
    norms (their weights stored with Gemma's + 1 added by the converter), the sqrt(dim) embedding scale, local layers
    (GEMMA3_STEP) with their fixed base. A softcapping key, or a local base or layer pattern other than the fixed ones
    (which llama.cpp would ignore), is refused: the file says another model than llama.cpp runs."""
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if gguf_field(reader, f"gemma3.{key}"):
            raise UsageError(f"GGUF file {source} sets gemma3.{key}: a gemma3 GGUF's softcapping is not mapped; "
                             "import the HF folder")
    local = [(i + 1) % GEMMA3_STEP != 0 for i in range(n_layers)]
    base = gguf_field(reader, "gemma3.rope.freq_base_swa", GEMMA3_LOCAL_THETA)
    pattern = gguf_field(reader, "gemma3.attention.sliding_window_pattern", local)
    if base != GEMMA3_LOCAL_THETA or pattern != local:  # (an array of one bool a layer, as gguf writes it)
        key = "rope.freq_base_swa" if base != GEMMA3_LOCAL_THETA else "attention.sliding_window_pattern"
        raise UsageError(f"GGUF file {source} sets gemma3.{key}, which llama.cpp's gemma3 loader fixes "
                         f"({GEMMA3_LOCAL_THETA:g} and every {GEMMA3_STEP}th layer global): import the HF folder")
    return {"ffn_act": "gelu_tanh", "sandwich_norms": True, "embed_scale": dim**0.5,
            "local_layers": tuple(i for i, slides in enumerate(local) if slides),
            "local_rope_theta": GEMMA3_LOCAL_THETA}


def llama_cpp_q_scale(cfg: TransformerConfig, layers_27b: int, suffix: str
                      ) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """A gemma2 or gemma3 GGUF tensor as specgen's model reads it: the tensor `suffix` names (gemma2: q's projection;
    gemma3: q's norm) times sqrt(head size / the size llama.cpp scales scores by) (1 but for the 27B, whose layer count
    is `layers_27b`: heads of 128 scaled by hidden / heads = 144, transformers' query_pre_attn_scalar), so the kernels'
    1/sqrt(head size) scores are llama.cpp's (gemma2's cap takes them after)."""
    scalar = cfg.dim // cfg.n_heads if cfg.n_layers == layers_27b else cfg.hd
    return suffix_scales({suffix: (cfg.hd / scalar) ** 0.5})


def gemma2_fields(reader, source: str, dim: int, n_layers: int) -> dict:
    """The TransformerConfig fields a gemma2 GGUF adds to Llama's, as llama.cpp builds the model: GeGLU, sandwich norms
    (their weights stored with Gemma's + 1 added by the converter), the sqrt(dim) embedding scale, the even layers
    sliding over `gemma2.attention.sliding_window` (default GEMMA2_WINDOW), one RoPE base, and the two caps it always
    applies (`gemma2.attn_logit_softcapping`, `gemma2.final_logit_softcapping`; a cap of 0 or less is refused)."""
    caps = {key: gguf_positive(reader, f"gemma2.{key}", source, default) for key, default in GEMMA2_CAPS.items()}
    return {"ffn_act": "gelu_tanh", "sandwich_norms": True, "embed_scale": dim**0.5,
            "local_layers": tuple(range(0, n_layers, 2)),
            "window": gguf_field(reader, "gemma2.attention.sliding_window", GEMMA2_WINDOW),  # (checked by the caller)
            "attn_softcap": caps["attn_logit_softcapping"], "logit_softcap": caps["final_logit_softcapping"]}


def window_fields(window: int | None, extra: dict) -> dict:
    """The sliding window's TransformerConfig field where the architecture's fields place its layers (gemma3's
    local_layers, llama.cpp's SWA layers); {} otherwise (no window, or layers specgen cannot name)."""
    return {"window": window} if window is not None and extra.get("local_layers") else {}


def gemma_fields(reader, source: str, dim: int, n_layers: int) -> dict:
    """The TransformerConfig fields a gemma (Gemma 1) GGUF adds to Llama's, as llama.cpp builds the model: GeGLU and
    the sqrt(dim) embedding scale (its norms stored with Gemma's + 1 added by the converter)."""
    return {"ffn_act": "gelu_tanh", "embed_scale": dim**0.5}


def olmo2_fields(reader, source: str, dim: int, n_layers: int) -> dict:
    """The TransformerConfig fields an olmo2 GGUF adds to Llama's, as llama.cpp builds the model: no norm before the
    sublayers, each output normed before its add (post_attention_norm, post_ffw_norm), q's and k's norms over their
    whole projections (attn_q_norm [dim], attn_k_norm [Hkv hd]), NEOX RoPE (GGUF_LAYOUTS). A sliding window makes
    llama.cpp slide some layers (OLMo 3's), which is refused."""
    if gguf_field(reader, "olmo2.attention.sliding_window") is not None:
        raise UsageError(f"GGUF file {source} sets olmo2.attention.sliding_window: llama.cpp's olmo2 then slides "
                         "some layers (an OLMo 3 model), which specgen's GGUF loader does not map")
    return {"pre_norms": False, "sandwich_norms": True, "qk_norm_span": "all"}


def exaone4_fields(reader, source: str, dim: int, n_layers: int) -> dict:
    """The TransformerConfig fields an exaone4 GGUF adds to Qwen3's (per-head q/k norms), as llama.cpp builds the
    model: no norm before the sublayers, each output normed before its add (post_attention_norm, post_ffw_norm), NEOX
    RoPE (GGUF_LAYOUTS); the 64-layer 32B's layers sliding but each fourth (EXAONE4_STEP) over
    `exaone4.attention.sliding_window` (default EXAONE4_WINDOW), the others without RoPE. A window or layer pattern
    other than that fixed one is refused: llama.cpp's loader ignores it (the file says another model than it runs)."""
    window, pattern = (gguf_field(reader, f"exaone4.attention.{key}")
                       for key in ("sliding_window", "sliding_window_pattern"))
    local = [(i + 1) % EXAONE4_STEP != 0 for i in range(n_layers)] if n_layers == EXAONE4_32B_LAYERS else None
    if (window is not None and local is None) or (pattern is not None and pattern != local):
        key = "sliding_window" if pattern is None else "sliding_window_pattern"
        raise UsageError(f"GGUF file {source} sets exaone4.attention.{key}, which llama.cpp's exaone4 loader ignores "
                         f"(it slides all layers but each {EXAONE4_STEP}th of a {EXAONE4_32B_LAYERS}-layer model, no "
                         "other's): import the HF folder")
    post_norms = {"pre_norms": False, "sandwich_norms": True}
    if local is None:
        return post_norms
    return post_norms | {"local_layers": tuple(i for i, slides in enumerate(local) if slides),
                         "nope_layers": tuple(i for i, slides in enumerate(local) if not slides),
                         "window": EXAONE4_WINDOW if window is None else window}  # (checked by the caller)


def granite_scale(reader, key: str, source: str) -> float | None:
    """A granite GGUF's multiplier `key` as llama.cpp reads it: absent or 0 is its default (None here; the converter
    writes only the set ones), any other value a positive number (a negative one is refused)."""
    value = gguf_field(reader, key)
    return None if value in (None, 0) else positive_number(key, value, f"GGUF file {source}")


def granite_fields(reader, source: str, dim: int, n_layers: int) -> dict:
    """The TransformerConfig fields a granite GGUF adds to Llama's, as llama.cpp's granite builds the model: the
    embeddings times `granite.embedding_scale` (default 1), the logits divided by `granite.logit_scale` (required:
    llama.cpp refuses a file without it). `granite.rope.scaling.finetuned` false turns RoPE off (llama.cpp's switch),
    which is refused. Its attention and residual scales: granite_fold."""
    logit = gguf_field(reader, "granite.logit_scale")
    if logit is None:
        raise CheckpointError(f"GGUF file {source} lacks granite.logit_scale (llama.cpp requires it)")
    if not gguf_field(reader, "granite.rope.scaling.finetuned", True):
        raise UsageError(f"GGUF file {source} sets granite.rope.scaling.finetuned=false: llama.cpp's granite then "
                         "applies no RoPE, which specgen's GGUF loader does not map")
    return {"embed_scale": granite_scale(reader, "granite.embedding_scale", source) or 1.0,
            "logit_scale": positive_number("granite.logit_scale", logit, f"GGUF file {source}")}


def granite_fold(cfg: TransformerConfig, reader, source: str) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """A granite GGUF tensor as specgen's model reads it (the converter stores HF's weights unscaled): llama.py's
    `granite_scales` of `granite.attention.scale` (absent or 0: llama.cpp's 1/sqrt(head size), no fold) and
    `granite.residual_scale` (absent or 0: llama.cpp scales nothing)."""
    attention = granite_scale(reader, "granite.attention.scale", source) or cfg.hd**-0.5
    residual = granite_scale(reader, "granite.residual_scale", source) or 1.0
    return granite_scales(cfg, attention, residual, ("attn_q.weight", "attn_output.weight", "ffn_down.weight"))


#: the architectures whose routed GGUFs load -> (the key of their experts' width, whether llama.cpp's graph
#: renormalises the k weights: its build_moe_ffn's fixed norm_w, whatever the HF config's norm_topk_prob was): llama
#: (Mixtral: its feed-forward length, renormalised), qwen3moe (renormalised), qwen2moe and olmoe (not), every layer
#: routed, as llama.cpp's graphs build them
ROUTED = {"llama": ("feed_forward_length", True), "qwen3moe": ("expert_feed_forward_length", True),
          "qwen2moe": ("expert_feed_forward_length", False), "olmoe": ("feed_forward_length", False)}


def expert_fields(reader, arch: str, source: str) -> dict:
    """A routed GGUF's fields (`<arch>.expert_count` set: ROUTED's architectures): E experts, `expert_used_count` a
    token, the k weights renormalised or not as llama.cpp's graph does (ROUTED), scaled in float32 (softmax gating);
    {} without experts. A weight scale other than 1 is refused, and so is an `expert_weights_norm` other than the
    graph's (which it never reads: the file says another model than llama.cpp runs)."""
    if not gguf_field(reader, f"{arch}.expert_count"):
        return {}
    if gguf_field(reader, f"{arch}.expert_weights_scale", 0.0) not in (0, 1):
        raise UsageError(f"GGUF file {source} sets {arch}.expert_weights_scale="
                         f"{gguf_field(reader, f'{arch}.expert_weights_scale')}: scaled expert weights are not "
                         "implemented")
    renorm = ROUTED[arch][1]
    if gguf_field(reader, f"{arch}.expert_weights_norm", renorm) != renorm:
        raise UsageError(f"GGUF file {source} sets {arch}.expert_weights_norm={str(not renorm).lower()}: llama.cpp's "
                         f"{arch} graph {'always' if renorm else 'never'} renormalises the k expert weights (it reads "
                         "no such key), so the file says another model than llama.cpp runs; import the HF folder")
    return {"n_experts": gguf_count(reader, f"{arch}.expert_count", source),
            "experts_per_token": gguf_count(reader, f"{arch}.expert_used_count", source), "expert_renorm": renorm}


def qwen2moe_fields(reader, source: str, dim: int, n_layers: int) -> dict:
    """The TransformerConfig field a qwen2moe GGUF adds to Qwen2's (q/k/v biases where the file holds them): its shared
    expert, of `qwen2moe.expert_shared_feed_forward_length` (else the feed-forward length, as llama.cpp reads it)."""
    key = "qwen2moe.expert_shared_feed_forward_length"
    return {"shared_expert_dim": gguf_count(reader, key, source, gguf_field(reader, "qwen2moe.feed_forward_length"))}


def shared_gate_rows(name: str, t: torch.Tensor) -> torch.Tensor:
    """A qwen2moe tensor as specgen's model reads it: the shared expert's gate, stored [dim] (llama.cpp's shape) or
    [1, dim], as the Linear's [1, dim]; the others as they are."""
    return t.reshape(1, -1) if name.endswith("ffn_gate_inp_shexp.weight") and t.dim() == 1 else t


def expert_slices(cfg: TransformerConfig, names: set[str], stored: Callable[[str], torch.Tensor | None], source: str
                  ) -> tuple[set[str], Callable[[str], torch.Tensor | None]]:
    """A GGUF's tensor names and getter with each [E, out, in] expert stack (`ffn_{gate,up,down}_exps.weight`) seen
    as its E slices (`llama.EXPERT_NAMES`: the stack's name, a dot, the expert): a stack read once for its slices
    (asked one after another), its shape checked against cfg."""
    stacks = {n for n in names if n.endswith("_exps.weight")} if cfg.n_experts else set()
    held: dict[str, torch.Tensor] = {}

    def get(name: str) -> torch.Tensor | None:
        whole, _, e = name.rpartition(".")
        if whole not in stacks:
            return stored(name)
        if whole not in held:
            held.clear()
            held[whole] = stored(whole)
        if held[whole].dim() != 3 or held[whole].shape[0] != cfg.n_experts:
            raise CheckpointError(f"{source}: tensor {whole} has shape {list(held[whole].shape)}; its config gives "
                                  f"{cfg.n_experts} experts [E, out, in]")
        return held[whole][int(e)]

    return (names - stacks) | {f"{n}.{e}" for n in stacks for e in range(cfg.n_experts)}, get


#: an architecture -> (its TransformerConfig fields beyond Llama's, how its tensors become specgen's (cfg, reader,
#: file name -> fold); None: as stored)
GGUF_FIELDS = {
    "gemma": (gemma_fields, None),
    "gemma2": (gemma2_fields, lambda cfg, *_: llama_cpp_q_scale(cfg, GEMMA2_27B_LAYERS, "attn_q.weight")),
    "gemma3": (gemma3_fields, lambda cfg, *_: llama_cpp_q_scale(cfg, GEMMA3_27B_LAYERS, "attn_q_norm.weight")),
    "olmo2": (olmo2_fields, None), "granite": (granite_fields, granite_fold), "exaone4": (exaone4_fields, None),
    "qwen2moe": (qwen2moe_fields, lambda *_: shared_gate_rows),
    "olmoe": (lambda *_: {"qk_norm_span": "all"}, None)}  # OLMoE: q's and k's norms over their whole projections


def load_gguf(path: Path, progress: Callable[[int, int], None] | None = None) -> Loaded:
    """A GGUF file (any quantisation the `gguf` package can dequantise) as float32 weights."""
    from gguf import GGUFReader  # deferred: start-up (gguf loads numpy's bits; only a GGUF import needs it)
    from gguf.quants import dequantize

    try:
        reader = GGUFReader(str(path))
        arch = gguf_field(reader, "general.architecture")
    except Exception as e:  # the gguf package raises ValueError/struct errors on bad files
        raise CheckpointError(f"cannot parse GGUF file {path}: {e} (truncated, or not a GGUF file: fetch it again)"
                              ) from None
    if arch is None:  # a GGUF holds a model's weights under its architecture's names, or other data
        raise UsageError(f"GGUF file {path.name} names no general.architecture: not a model's weights")
    experts = gguf_field(reader, f"{arch}.expert_count")
    if experts and arch not in ROUTED:  # another architecture's routing as llama.cpp builds it is not mapped here
        raise UsageError(f"GGUF file {path.name} sets {arch}.expert_count={experts}: a mixture of experts; specgen "
                         f"loads routed GGUFs of {', '.join(ROUTED)} only")
    if arch not in GGUF_LAYOUTS:
        raise UsageError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(GGUF_LAYOUTS)}")
    tensors = {t.name: t for t in reader.tensors}
    n_heads = gguf_count(reader, f"{arch}.attention.head_count", path.name)
    dim = gguf_count(reader, f"{arch}.embedding_length", path.name)
    # no key_length: the head size is dim // n_heads, and where that is 0 the file lacks the key that gives it
    head_dim = gguf_count(reader, f"{arch}.attention.key_length", path.name, dim // n_heads or None)
    rotary = gguf_field(reader, f"{arch}.rope.dimension_count", head_dim)
    if type(rotary) is not int or rotary < 0:  # 0 is a count here: refused below with what it would mean
        raise CheckpointError(f"GGUF file {path.name} sets {arch}.rope.dimension_count={json.dumps(rotary)}: not a "
                              "count of rotary dims")
    # phi3: Phi-4-mini's partial RoPE, as transformers' Phi-3 computes it; no rotary dim at all would be rope_dim 0,
    # which TransformerConfig reads as whole heads (odd or too many dims: its ValueError below)
    if rotary != head_dim and (arch != "phi3" or rotary < 1):
        raise UsageError(f"GGUF file {path.name} sets {arch}.rope.dimension_count={rotary} for a head size of "
                         f"{head_dim} (partial RoPE), which specgen implements for phi3, over some of a head's dims "
                         "(docs/architectures.md)")
    context = gguf_count(reader, f"{arch}.context_length", path.name, 2048)
    # one number a frequency: Llama 3's divisors, Phi-3's LongRoPE factors (tensors the model has no place for)
    per_frequency = {x: tensors.pop(name, None) for x, name in (("freqs", "rope_freqs.weight"),
                                                                ("short", "rope_factors_short.weight"),
                                                                ("long", "rope_factors_long.weight"))}
    per_frequency = {x: None if t is None else dequantize(t.data, t.tensor_type).reshape(-1).tolist()
                     for x, t in per_frequency.items()}
    scaling = gguf_rope_scaling(reader, arch, context, path.name, per_frequency)
    window = gguf_field(reader, f"{arch}.attention.sliding_window")
    if window is not None and (type(window) is not int or window < 1):
        raise UsageError(f"GGUF file {path.name} sets {arch}.attention.sliding_window={window}: not a positive window")
    n_layers = gguf_count(reader, f"{arch}.block_count", path.name)
    step = NOPE_STEP.get(arch)
    nope = {"nope_layers": tuple(i for i in range(n_layers) if (i + 1) % step == 0)} if step else {}
    fields, fold = GGUF_FIELDS.get(arch, (lambda *_: {}, None))
    extra = fields(reader, path.name, dim, n_layers) | expert_fields(reader, arch, path.name)
    # the window slides the layers the architecture names (gemma3's local ones: `window_fields`); for another
    # architecture, whose sliding layers specgen does not place, it still caps the context (full attention below it)
    slides = window_fields(window, extra)
    try:
        cfg = TransformerConfig(
            vocab_size=int(tensors["token_embd.weight"].shape[-1]), dim=dim, n_layers=n_layers, n_heads=n_heads,
            n_kv_heads=gguf_count(reader, f"{arch}.attention.head_count_kv", path.name, n_heads),
            ffn_dim=gguf_count(reader, f"{arch}.{ROUTED[arch][0] if arch in ROUTED else 'feed_forward_length'}",
                               path.name),
            head_dim=0 if head_dim == dim // n_heads else head_dim,  # 0: dim // n_heads, as before key_length was read
            norm_eps=gguf_positive(reader, f"{arch}.attention.layer_norm_rms_epsilon", path.name, 1e-5),
            rope_theta=gguf_positive(reader, f"{arch}.rope.freq_base", path.name, 10000.0),
            rope_layout=GGUF_LAYOUTS[arch],
            max_seq_len=min(capped_context(context, scaling), window if window and not slides else MAX_CONTEXT),
            qkv_bias="blk.0.attn_q.bias" in tensors, tie_embeddings="output.weight" not in tensors,
            qk_norm="blk.0.attn_q_norm.weight" in tensors,  # Qwen3's per-head norms of q and k (olmo2: whole)
            rope_scaling=scaling, rope_dim=0 if rotary == head_dim else rotary,
            **(nope | extra | slides),
        )
    except ValueError as e:  # RoPE factors of another length than the rotary frequencies, or not positive; odd dims
        raise CheckpointError(f"GGUF file {path.name}: {e}") from None
    done = iter(range(1, len(tensors) + 1))  # tensors converted so far

    def stored(name: str) -> torch.Tensor | None:
        t = tensors.get(name)
        if t is None:
            return None
        data = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).float()
        if progress:
            progress(next(done), len(tensors))
        return data

    names, get = unfused(arch, "gguf", cfg, *expert_slices(cfg, set(tensors), stored, path.name), path.name)
    if fold is not None:
        get = folded(get, fold(cfg, reader, path.name))
    return Loaded(cfg, remap(cfg, names, get, "gguf", path.name), context)  # remap: refuses a stray tensor
