"""Built-in distilled targets merge their shipped adapter at its recorded merge_scale (text/merge.py)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from specgen import builtins, checkpoints, registry
from specgen.errors import UsageError
from specgen.text.merge import merge_scale
from tests.pcllm_fixtures import save_tiny_text


def test_builtin_merges_at_the_shipped_merge_scale(tmp_path, monkeypatch):
    base = save_tiny_text()
    key = next(k for k in registry.read_state(base) if k.endswith("wqkv.weight"))
    w = registry.read_state(base)[key]  # [out, in]
    a, b = torch.randn(2, w.shape[1]), torch.randn(w.shape[0], 2)  # rank 2
    folder = tmp_path / "text" / "tiny-shipped"
    folder.mkdir(parents=True)
    save_file({f"{key.rsplit('.', 1)[0]}.lora_A": a, f"{key.rsplit('.', 1)[0]}.lora_B": b}, str(folder / "adapter.safetensors"))
    (folder / "adapter.json").write_text(json.dumps({"parent": base.ref, "lora_rank": 2, "lora_alpha": 4.0,
                                                     "merge_scale": 0.25, "vocab_size": 64}))
    monkeypatch.setattr(builtins, "ASSETS", tmp_path)
    monkeypatch.setattr(builtins, "asset_fingerprint", lambda folder: "test")
    builtins.derive("lora-merge", "tiny-shipped", None)  # as the built-ins table calls it
    entry = checkpoints.find("target/tiny-shipped")
    assert entry.meta["merge_scale"] == 0.25 and entry.meta["distilled_from"] == base.ref
    torch.testing.assert_close(registry.read_state(entry)[key], w + 0.25 * (4.0 / 2) * b @ a)


def test_merge_scale_rule():
    assert merge_scale({}) == 1.0 and merge_scale({"merge_scale": 0.5}) == 0.5 and merge_scale({"merge_scale": 0.5}, 0) == 0
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(UsageError, match="merge scale"):
            merge_scale({}, bad)
