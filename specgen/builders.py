"""Builders: registry `config.json` "builder" name -> function(**kwargs) -> nn.Module."""

from __future__ import annotations

from typing import Callable

import torch

from specgen.models.classifier import ImageClassifier
from specgen.models.eagle import EagleNet
from specgen.models.heads import XSpecMeshHeads
from specgen.models.llamagen import llamagen_kwargs, llamagen_state
from specgen.models.mesh import MeshGPT
from specgen.models.quantize import build_quantized_transformer
from specgen.models.transformer import Transformer, TransformerConfig
from specgen.models.upsampler import UpDownSampler, UpsamplerConfig
from specgen.models.vq import VQConfig, VQModel

BUILDERS: dict[str, Callable[..., torch.nn.Module]] = {
    "transformer": lambda **kwargs: Transformer(TransformerConfig(**kwargs)),
    "mesh_gpt": MeshGPT,
    "xspecmesh_heads": XSpecMeshHeads,
    # LlamaGen c2i/t2i GPT (2D RoPE + class/caption embedding): stored as full fields (IMPORTED_FORMS expands imports)
    "llamagen-gpt": lambda **kwargs: Transformer(TransformerConfig(**kwargs)),
    "eagle": lambda **kwargs: EagleNet(TransformerConfig(**kwargs)),  # one-layer EAGLE feature drafter (n_layers = 1)
    "vq": lambda **kwargs: VQModel(VQConfig(**kwargs)),  # LlamaGen-compatible VQ tokenizer
    "image-classifier": ImageClassifier,  # CNN whose features give the image benchmark's FID (`widths`: a JSON list)
    "mulo-updown": lambda **kwargs: UpDownSampler(UpsamplerConfig(**kwargs)),  # MuLo-SD row-causal up/down pair
    "quantized-transformer": build_quantized_transformer,  # int8/int4 weight-only text target (models/quantize.py)
}

# builder -> (kwargs -> the full kwargs stored in the registry (short forms such as LlamaGen's call-site args),
# (state, kwargs) -> the state under the builder's names (LlamaGen containers, stray freqs_cis / kv_cache, LANTERN HF))
IMPORTED_FORMS: dict[str, tuple[Callable[[dict], dict], Callable[[dict, dict], dict]]] = {
    "llamagen-gpt": (llamagen_kwargs, llamagen_state),
}

IMAGE_BUILDERS = ("llamagen-gpt",)  # imports of these are image targets (modality "image", grid, optional VQ)
