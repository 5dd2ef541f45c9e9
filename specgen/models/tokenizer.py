"""Text tokenizer: tokenizer.json through `tokenizers`, the chat template through jinja2 as transformers renders it."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tokenizers import Tokenizer

from specgen.errors import CheckpointError
from specgen.registry import CONFIG, WEIGHTS

SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def _template(folder: Path, config: dict) -> str | None:
    """The chat template: chat_template.jinja beside the tokenizer, else tokenizer_config.json's (the default one of
    a named list)."""
    file = folder / "chat_template.jinja"
    if file.is_file():
        return file.read_text(encoding="utf-8")
    got = config.get("chat_template")
    if isinstance(got, list):
        got = next((t.get("template") for t in got if isinstance(t, dict) and t.get("name") == "default"), None)
    return got if isinstance(got, str) else None


@functools.cache
def _compiled(template: str):
    """The template compiled in jinja2 as transformers renders chat templates: sandboxed, trimmed blocks, loop
    controls, its globals (once per template: every prompt renders it)."""
    import jinja2  # deferred: start-up (only a chat template needs it)
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env.from_string(template)


@dataclass(frozen=True)
class TextTokenizer:
    """Encodes prompts (with the model's chat template by default) and decodes completions."""

    fast: object  # tokenizers.Tokenizer
    special: dict  # special-token name -> string (None where the config names none)
    chat_template: str | None
    clean_up_spaces: bool  # transformers' clean_up_tokenization_spaces, applied after decoding

    @classmethod
    def load(cls, folder: Path) -> "TextTokenizer":
        folder = Path(folder)
        try:
            config_file = folder / "tokenizer_config.json"
            config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
            fast = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as e:  # a missing, unreadable or malformed file
            raise CheckpointError(f"cannot load the tokenizer in {folder}: {e}") from None
        special = {k: config.get(k) for k in SPECIAL}  # each a string, or an AddedToken dict with its `content`
        return cls(fast, {k: v.get("content") if isinstance(v, dict) else v for k, v in special.items()},
                   _template(folder, config), bool(config.get("clean_up_tokenization_spaces", False)))

    @property
    def eos_token(self) -> str | None:
        return self.special["eos_token"]

    @property
    def stop_ids(self) -> tuple[int, ...]:
        eos = None if self.eos_token is None else self.fast.token_to_id(self.eos_token)
        return () if eos is None else (int(eos),)

    def render(self, messages: list[dict]) -> str:
        """The chat template over `messages`, ending with the assistant's turn opened."""
        import jinja2  # deferred: start-up (only a chat template needs it)

        specials = {k: v for k, v in self.special.items() if v is not None}
        try:
            return _compiled(self.chat_template).render(
                messages=messages, add_generation_prompt=True, tools=None, documents=None, **specials)
        except jinja2.TemplateError as e:
            raise CheckpointError(f"the tokenizer's chat template does not render: {e}") from None

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Messages as the template renders them; without a template, their contents joined by lines."""
        if not self.chat_template:
            return self.encode("\n".join(m["content"] for m in messages), chat=False)
        return list(self.fast.encode(self.render(messages), add_special_tokens=False).ids)

    def encode(self, text: str, chat: bool = True) -> list[int]:
        if chat and self.chat_template:
            return self.encode_chat([{"role": "user", "content": text}])
        return list(self.fast.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        text = self.fast.decode(list(ids), skip_special_tokens=True)
        if self.clean_up_spaces:  # transformers' clean_up_tokenization, in its order
            for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                         (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(a, b)
        return text


def tokenizer_hash(tokenizer: TextTokenizer) -> str:
    """A short hash of the vocabulary (id <-> token) and the special tokens: equal hashes tokenize alike."""
    vocab = sorted(tokenizer.fast.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    blob = json.dumps([vocab, tokenizer.eos_token, tokenizer.chat_template], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


def copy_tokenizer(src: Path, dst: Path) -> None:
    """Copy every tokenizer file of a registry entry folder (all but its config and weights)."""
    for f in Path(src).iterdir():
        if f.is_file() and f.name not in (CONFIG, WEIGHTS) and not f.name.startswith("."):
            shutil.copy2(f, Path(dst) / f.name)
