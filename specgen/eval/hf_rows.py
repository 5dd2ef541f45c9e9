"""The transformers peer rows (greedy, in the run's float dtype): `generate` plain, prompt lookup, assisted; a compiled
static loop."""

from __future__ import annotations

import inspect

import torch

from specgen.decoding.stops import Stops
from specgen.devices import now
from specgen.errors import UsageError
from specgen.eval.peers import OneAtATime, PeerSetup
from specgen.eval.text_rows import Run
from specgen.models.hf_export import to_hf
from specgen.models.tokenizer import tokenizer_hash
from specgen.text.target import load_original, load_text_model


class HfGenerate:
    """`hf`: transformers' own greedy `generate`, so specgen's AR baseline is shown not to be artificially slow."""

    OPTIONS: tuple[str, ...] = ()
    lossless = True  # the same weights, greedy (in bfloat16 its sums' order is its own: exact match may fall)

    @staticmethod
    def unavailable(setup: PeerSetup) -> str | None:
        return None

    def __init__(self, setup: PeerSetup) -> None:
        self.options, self.setup = setup.options, setup
        self.module = to_hf(setup.original.module).to(setup.dtype)

    def kwargs(self) -> dict:
        """generate's keyword arguments that pick this row's decoding path."""
        return {}

    def generate(self, chunk: list[list[int]], **kwargs) -> tuple[list[list[int]], int, float]:
        """`generate_padded` of this row's prompts, to the benchmark's budget and stops."""
        return generate_padded(self.module, chunk, self.setup.max_new_tokens, self.setup.stops, **kwargs)

    def run(self, prompt: list[int]) -> Run:
        """One prompt; tokens past one per forward were accepted drafts (speculative rows)."""
        (new,), forwards, seconds = self.generate([prompt], **self.kwargs())
        return Run(new, seconds, forwards, forwards - 1, max(0, len(new) - forwards))

    def batch(self, prompts: list[list[int]], batch: int) -> tuple[list[Run], float]:
        """Static batches of `batch` prompts; (runs, total seconds). A static batch ends with its longest row, so
        every row of it reports the batch's wall time as latency."""
        runs, total = [], 0.0
        for start in range(0, len(prompts), batch):
            rows, forwards, seconds = self.generate(prompts[start : start + batch])
            total += seconds
            runs += [Run(row, total, forwards, forwards - 1, 0) for row in rows]
        return runs, total


#: generate's arguments whose steps may add several tokens (prompt lookup, assisted generation)
MULTI_TOKEN = {"prompt_lookup_num_tokens", "assistant_model"}


def generate_padded(hf, prompts: list[list[int]], n: int, stops: Stops = Stops(),
                    **kwargs) -> tuple[list[list[int]], int, float]:
    """Greedy `generate` of left-padded prompts, at most n new tokens each: (each row's new tokens as specgen keeps
    them, `Stops.kept`; forwards; seconds), forwards counted with a pre-forward hook. transformers' eos check reads
    a step's last token: with stop strings, or steps of several tokens (`MULTI_TOKEN`), a row ends at specgen's rule
    (`StopCheck`), not at transformers' `stop_strings`, which matched into the prompt and missed a string completed
    within a multi-token step; one token a step and stop ids alone, its eos check is that rule."""
    from transformers import StoppingCriteriaList  # deferred: transformers loads only for a peer row

    calls = [0]
    pad, width = (stops.ids[0] if stops.ids else 0), max(map(len, prompts))
    checks = [StopCheck(stops, width, n)] if stops.strings or MULTI_TOKEN & kwargs.keys() else []
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=hf.device)  # [b, width]
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=hf.device)
    handle = hf.register_forward_pre_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    t0 = now(hf.device)  # GPU clocks are read after the queued kernels finish
    try:
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False,
                              eos_token_id=list(stops.ids) or None, pad_token_id=pad,
                              stopping_criteria=StoppingCriteriaList(checks), **kwargs)
    finally:
        handle.remove()
    seconds, rows = now(hf.device) - t0, out[:, width:].tolist()
    return [stops.kept(r, n) for r in rows], calls[0], seconds


class StopCheck:
    """A transformers stopping criterion that ends each row where specgen's loop ends it (`Stops.end`): its generated
    tokens alone (past the `width` prompt columns) looked at, each new one once, those of a multi-token step (prompt
    lookup, assisted) included."""

    def __init__(self, stops: Stops, width: int, limit: int) -> None:
        self.stops, self.width, self.limit = stops, width, limit
        self.rows: list[list[int]] = []  # each row's generated tokens so far
        self.ended: list[bool] = []

    def __call__(self, input_ids: torch.Tensor, scores=None, **kwargs) -> torch.Tensor:
        """Whether each row has reached a stop (a bool per row, as transformers' criteria answer)."""
        if not self.rows:
            self.rows, self.ended = [[] for _ in range(len(input_ids))], [False] * len(input_ids)
        seen = len(self.rows[0])
        for i, new in enumerate(input_ids[:, self.width + seen :].tolist()):
            self.rows[i] += new
            self.ended[i] = self.ended[i] or self.stops.end(self.rows[i], seen, self.limit) is not None
        return torch.tensor(self.ended, device=input_ids.device)


class HfLookup(OneAtATime, HfGenerate):
    """`hf-lookup`: transformers' prompt-lookup decoding (`generate(prompt_lookup_num_tokens=N)`), one sequence at a
    time (transformers speculates on batch 1 only). Options are generate's: prompt_lookup_num_tokens (default
    DEFAULT_TOKENS), max_matching_ngram_size (default: transformers')."""

    OPTIONS = ("prompt_lookup_num_tokens", "max_matching_ngram_size")
    DEFAULT_TOKENS = 10  # generate has none; llama-cpp-python's prompt lookup drafts 10 by default, so both rows match

    def kwargs(self) -> dict:
        return {"prompt_lookup_num_tokens": self.DEFAULT_TOKENS, **self.options}


class HfAssisted(OneAtATime, HfGenerate):
    """`hf-assisted`: transformers' assisted generation with a smaller registered text model drafting (`draft`, else
    the target's registry `drafter`); options: draft, num_assistant_tokens (default: transformers')."""

    OPTIONS = ("draft", "num_assistant_tokens")

    @staticmethod
    def draft_name(setup: PeerSetup) -> str:
        return str(setup.options.get("draft") or setup.original.entry.meta.get("drafter") or "")

    @staticmethod
    def unavailable(setup: PeerSetup) -> str | None:
        return None if HfAssisted.draft_name(setup) else (
            f"{setup.name} row skipped: no draft model is registered for {setup.original.entry.ref} (name a smaller "
            f"text model with its tokenizer: options.{setup.name}.draft=NAME)")

    def __init__(self, setup: PeerSetup) -> None:
        super().__init__(setup)
        draft = load_original(load_text_model(self.draft_name(setup), setup.device, graphs="off"), setup.device)
        if tokenizer_hash(draft.tokenizer) != tokenizer_hash(setup.original.tokenizer):
            raise UsageError(f"{setup.name} row: {draft.entry.ref} does not share the tokenizer of "
                             f"{setup.original.entry.ref}")
        self.draft = to_hf(draft.module).to(setup.dtype)

    def kwargs(self) -> dict:
        return {"assistant_model": self.draft, **{k: v for k, v in self.options.items() if k != "draft"}}


class HfCompiled(OneAtATime, HfGenerate):
    """`hf-compiled`: the static-graph path transformers documents: a StaticCache and one one-token forward under
    `torch.compile(mode="reduce-overhead")` (CUDA graphs on a GPU) in a greedy loop, one sequence at a time."""

    CACHE_SLOTS = 512

    def __init__(self, setup: PeerSetup) -> None:
        super().__init__(setup)
        self.step = torch.compile(one_token, mode="reduce-overhead", fullgraph=True)
        self.caches: dict = {}  # slots -> the StaticCache every prompt of that size reuses (reset), as generate does

    @classmethod
    def slots(cls, tokens: int) -> int:
        """The cache slots for `tokens` (prompt + new + 1), rounded up to CACHE_SLOTS: prompts of similar length share
        one compile (the benchmark's warm-up run pays the first)."""
        return -(-tokens // cls.CACHE_SLOTS) * cls.CACHE_SLOTS

    def run(self, prompt: list[int]) -> Run:
        n, hf = self.setup.max_new_tokens, self.module
        new, seconds = timed_static_greedy(hf, self.step, prompt, n, self.setup.stops,
                                           self.slots(len(prompt) + n + 1), self.caches)
        return Run(new, seconds, len(new), len(new) - 1, 0)


def one_token(hf, tok: torch.Tensor, pos: torch.Tensor, cache, cache_arg: str) -> torch.Tensor:
    """The greedy token [1, 1] after `tok` [1, 1] at cache position `pos` [1] (what `torch.compile` captures)."""
    logits = hf(tok, position_ids=pos[None], cache_position=pos, use_cache=True, **{cache_arg: cache}).logits
    return logits[:, -1].argmax(-1, keepdim=True)


def cache_arg(hf) -> str:
    """The name this transformers' forward takes the cache by: `cache` from 5.2x on (`past_key_values` warns there,
    and goes in 5.40), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"


def timed_static_greedy(hf, step, prompt: list[int], n: int, stops: Stops = Stops(),
                        slots: int = 0, caches: dict | None = None) -> tuple[list[int], float]:
    """(up to n greedy tokens after `prompt`, through the first stop as specgen's loop finds it, each token looked at
    as it comes; seconds): an eager prefill into a StaticCache of
    `slots` (default: just enough), then `step` (`one_token`, compiled or not) a token. Each token is read before the
    next call: a compiled step's graph reuses its output buffer, and the stop check needs it. `caches` (slots ->
    StaticCache): one cache a size, reset for each prompt, as transformers' generate keeps its own (a compiled step
    marks the cache's tensors static: a new cache each prompt would capture it again)."""
    from transformers import StaticCache  # deferred: transformers loads only for a peer row

    t0 = now(hf.device)
    with torch.inference_mode():
        size, arg, caches = slots or len(prompt) + n + 1, cache_arg(hf), {} if caches is None else caches
        if size in caches:
            caches[size].reset()
        else:
            caches[size] = StaticCache(config=hf.config, max_cache_len=size)
        cache = caches[size]
        pos = torch.arange(len(prompt), device=hf.device)
        logits = hf(torch.tensor([prompt], device=hf.device), cache_position=pos, use_cache=True, **{arg: cache}).logits
        tok = logits[:, -1].argmax(-1, keepdim=True)  # [1, 1]
        new = [int(tok)]
        while len(new) < n and stops.end(new, len(new) - 1, n) is None:
            tok = step(hf, tok, torch.tensor([len(prompt) + len(new) - 1], device=hf.device), cache, arg).clone()
            new.append(int(tok))
    return new, now(hf.device) - t0
