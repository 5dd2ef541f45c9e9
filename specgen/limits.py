"""Resource limits checked before allocating: token budgets against a model's context, sizes against memory."""

from __future__ import annotations

import os

from specgen.errors import CheckpointError, UsageError

# The largest token budget accepted when the model's context is not known yet (a built-in not materialised).
MAX_TOKENS_UNKNOWN_CONTEXT = 1 << 16


def context_of(meta: dict) -> int | None:
    """The context length (max_seq_len) a registry entry's config declares, or None."""
    value = (meta.get("kwargs") or {}).get("max_seq_len") if isinstance(meta, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def decoder_context_of(meta: dict) -> int | None:
    """The context length a mesh entry's decoder declares (kwargs.decoder.max_seq_len), or None."""
    return context_of({"kwargs": (meta.get("kwargs") or {}).get("decoder")})


def check_budget(max_new_tokens: int, meta: dict | None, ref: str) -> None:
    """Refuse a token budget that cannot fit the model's context (prompt included) before anything is allocated."""
    context = context_of(meta)  # None without a config that declares one
    if context is not None and max_new_tokens >= context:
        raise UsageError(f"max-new-tokens {max_new_tokens} does not fit {ref}: its context is {context} tokens, "
                         f"prompt included; use at most {context - 1}")
    if context is None and max_new_tokens > MAX_TOKENS_UNKNOWN_CONTEXT:
        raise UsageError(f"max-new-tokens {max_new_tokens} is more than any supported context "
                         f"(at most {MAX_TOKENS_UNKNOWN_CONTEXT})")


def check_prompt_fits(prompt_tokens: int, max_new_tokens: int, entry) -> None:
    """Refuse a prompt that leaves no room in the registry entry's context for the token budget (before decoding)."""
    if prompt_tokens == 0:
        raise UsageError("a prompt is empty (no tokens to condition on); give it some text")
    context = context_of(entry.meta)
    if context is not None and prompt_tokens + max_new_tokens >= context:
        room, budget = context - 1 - max_new_tokens, context - 1 - prompt_tokens  # what each fits beside the other
        fixes = (([f"shorten the prompt to at most {room} tokens"] if room > 0 else []) +
                 ([f"lower --max-new-tokens to at most {budget}"] if budget > 0 else []))
        raise UsageError(f"prompt of {prompt_tokens} tokens + max-new-tokens {max_new_tokens} does not fit "
                         f"{entry.ref}'s context of {context} tokens; "
                         f"{' or '.join(fixes) or 'shorten the prompt and lower --max-new-tokens'}")


def check_kv_cache(config: dict, rows: int, slots: int, dtype, device: str) -> None:
    """Refuse, from a decoder's stored config (`TransformerConfig` fields) and before its weights load, a KV cache
    of `rows` x `slots` that free memory cannot hold: the check its allocation makes (`specgen/memory.py`), made
    early. A config without the sizes is left to the load, which names what is wrong with it."""
    from specgen.memory import check_cache_fits  # start-up cost: torch

    sizes = [config.get(k) for k in ("n_layers", "n_heads", "n_kv_heads", "dim")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes):
        return
    layers, heads, kv_heads, dim = sizes
    head_dim = config.get("head_dim") or dim // heads  # TransformerConfig.hd
    if not isinstance(head_dim, int):
        return
    check_cache_fits((layers, rows, kv_heads, slots, head_dim), dtype, device)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS tells it, else every CPU)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def available_memory() -> int | None:
    """Bytes of physical memory on this machine (None when unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_declared_size(what: str, declared: int, stored: int | None, advice: str,
                        error: type[Exception] = CheckpointError) -> None:
    """Refuse, in one line before the module is allocated, a config (`what`) declaring far more parameters than its
    weights hold (`advice` says what to do) or more float32 weights than this machine's memory."""
    if stored is not None and declared > 8 * stored + (1 << 20):
        raise error(f"{what} declares {declared:,} parameters but the weights hold {stored:,}: {advice}")
    mem = available_memory()
    if mem is not None and declared * 4 > mem:  # float32 weights
        raise error(f"{what} declares {declared * 4 / 2**30:.1f} GiB of float32 weights, "
                    f"more than this machine's {mem / 2**30:.1f} GiB")
