"""Tiny text targets (random weights, 64-character tokenizer) and tiny trajectory folders for the pcLLM tests."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import torch

from specgen import registry
from tests.conftest import tiny_model

PROMPTS = [f"PROMPT {c} NUMBER {i}" for i, c in enumerate("ABCDEFGH")]


def char_tokenizer(eos: str = "_"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({chr(i): i - 32 for i in range(32, 96)}, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="?", eos_token=eos)


@functools.cache
def tiny_text_parts(seed: int, eos: str):
    """(weights, config, tokenizer, torch's generator state after the build) of a tiny text target, built once."""
    model = tiny_model(seed, max_seq_len=1024)  # room for a HumanEval prompt in characters
    return model.state_dict(), model.cfg.to_dict(), char_tokenizer(eos), torch.get_rng_state()


def save_tiny_text(name: str = "tiny-text", seed: int = 0, eos: str = "_") -> registry.Entry:
    state, cfg, hf, rng = tiny_text_parts(seed, eos)
    torch.set_rng_state(rng)  # as after building the model (it seeds the global generator): tests may draw next
    meta = {"builder": "transformer", "kwargs": cfg, "vocab_size": 64, "modality": "text", "tokenizer": True}
    return registry.save("target", name, state, meta, extra=lambda d: hf.save_pretrained(str(d)), force=True)


def write_prompts(folder: Path, prompts=PROMPTS) -> Path:
    path = Path(folder) / "prompts.txt"
    path.write_text("\n".join(prompts) + "\n")
    return path


def collect_tiny(out: Path, prompts: Path, model: str = "tiny-text", block_size: int = 4, max_new_tokens: int = 16):
    from specgen.text.trajectories import CollectConfig, collect

    return collect(CollectConfig(model=model, prompts=str(prompts), block_size=block_size,
                                 max_new_tokens=max_new_tokens, chat=False, shard_every=2), out)


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
