"""XSpecMesh (Algorithm 1): multi-head speculative decoding of point-cloud-conditioned mesh GPTs."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch

from specgen import checkpoints, registry
from specgen.decoding.ar_steps import ArSteps
from specgen.decoding.budget import FixedBudget, MeasuredBudget
from specgen.decoding.cost import cost_of, relative
from specgen.decoding.draft import Draft
from specgen.decoding.draft_verify import DraftVerify
from specgen.decoding.loop import DecodeResult, decode_batch
from specgen.decoding.sampling import SamplingParams
from specgen.decoding.tree import DraftTree
from specgen.errors import CheckpointError, UsageError
from specgen.mesh.target import MeshTarget
from specgen.mesh.vertex_lookup import VertexMemory
from specgen.methods.options import XSpecMeshOptions
from specgen.methods.text import lookup
from specgen.methods.xspecmesh_ahead import ChainAhead
from specgen.methods.xspecmesh_pool import DRAFT_DTYPES, Proposal, XSpecMeshPool, mesh_rule
from specgen.models.layout import decode_layout
from specgen.models.heads import head_logits
from specgen.models.lora import merge_lora_state
from specgen.models.mesh import MeshGPT


class MeshDecoder:
    """A backbone (MeshGPT, adapter already merged) and optional heads; decodes point clouds on the batched loop."""

    def __init__(self, model, heads=None, eos_id: int = 5120) -> None:
        self.model, self.heads, self.eos_id = model, heads, eos_id
        self._draft_out: torch.nn.Module | None = None  # the LM head in the draft dtype (see _lm_head)
        self.budgets: dict = {}  # options -> the `budget=auto` MeasuredBudget: it learns across generate calls

    @torch.inference_mode()
    def generate_batch(self, pcs: list[torch.Tensor], params: SamplingParams, max_tokens: int,
                       opts: XSpecMeshOptions | None = None, generators=None, draft_generators=None,
                       batch_size: int = 1, on_done=None, on_tokens=None, run_ahead: int = 1) -> list[DecodeResult]:
        """Decode the meshes of point clouds pcs[i] [N_i, 6], `batch_size` at a time, on the shared batched loop
        (`on_done`, `on_tokens`: as `decode_batch`'s). Cloud i samples from generators[i] (the backbone's samples) and
        draft_generators[i] (head candidates), so its mesh does not depend on the batch. AR when there are no heads or
        num_heads == 0 (`run_ahead`: its steps a host read, `ar`'s option)."""
        opts = opts or XSpecMeshOptions()
        d_max = 0 if self.heads is None else (opts.num_heads or self.heads.num_heads)
        if self.heads is not None and d_max > self.heads.num_heads:
            raise UsageError(f"num_heads {d_max} > the {self.heads.num_heads} heads of this checkpoint")
        draft_generators = list(draft_generators) if draft_generators is not None else [None] * len(pcs)
        target = MeshTarget(self.model, pcs)
        step, nodes = ArSteps(run_ahead), 0  # AR: AR's own step policy, as text's and images'
        if d_max:
            pool = XSpecMeshPool(self, target, opts, params, d_max, draft_generators, batch_size)
            target.along = pool.along  # the heads' candidates computed with each verify (read ahead), or None
            nodes = pool.nodes
            if opts.run_ahead > 1:  # the greedy chain, its steps' verdicts made on the device
                opts.check_use("mesh", params.greedy)
                if not pool.ahead:  # history heads: each position's window differs, so they run on the host
                    raise UsageError("run_ahead (option of xspecmesh) needs heads without a history window: the "
                                     "device runs them on every verify position")
                step = ChainAhead(pool, opts.run_ahead, opts.vertex_lookup)
            else:
                budget = self.budgets.setdefault(repr((opts, params)), auto_budget(self, d_max, params, opts)) \
                    if opts.budget == "auto" else FixedBudget(d_max)
                along = pool if pool.ahead else None  # ... and read with the accept's picks
                step = DraftVerify(pool, mesh_rule(opts, params), budget, along)
        batch = decode_batch(target, step, [[i] for i in range(len(pcs))], max_tokens, params, (self.eos_id,),
                             generators, batch_size=batch_size, max_draft=nodes, on_done=on_done, on_tokens=on_tokens)
        return batch.results  # tokens x_1 .. (EOS included when reached)

    def _candidates(self, out: list[int], x: int, heads: Callable[[], Proposal], d: int, opts: XSpecMeshOptions,
                    memory: VertexMemory | None = None) -> Proposal:
        """D candidates after the committed tokens `out` + x = x_{s*}: the heads' (`heads()`, computed once); with
        `lookup` what followed the latest earlier occurrence of the longest n-gram suffix (n <= lookup), heads filling
        the rest; with a vertex `memory` the offsets of known blocks, heads elsewhere. Heads run only if a position
        needs them."""
        if memory is not None:
            memory.read(out + [x])
            tokens = memory.propose(x, lambda: heads().tokens, d)
            return Proposal(tokens, [1.0 if memory.knows(prev) else heads().probs[j]
                                     for j, prev in enumerate([x] + tokens[:-1])])
        found = lookup(out + [x], d, opts.lookup, 1) if opts.lookup else []
        if len(found) == d:
            return Proposal(found, [1.0] * d)
        return Proposal(found + heads().tokens[len(found):], [1.0] * len(found) + heads().probs[len(found):])

    def _tree(self, out: list[int], x: int, heads: Callable[[], Proposal], widths: tuple[int, ...],
              memory: VertexMemory | None = None) -> Draft:
        """A candidate tree after the committed tokens `out` + x = x_{s*} (lossless: deterministic candidates): under
        every node of depth j - 1 the remembered offset after a known block (a vertex `memory`), else head j's best
        widths[j - 1] tokens (`heads()`: each head's best max(widths), head-major, computed once); nothing after an
        EOS candidate. Medusa's tree over XSpecMesh's heads: every head predicts its offset from x_{s*}'s state, so
        siblings' subtrees hold the same head candidates."""
        if memory is not None:
            memory.read(out + [x])
        w, tokens, parents, frontier = max(widths, default=1), [], [], [(-1, x)]
        for j, width in enumerate(widths):
            level = []
            for parent, prev in frontier:
                if prev == self.eos_id:
                    continue
                known = None if memory is None else memory.after(prev)
                for t in heads().tokens[j * w : j * w + width] if known is None else [known]:
                    tokens.append(t)
                    parents.append(parent)
                    level.append((len(tokens) - 1, t))
            frontier = level
        return Draft(tuple(tokens), DraftTree(tuple(parents)))

    def _lm_head(self, dtype: torch.dtype):
        """The backbone's LM head for the heads' features, cached in `dtype` (candidates; rules read float32)."""
        out = self.model.decoder.output
        if dtype == self.model.decoder.dtype or not hasattr(out, "weight"):
            return out  # drafting in the backbone's own precision, or with its quantized head (no float copy)
        if self._draft_out is None or self._draft_out.weight.dtype != dtype:
            self._draft_out = copy.deepcopy(out).to(dtype)
            self._draft_out.weight.data = self._draft_out.weight.data.contiguous()  # row-major: faster in bf16 here
        return self._draft_out


def zero_condition(model: MeshGPT) -> torch.Tensor:
    """A condition of the point encoder's output shape [1, num_latents, out_dim], zeros (a timing's: its values do not
    change the time)."""
    enc = model.enc_cfg
    return model.start.new_zeros(1, enc.num_latents, enc.out_dim)


@dataclass(frozen=True)
class ConditionedForward:
    """`cost.Timed` of the backbone as a mesh decodes it: the decoder's forward over mesh tokens, every block
    cross-attending to a condition of the point encoder's output shape [1, num_latents, out_dim] (zeros: its values
    do not change the time; a cloud's are computed once per mesh, by the prefill, which no step repeats)."""

    module: MeshGPT

    @property
    def limit(self) -> int:
        return self.module.dec_cfg.max_seq_len

    @property
    def vocab(self) -> int:
        return self.module.vocab_size

    def describe(self) -> str:
        enc = self.module.enc_cfg
        return f"{self.module.dec_cfg!r} cross-attending to [{enc.num_latents}, {enc.out_dim}]"

    def prepare(self, ids: torch.Tensor, positions: torch.Tensor, prefix: int):
        cache = self.module.new_cache(1, ids.shape[1])
        cache.cross = self.module.decoder.context_kv(zero_condition(self.module))
        self.module.decoder(ids[:, :prefix], positions[:, :prefix], cache)
        cache.commit(0, list(range(prefix)))
        return cache

    def forward(self, state, ids: torch.Tensor, positions: torch.Tensor) -> None:
        self.module.decoder(ids, positions, state)


@dataclass(frozen=True)
class HeadsForward:
    """`cost.Timed` of one call of the heads as `XSpecMeshPool.run_heads` and `ReadAhead` make it: the first `d` heads
    on m hidden states of one mesh (zeros: the values do not change the time), cross-attending to a condition of the
    point encoder's output shape, then the LM head they draft with in `dtype`. The heads keep no cache: the prefix is
    free."""

    decoder: MeshDecoder
    d: int
    dtype: torch.dtype

    @property
    def module(self) -> torch.nn.Module:
        return self.decoder.heads

    @property
    def limit(self) -> int:
        return self.decoder.model.dec_cfg.max_seq_len

    @property
    def vocab(self) -> int:
        return self.decoder.model.vocab_size

    def describe(self) -> str:
        enc = self.decoder.model.enc_cfg
        return (f"{self.module.cfg!r}: the first {self.d}, {self.decoder.model.decoder.output!r} in {self.dtype}, "
                f"cross-attending to [{enc.num_latents}, {enc.out_dim}]")

    def prepare(self, ids: torch.Tensor, positions: torch.Tensor, prefix: int) -> tuple:
        heads, cfg = self.module, self.module.cfg
        stacked = heads.stacked()
        kv = stacked.context_kv(heads.context_kv(zero_condition(self.decoder.model)))
        past = stacked.res_b.new_zeros(cfg.num_heads, cfg.history, 2 * cfg.inner_dim) if stacked.history else None
        return stacked, kv or (None, None), stacked.res_b.new_zeros(ids.shape[1], cfg.dim), past

    def forward(self, state, ids: torch.Tensor, positions: torch.Tensor) -> None:
        stacked, (k, v), h, past = state
        m, model = ids.shape[1], self.decoder.model
        head_logits(stacked, self.decoder._lm_head(self.dtype), model.decoder.tok_embeddings, self.dtype, self.d,
                    h[:m], ids[0] if stacked.token_input else None, k, v, past)


def auto_budget(decoder: MeshDecoder, d_max: int, params: SamplingParams, opts: XSpecMeshOptions) -> MeasuredBudget:
    """`budget=auto`: greedy, by measured wall times (the tokens are AR's whatever it chooses), a batch size not yet
    seen predicted by the backbone's cost curve (MeasuredBudget 5.); sampled, by that curve, the heads' calls at
    theirs (in the backbone's unit) and the acceptance observed, so the seed repeats the run (MeasuredBudget 6.)."""
    target = cost_of(ConditionedForward(decoder.model))
    drafter = None if params.greedy else \
        relative(cost_of(HeadsForward(decoder, d_max, DRAFT_DTYPES[opts.draft_dtype])), target)
    return MeasuredBudget(d_max, cost=target, timed=params.greedy, drafter=drafter)


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
    if h_entry is not None and h_entry.kind != "heads":  # an adapter or a target: no head module to build
        raise UsageError(f"{h_entry.ref} is no XSpecMesh heads entry (heads/NAME, e.g. xspecmesh-ca-tiny)")
    parent = h_entry.meta.get("parent") if h_entry is not None and not target else None  # the default backbone
    t_entry = (checkpoints.find_linked(h_entry, parent, "was trained for") if parent
               else checkpoints.find(target or DEFAULT_TARGET))
    if t_entry.kind != "target":  # heads or an adapter named as the model: not a backbone
        raise UsageError(f"{t_entry.ref} is no mesh backbone (target/NAME); XSpecMesh heads are "
                         "method_options.heads=NAME")
    if t_entry.meta.get("modality") != "mesh":
        raise UsageError(f"{t_entry.ref} is a {t_entry.meta.get('modality', 'text')} model, not a mesh model")
    model = checkpoints.load_module(t_entry, device)
    head_module = a_entry = None
    if h_entry is not None:
        registry.check_pair(h_entry, t_entry)
        if h_entry.meta.get("adapter"):
            a_entry = checkpoints.find_linked(h_entry, h_entry.meta["adapter"], "merges the adapter")
            registry.check_pair(a_entry, t_entry)
            try:
                merge_lora_state(model, registry.read_state(a_entry), a_entry.meta["lora_rank"],
                                 a_entry.meta["lora_alpha"])
            except (KeyError, ValueError) as e:
                raise CheckpointError(f"{a_entry.ref}: cannot merge into {t_entry.ref} ({e})") from None
        head_module = checkpoints.load_module(h_entry, device)
    decode_layout(model)  # after the LoRA merge (models/layout.py)
    return LoadedMesh(MeshDecoder(model, head_module, t_entry.meta.get("eos_id", 5120)), t_entry, h_entry, a_entry)
