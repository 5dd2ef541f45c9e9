"""Builders: registry `config.json` "builder" name -> function(**kwargs) -> nn.Module."""

from __future__ import annotations

from typing import Callable

import torch

from specgen.models.transformer import Transformer, TransformerConfig


def build_transformer(**kwargs) -> Transformer:
    return Transformer(TransformerConfig(**kwargs))


BUILDERS: dict[str, Callable[..., torch.nn.Module]] = {
    "transformer": build_transformer,
}

# builder -> function(state, kwargs) mapping an external layout's keys onto the builder's names
CONVERTERS: dict[str, Callable[[dict, dict], dict]] = {}
