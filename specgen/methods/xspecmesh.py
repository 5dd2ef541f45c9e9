"""XSpecMesh (Algorithm 1): multi-head speculative decoding of point-cloud-conditioned mesh GPTs.

LOSSY with the paper's rules (criterion threshold / topk); LOSSLESS with criterion rejection and deterministic
candidates. A rule that accepts nothing (delta >= 1) is AR sampling with the same seed, token for token.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import torch

from specgen import checkpoints, registry
from specgen.decoding.budget import FixedBudget, MeasuredBudget
from specgen.decoding.draft_verify import DraftVerify
from specgen.decoding.loop import DecodeResult, decode_batch
from specgen.decoding.pool import EachRow
from specgen.decoding.sampling import SamplingParams, logits_to_probs, sample, sample_rows
from specgen.devices import host_tensor
from specgen.errors import CheckpointError, UsageError
from specgen.mesh.target import MeshTarget
from specgen.mesh.vertex_lookup import VertexMemory
from specgen.methods.options import XSpecMeshOptions
from specgen.methods.text import EmptyDrafter, lookup
from specgen.methods.xspecmesh_pool import XSpecMeshPool, mesh_rule
from specgen.models.heads import head_logits
from specgen.models.layout import decode_layout
from specgen.train.lora import merge_lora_state

#: Precision of the heads' LM-head projection (candidates only; the backbone, hence acceptance, stays float32):
#: float32 by default, as the head bodies always (docs/results/mesh.md).
DRAFT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
#: Branches of the top-K_s probability tree lighter than this are pruned (appendix A.4).
TREE_PRUNE = 1e-5


OPTION_NAMES = tuple(XSpecMeshOptions.__dataclass_fields__)


@dataclass(frozen=True)
class Proposal:
    """Candidates x_{s*+1 ..} and the probability their proposer gave each (a head's tempered softmax; lookup: 1)."""

    tokens: list[int]
    probs: list[float]

    def cut(self, min_path_prob: float) -> list[int]:
        """The candidates before the first one at which the running product of probs is below min_path_prob."""
        path = 1.0
        for j, p in enumerate(self.probs):
            path *= p
            if path < min_path_prob:
                return self.tokens[:j]
        return self.tokens


def tree_sample(probs: torch.Tensor, k: int, generator: torch.Generator | None) -> list[int]:
    """Top-K_s probability-tree sampling over head distributions probs [D, V] -> one path of D tokens."""
    top = probs.topk(min(k, probs.shape[-1]), dim=-1)  # values/indices [D, K]
    weight = top.values[0]
    for d in range(1, probs.shape[0]):
        weight = (weight.unsqueeze(-1) * top.values[d]).flatten()  # [K^(d+1)], row-major paths
    weight = torch.where(weight >= TREE_PRUNE, weight, torch.zeros_like(weight))
    if not weight.sum() > 0:
        return top.indices[:, 0].tolist()
    flat = sample(weight / weight.sum(), generator)
    path, kk = [], top.indices.shape[1]
    for d in reversed(range(probs.shape[0])):
        path.append(int(top.indices[d, flat % kk]))
        flat //= kk
    return path[::-1]


def head_candidates(head_logits: torch.Tensor, params: SamplingParams, opts: XSpecMeshOptions,
                    generator: torch.Generator | None) -> Proposal:
    """Candidates x_{s*+1 .. s*+D} from head logits [D, V] (greedy, or the K_s = 1 tree: argmaxes), and each
    head's tempered probability of its token (for `min_path_prob`)."""
    if params.greedy or (opts.sampling == "tree" and opts.top_k_tree == 1):
        # the K_s = 1 tree's one path is every head's most probable token, and the filters keep each row's max
        tokens = head_logits.argmax(-1).tolist()
    elif opts.sampling == "tree":
        tokens = tree_sample(logits_to_probs(head_logits, params), opts.top_k_tree, generator)
    else:
        tokens = sample_rows(logits_to_probs(head_logits, params), generator)  # one independent draw per head
    if not opts.min_path_prob:
        return Proposal(tokens, [1.0] * len(tokens))
    scaled = head_logits / (params.temperature or 1.0)  # [D, V]
    chosen = scaled.gather(-1, torch.tensor(tokens, device=scaled.device)[:, None])[:, 0]  # [D]
    return Proposal(tokens, (chosen - scaled.logsumexp(-1)).exp().tolist())


class MeshDecoder:
    """A backbone (MeshGPT, adapter already merged) and optional heads; decodes point clouds on the batched loop."""

    def __init__(self, model, heads=None, eos_id: int = 5120) -> None:
        self.model, self.heads, self.eos_id = model, heads, eos_id
        self._draft_out: torch.nn.Module | None = None  # the LM head in the draft dtype (see _lm_head)
        self.budgets: dict = {}  # options -> the `budget=auto` MeasuredBudget: it learns across generate calls

    @torch.inference_mode()
    def generate_batch(self, pcs: list[torch.Tensor], params: SamplingParams, max_tokens: int,
                       opts: XSpecMeshOptions | None = None, generators=None, draft_generators=None,
                       batch_size: int = 1, on_done=None, on_tokens=None) -> list[DecodeResult]:
        """Decode the meshes of point clouds pcs[i] [N_i, 6], `batch_size` at a time, on the shared batched loop
        (`on_done`, `on_tokens`: as `decode_batch`'s). Cloud i samples from generators[i] (the backbone's samples) and
        draft_generators[i] (head candidates), so its mesh does not depend on the batch. AR when there are no heads or
        num_heads == 0."""
        opts = opts or XSpecMeshOptions()
        d_max = 0 if self.heads is None else (opts.num_heads or self.heads.num_heads)
        if self.heads is not None and d_max > self.heads.num_heads:
            raise UsageError(f"num_heads {d_max} > the {self.heads.num_heads} heads of this checkpoint")
        draft_generators = list(draft_generators) if draft_generators is not None else [None] * len(pcs)
        target = MeshTarget(self.model, pcs)
        pool = XSpecMeshPool(self, target, opts, params, d_max, draft_generators) if d_max else \
            EachRow(lambda i: EmptyDrafter())  # AR: the empty draft on the same loop
        budget = self.budgets.setdefault(repr((opts, params)), MeasuredBudget(d_max)) \
            if opts.budget == "auto" and d_max else FixedBudget(d_max)
        batch = decode_batch(target, DraftVerify(pool, mesh_rule(opts), budget), [[i] for i in range(len(pcs))],
                             max_tokens, params, (self.eos_id,), generators, batch_size=batch_size, max_draft=d_max,
                             on_done=on_done, on_tokens=on_tokens)
        return batch.results  # tokens x_1 .. (EOS included when reached)

    def _candidates(self, out: list[int], x: int, stacked, h: torch.Tensor, past, kv, d: int, params: SamplingParams,
                    opts: XSpecMeshOptions, generator: torch.Generator | None,
                    memory: VertexMemory | None = None) -> Proposal:
        """D candidates after the committed tokens `out` + x = x_{s*}: the heads'; with `lookup` what followed
        the latest earlier occurrence of the longest n-gram suffix (n <= lookup), heads filling the rest; with a
        vertex `memory` the offsets of known blocks, heads elsewhere. Heads run only if a position needs them."""
        heads = functools.cache(lambda: self._heads(stacked, h, past, x, kv, d, params, opts, generator))
        if memory is not None:
            memory.read(out + [x])
            tokens = memory.propose(x, lambda: heads().tokens, d)
            return Proposal(tokens, [1.0 if memory.knows(prev) else heads().probs[j]
                                     for j, prev in enumerate([x] + tokens[:-1])])
        found = lookup(out + [x], d, opts.lookup, 1) if opts.lookup else []
        if len(found) == d:
            return Proposal(found, [1.0] * d)
        return Proposal(found + heads().tokens[len(found):], [1.0] * len(found) + heads().probs[len(found):])

    def _vertex_memory(self) -> VertexMemory:
        """An empty per-mesh vertex memory; the backbone must use BPT's 8 x 16 vocabulary."""
        memory = VertexMemory()
        if self.model.vocab_size != memory.tokenizer.vocab_size:
            raise UsageError(f"vertex_lookup needs a BPT backbone ({memory.tokenizer.vocab_size} tokens), "
                             f"this one has {self.model.vocab_size}")
        return memory

    def _heads(self, stacked, h: torch.Tensor, past: torch.Tensor | None, token: int, kv, d: int,
               params: SamplingParams, opts: XSpecMeshOptions, generator: torch.Generator | None) -> Proposal:
        """D candidates from the heads on h_{s*-1} = h [1, dim], the projected window `past` (history heads)
        and x_{s*} = token (token_input heads); d >= 1 (the pool runs only with heads)."""
        dtype = DRAFT_DTYPES[opts.draft_dtype]
        step = functools.partial(head_logits, stacked, self._lm_head(dtype), self.model.decoder.tok_embeddings, dtype, d)
        k, v = kv if kv is not None else (None, None)
        tok = host_tensor([token], h.device) if stacked.token_input else None
        inputs = {name: t for name, t in (("h", h), ("token", tok), ("k", k), ("v", v), ("past", past)) if t is not None}
        graphs = self.heads.graphs  # captured: one replay per row (its outputs are read before the next)
        key = ("heads", d, dtype, *((name, tuple(t.shape)) for name, t in inputs.items()))
        logits = (step(**inputs) if graphs is None else graphs.call(key, step, inputs))[0]  # [d, V]
        return head_candidates(logits, params, opts, generator)

    @staticmethod
    def _window(stacked, rows: torch.Tensor, past: torch.Tensor | None) -> torch.Tensor | None:
        """History heads: window K/V rows [D, W', 2 inner] after committing hidden rows [n, dim] (in position order);
        the newest first, at most `history`. Each hidden state is projected once. None for other heads."""
        if stacked is None or not stacked.history:
            return None
        new = stacked.project_history(rows.flip(0))  # [D, n, 2 inner], newest first
        return (new if past is None else torch.cat([new, past], 1))[:, : stacked.history]

    def _lm_head(self, dtype: torch.dtype):
        """The backbone's LM head for the heads' features, cached in `dtype` (candidates; rules read float32)."""
        out = self.model.decoder.output
        if dtype == self.model.decoder.dtype or not hasattr(out, "weight"):
            return out  # drafting in the backbone's own precision, or with its quantized head (no float copy)
        if self._draft_out is None or self._draft_out.weight.dtype != dtype:
            self._draft_out = copy.deepcopy(out).to(dtype)
            self._draft_out.weight.data = self._draft_out.weight.data.contiguous()  # row-major: faster in bf16 here
        return self._draft_out


# -- loading ----------------------------------------------------------------------------------------
DEFAULT_TARGET = "mesh-gpt-tiny"


@dataclass(frozen=True)
class LoadedMesh:
    """A ready decoder plus the registry entries it came from."""

    decoder: MeshDecoder
    target: object  # registry.Entry of the backbone
    heads: object | None  # registry.Entry of the heads (None for AR)
    adapter: object | None  # registry.Entry of the merged LoRA adapter, if any


def load_mesh(target: str | None = None, heads: str | None = None, device: str = "cpu") -> LoadedMesh:
    """Backbone (default: the heads' parent) + heads + their LoRA adapter merged; IncompatibleError on a misfit."""
    h_entry = checkpoints.find(heads) if heads else None
    t_entry = checkpoints.find(target or (h_entry.meta.get("parent") if h_entry else None) or DEFAULT_TARGET)
    if t_entry.meta.get("modality") != "mesh":
        raise UsageError(f"{t_entry.ref} is a {t_entry.meta.get('modality', 'text')} model, not a mesh model")
    model = checkpoints.load_module(t_entry, device)
    head_module = a_entry = None
    if h_entry is not None:
        registry.check_pair(h_entry, t_entry)
        if h_entry.meta.get("adapter"):
            a_entry = checkpoints.find(h_entry.meta["adapter"])
            registry.check_pair(a_entry, t_entry)
            try:
                merge_lora_state(model, registry.read_state(a_entry), a_entry.meta["lora_rank"],
                                 a_entry.meta["lora_alpha"])
            except (KeyError, ValueError) as e:
                raise CheckpointError(f"{a_entry.ref}: cannot merge into {t_entry.ref} ({e})") from None
        head_module = checkpoints.load_module(h_entry, device)
    decode_layout(model)  # after the LoRA merge (models/layout.py)
    return LoadedMesh(MeshDecoder(model, head_module, t_entry.meta.get("eos_id", 5120)), t_entry, h_entry, a_entry)
