"""TextTokenizer (tokenizers + jinja2) encodes, renders, decodes and hashes as transformers' tokenizer does."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from specgen.errors import CheckpointError
from specgen.models.tokenizer import TextTokenizer, tokenizer_hash

TEXTS = ["Write a Python function that checks whether a number is prime.", "héllo , wörld ! 日本語 — \t tabs\n\nnew",
         "  leading and trailing  ", "<|im_start|>user\nliteral specials<|im_end|>", ""]
CHATS = [[{"role": "user", "content": "Sort a list."}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "And now?"}]]


def old_hash(hf) -> str:
    """The hash as specgen computed it over transformers' tokenizer (stored in adapters and n-gram caches)."""
    vocab = sorted(hf.get_vocab().items(), key=lambda kv: kv[1])
    blob = json.dumps([vocab, hf.eos_token, getattr(hf, "chat_template", None)], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """SmolLM2's tokenizer folder, saved from its GGUF as the built-in is (builtins.py)."""
    from transformers import AutoTokenizer

    from specgen.builtins import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    memmap = np.memmap
    with pytest.MonkeyPatch.context() as mp:
        # The GGUF readers slice the mapped file once per vocabulary entry and merge, and np.memmap runs Python code
        # at every slice; a plain array viewing the same mapping reads the same bytes without it.
        mp.setattr(np, "memmap", lambda *args, **kwargs: memmap(*args, **kwargs).view(np.ndarray))
        hf = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    hf.save_pretrained(str(folder))
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True), TextTokenizer.load(folder)


def test_smollm2_tokenizer_equals_transformers(smollm2):
    hf, ours = smollm2
    for text in TEXTS:
        assert ours.encode(text, chat=False) == list(hf(text)["input_ids"])
        rendered = hf.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                          add_generation_prompt=True)
        assert ours.encode(text) == list(hf(rendered, add_special_tokens=False)["input_ids"])
        ids = ours.encode(text)
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    for chat in CHATS:
        assert ours.render(chat) == hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert ours.stop_ids == (hf.eos_token_id,)
    assert tokenizer_hash(ours) == old_hash(hf) == "1c7b69ef04ec2c9c"  # the shipped adapter's and cache's hash


def test_a_folder_without_tokenizer_json_is_one_checkpoint_error(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="cannot load the tokenizer"):
        TextTokenizer.load(tmp_path)


def test_a_template_that_does_not_render_is_one_checkpoint_error(tmp_path, smollm2):
    _, ours = smollm2
    broken = TextTokenizer(ours.fast, ours.special, "{{ raise_exception('no system role') }}", False)
    with pytest.raises(CheckpointError, match="no system role"):
        broken.encode("hi")


def test_an_imported_tokenizer_with_its_own_template_equals_transformers(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({chr(i): i - 32 for i in range(32, 127)}, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="?", eos_token="~", bos_token="^",
                            chat_template="{{ bos_token }}{% for m in messages %}{{ m['role'][0] | upper }}:"
                                          "{{ m['content'] | tojson }}\n{% endfor %}{% if add_generation_prompt %}"
                                          "A:{% endif %}").save_pretrained(str(tmp_path))
    hf, ours = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True), TextTokenizer.load(tmp_path)
    for chat in CHATS:
        assert ours.render(chat) == hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert ours.encode_chat(chat) == list(hf.apply_chat_template(chat, tokenize=True, add_generation_prompt=True,
                                                                    return_dict=False))
    assert ours.encode("Sort it", chat=False) == list(hf("Sort it")["input_ids"])
    assert tokenizer_hash(ours) == old_hash(hf)


def test_the_tokenizer_renders_without_transformers_imported(fresh_interpreter):
    """A fresh process (tests/startup_checks.py): a template needing jinja2's loop controls renders, and transformers
    (most of a text command's start-up) never loads."""
    assert fresh_interpreter["tokenizer"] == [[0], False]
