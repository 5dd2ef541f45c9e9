"""Text tokenizer with chat template: a thin wrapper over an HF fast tokenizer saved next to the weights."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from specgen.errors import CheckpointError


@dataclass
class TextTokenizer:
    """Encodes prompts (with the model's chat template by default) and decodes completions."""

    hf: object  # transformers tokenizer

    @classmethod
    def load(cls, folder: Path) -> "TextTokenizer":
        from transformers import AutoTokenizer

        try:
            return cls(AutoTokenizer.from_pretrained(str(folder), local_files_only=True))
        except Exception as e:  # transformers raises many types for a broken folder
            raise CheckpointError(f"cannot load the tokenizer in {folder}: {e}") from None

    @property
    def stop_ids(self) -> tuple[int, ...]:
        eos = self.hf.eos_token_id
        return () if eos is None else (int(eos),)

    def encode(self, text: str, chat: bool = True) -> list[int]:
        if chat and getattr(self.hf, "chat_template", None):
            msgs = [{"role": "user", "content": text}]
            rendered = self.hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            return list(self.hf(rendered, add_special_tokens=False)["input_ids"])
        return list(self.hf(text)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)


def tokenizer_hash(tokenizer) -> str:
    """A short hash of the vocabulary (id <-> token) and the special tokens: equal hashes tokenize alike."""
    hf = tokenizer.hf
    vocab = sorted(hf.get_vocab().items(), key=lambda kv: kv[1])
    blob = json.dumps([vocab, hf.eos_token, getattr(hf, "chat_template", None)], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def copy_tokenizer(src: Path, dst: Path) -> None:
    """Copy every tokenizer file of a registry entry folder (all but its config and weights)."""
    from specgen.registry import CONFIG, WEIGHTS

    for f in Path(src).iterdir():
        if f.is_file() and f.name not in (CONFIG, WEIGHTS) and not f.name.startswith("."):
            shutil.copy2(f, Path(dst) / f.name)
