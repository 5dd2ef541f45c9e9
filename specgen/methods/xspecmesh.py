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
from specgen.decoding.accept_threshold import AcceptCriterion
from specgen.decoding.budget import MeasuredBudget
from specgen.decoding.loop import decode_batch
from specgen.decoding.sampling import SamplingParams, logits_to_probs, sample, sample_rows
from specgen.decoding.stats import DecodeStats
from specgen.devices import host_tensor
from specgen.errors import CheckpointError, UsageError
from specgen.mesh.target import MeshTarget
from specgen.mesh.vertex_lookup import VertexMemory
from specgen.methods.options import (BUDGET_CHECK, XSPECMESH_CRITERIA, XSPECMESH_DRAFT_DTYPES, XSPECMESH_SAMPLING,
                                     Options, flag, int_at_least, number_in, one_of, opt, text)
from specgen.methods.text import EmptyDrafter, lookup
from specgen.methods.xspecmesh_pool import XSpecMeshPool, mesh_rule
from specgen.models.heads import head_logits
from specgen.models.layout import decode_layout
from specgen.train.lora import merge_lora_state

#: Precision of the heads' LM-head projection (candidates only; the backbone, hence acceptance, stays float32).
#: bfloat16 pays only where float32 runs on a slow few-row kernel; with the packed decode layout
#: (models/packed_linear.py) float32 runs on oneDNN, so float32 is the default (docs/results/mesh.md).
#: The head bodies stay float32 (small batched einsums are slower in bf16).
DRAFT_DTYPES = dict(zip(XSPECMESH_DRAFT_DTYPES, (torch.float32, torch.bfloat16)))
#: Branches of the top-K_s probability tree lighter than this are pruned (appendix A.4).
TREE_PRUNE = 1e-5


@dataclass(frozen=True)
class XSpecMeshOptions(Options):
    """Method options (`method_options.*`): D, the acceptance rule and the candidate sampler; checked when built."""

    heads: str = opt("xspecmesh-ca-tiny", text())  # registry name of the heads (they name backbone + adapter)
    num_heads: int = opt(0, int_at_least(0))  # D; 0 = every head the checkpoint has (paper: 4)
    criterion: str = opt("threshold", one_of(*XSPECMESH_CRITERIA))  # threshold (p > delta), topk (top-K_a): lossy
    delta: float = opt(0.5, number_in(0, 1))
    top_k_accept: int = opt(1, int_at_least(1))  # K_a
    sampling: str = opt("independent", one_of(*XSPECMESH_SAMPLING))  # independent | tree (top-K_s probability tree)
    top_k_tree: int = opt(2, int_at_least(1))  # K_s
    draft_dtype: str = opt("float32", one_of(*XSPECMESH_DRAFT_DTYPES))  # bfloat16: heads' LM-head product in bf16
    lookup: int = opt(0, int_at_least(0))  # > 0: candidates first from n-gram lookup (n = lookup .. 1) (beyond)
    vertex_lookup: bool = opt(False, flag())  # offsets after known blocks, heads elsewhere (beyond)
    min_path_prob: float = opt(0.0, number_in(0, 1, hi_open=True))  # > 0: cut the chain below this path probability
    budget: str = opt("fixed", BUDGET_CHECK)  # auto: per batch size, the faster of batched AR and the heads

    def __post_init__(self) -> None:
        self.validate("xspecmesh")

    def check(self) -> None:
        """One candidate source besides the heads; the lossless rule needs deterministic candidates (no head q)."""
        if self.lookup and self.vertex_lookup:
            raise UsageError("lookup and vertex_lookup are exclusive; choose one candidate source besides the heads")
        if self.lossless and not (self.sampling == "tree" and self.top_k_tree == 1):
            raise UsageError("criterion rejection (lossless) needs deterministic candidates: "
                             "sampling=tree top_k_tree=1 (the heads' argmaxes)")

    @property
    def lossless(self) -> bool:
        """Does decoding preserve the backbone's distribution (greedy: its output)?"""
        return self.criterion == "rejection"

    def criterion_rule(self) -> AcceptCriterion:
        return AcceptCriterion(self.criterion, self.delta, self.top_k_accept)

    def label(self) -> str:
        s = "IS" if self.sampling == "independent" else f"PTS(K_s={self.top_k_tree})"
        bf = ", bf16 head logits" if self.draft_dtype == "bfloat16" else ""
        lk = f", lookup {self.lookup}-gram" if self.lookup else ", vertex lookup" if self.vertex_lookup else ""
        cut = f", path cut {self.min_path_prob:g}" if self.min_path_prob else ""
        auto = ", budget auto" if self.budget == "auto" else ""
        rule = "rejection sampling" if self.lossless else self.criterion_rule().label()
        return f"{rule}, {s}{bf}{lk}{cut}{auto}"


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


@dataclass(frozen=True)
class MeshDecodeResult:
    """Committed tokens x_1 .. (EOS included when reached) and the run's statistics."""

    tokens: list[int]
    stats: DecodeStats


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

    def generate(self, pc: torch.Tensor, params: SamplingParams, max_tokens: int,
                 opts: XSpecMeshOptions | None = None, generator: torch.Generator | None = None,
                 draft_generator: torch.Generator | None = None) -> MeshDecodeResult:
        """Decode the mesh of point cloud pc [N, 6]; AR when there are no heads or num_heads == 0."""
        return self.generate_batch([pc], params, max_tokens, opts, [generator], [draft_generator])[0]

    @torch.inference_mode()
    def generate_batch(self, pcs: list[torch.Tensor], params: SamplingParams, max_tokens: int,
                       opts: XSpecMeshOptions | None = None, generators=None, draft_generators=None,
                       batch_size: int = 1, on_done=None, on_tokens=None) -> list[MeshDecodeResult]:
        """Decode the meshes of point clouds pcs[i] [N_i, 6], `batch_size` at a time, on the shared batched loop
        (`on_done`, `on_tokens`: as `decode_batch`'s). Cloud i samples from generators[i] (the backbone's samples) and
        draft_generators[i] (head candidates), so its mesh does not depend on the batch."""
        opts = opts or XSpecMeshOptions()
        d_max = 0 if self.heads is None else (opts.num_heads or self.heads.num_heads)
        if self.heads is not None and d_max > self.heads.num_heads:
            raise UsageError(f"num_heads {d_max} > the {self.heads.num_heads} heads of this checkpoint")
        generators = list(generators) if generators is not None else [None] * len(pcs)
        draft_generators = list(draft_generators) if draft_generators is not None else [None] * len(pcs)
        target = MeshTarget(self.model, pcs)
        pool = XSpecMeshPool(self, target, opts, params, d_max, draft_generators) if d_max else \
            (lambda i: EmptyDrafter())  # AR: the empty draft on the same loop
        budget = self.budgets.setdefault(repr((opts, params)), MeasuredBudget(d_max)) \
            if opts.budget == "auto" and d_max else None
        batch = decode_batch(target, pool, [[i] for i in range(len(pcs))], max_tokens, params, (self.eos_id,),
                             generators, batch_size=batch_size, max_draft=d_max, rule=mesh_rule(opts),
                             on_done=on_done, on_tokens=on_tokens, budget=budget)
        return [MeshDecodeResult(r.tokens, r.stats) for r in batch.results]

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
        found = lookup(out + [x], d, opts.lookup, 1) if opts.lookup and d else []
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
        and x_{s*} = token (token_input heads)."""
        if d == 0:
            return Proposal([], [])
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


def load_target(name: str, device: str = "cpu"):
    """(MeshGPT, entry) of a mesh backbone; a non-mesh checkpoint is a usage error."""
    entry = checkpoints.find(name)
    if entry.meta.get("modality") != "mesh":
        raise UsageError(f"{entry.ref} is a {entry.meta.get('modality', 'text')} model, not a mesh model")
    return checkpoints.load_module(entry, device), entry


def merge_adapter(model, adapter, target) -> None:
    """Merge a LoRA adapter entry into the backbone's weights (checked against the target first)."""
    registry.check_pair(adapter, target)
    try:
        merge_lora_state(model, registry.read_state(adapter), adapter.meta["lora_rank"],
                         adapter.meta["lora_alpha"])
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{adapter.ref}: cannot merge into {target.ref} ({e})") from None


def load_mesh(target: str | None = None, heads: str | None = None, device: str = "cpu") -> LoadedMesh:
    """Backbone (default: the heads' parent) + heads + their LoRA adapter merged; IncompatibleError on a misfit."""
    h_entry = checkpoints.find(heads) if heads else None
    t_name = target or (h_entry.meta.get("parent") if h_entry else None) or DEFAULT_TARGET
    model, t_entry = load_target(t_name, device)
    head_module = a_entry = None
    if h_entry is not None:
        registry.check_pair(h_entry, t_entry)
        if h_entry.meta.get("adapter"):
            a_entry = checkpoints.find(h_entry.meta["adapter"])
            merge_adapter(model, a_entry, t_entry)
        head_module = checkpoints.load_module(h_entry, device)
    decode_layout(model)  # after the LoRA merge (models/layout.py)
    return LoadedMesh(MeshDecoder(model, head_module, t_entry.meta.get("eos_id", 5120)), t_entry, h_entry, a_entry)
