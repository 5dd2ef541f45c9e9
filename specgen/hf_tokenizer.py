"""transformers' tokenizer of an imported checkpoint: a failure is one line naming it, its answered noise unsaid."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path

from specgen.errors import CheckpointError
from specgen.registry import one_line

# transformers' logger -> the start of its one message that specgen answers itself, dropped around the load; every
# other record of the logger still shows
UNSAID = {
    # advice on every LongRoPE config.json as Phi-3.5 and Phi-4-mini publish theirs (no `factor`, which transformers
    # derives from original_max_position_embeddings): AutoTokenizer reads and validates the model's config to pick a
    # tokenizer class; the config is valid, and hf_config reads it exactly (docs/architectures.md)
    "transformers.modeling_rope_utils":
        "This model config has set a `rope_parameters['original_max_position_embeddings']` field",
    # a GGUF holding no tokenizer: said before the load fails, which is load_tokenizer's one line
    "transformers.modeling_gguf_pytorch_utils": "Can't find a way to retrieve missing config vocab_size",
}


def load_tokenizer(source: Path, **kwargs):
    """AutoTokenizer.from_pretrained of `source` (an HF folder; or a GGUF file's folder, with gguf_file=), local files
    only; one that does not load is a CheckpointError naming `source`."""
    from transformers import AutoTokenizer  # start-up cost: transformers loads only for an import's tokenizer

    try:
        with unsaid():
            return AutoTokenizer.from_pretrained(str(source if source.is_dir() else source.parent),
                                                 local_files_only=True, **kwargs)
    except Exception as e:  # transformers and tokenizers raise any type on a file they cannot read
        raise CheckpointError(f"cannot load the tokenizer of {source}: {type(e).__name__}: {one_line(e)}") from None


@contextmanager
def unsaid():
    """transformers' loggers without their UNSAID messages."""
    def said(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(UNSAID[record.name])

    for name in UNSAID:
        logging.getLogger(name).addFilter(said)
    try:
        yield
    finally:
        for name in UNSAID:
            logging.getLogger(name).removeFilter(said)
