"""CFG targets over LlamaGen-style GPTs (c2i and t2i): one forward scores cond and uncond branches."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen.decoding.target import TargetOut
from specgen.devices import host_inputs, to_device
from specgen.errors import UsageError
from specgen.image.captions import Caption
from specgen.models import kernel_choice
from specgen.models.cache import KVCache
from specgen.models.static_step import first_node
from specgen.models.transformer import padded_causal_mask


class CFGTarget:
    """Target protocol for a class-conditional Transformer (needs `cfg.num_classes`): under guidance sequence i holds
    cache rows 2i, 2i + 1 (cond, uncond); logits are combined, features stay per branch."""

    def __init__(self, model: torch.nn.Module, cfg_scale: float = 4.0) -> None:
        self.model = model
        self.cfg_scale = float(cfg_scale)
        self.vocab_size = model.cfg.vocab_size
        self.null_class = model.cfg.num_classes
        self.device = model.device
        self.dtype = model.dtype  # caption features arrive float32: cast to the model's activation dtype
        self.branches = 2 if self.cfg_scale != 1.0 else 1  # scale 1 is the conditional model alone: no uncond row

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return self.model.new_cache(self.branches * batch, max_len)  # slots, not positions: trees need room

    def combine(self, logits: torch.Tensor) -> torch.Tensor:
        """[n * branches, S, V] (rows cond_0, uncond_0, cond_1, ...) -> [n, S, V] CFG-combined logits."""
        return guided(logits, self.cfg_scale) if self.branches == 2 else logits

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, cache: KVCache) -> TargetOut:
        """tokens [1, 1] = the class label (on the host); runs the condition position and commits it: with captured
        steps as one replay (`static_step.first_node`, the eager forward's bits), its keys and values then copied into
        the rows' slot 0."""
        labels = torch.tensor([int(tokens[0, 0]), self.null_class][: self.branches])  # [branches]: cond, uncond
        graphs = self.model.graphs
        if graphs is None:
            embeds = self.model.cls_embedding(to_device(labels, self.device))  # [branches, 1, dim]
            positions = torch.zeros(self.branches, 1, dtype=torch.long, device=self.device)
            logits, hidden = self.model(None, positions, cache, embeds=embeds)
            self.commit(cache, [0])
            return TargetOut(self.combine(logits), hidden)

        def run(labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
            logits, hidden, k, v = first_node(self.model, self.model.cls_embedding(labels))
            return self.combine(logits), hidden, k, v

        key = ("class", self.branches, self.cfg_scale)  # the guidance is baked into the capture
        logits, hidden, k, v = graphs.prompt_graphs().call(key, run, {"labels": labels})
        cache.commit_first(k, v, self.branches)  # k, v [L, branches, Hkv, 1, hd]
        return TargetOut(logits.clone(), hidden.clone())  # the graph's buffers: the next image's prefill rewrites them

    @torch.inference_mode()
    def forward(self, tokens, positions, cache, tree_mask) -> TargetOut:
        """n sequences: tokens/positions [n, S], tree_mask [S, S] or [n, S, S]; each row runs on its branch rows.
        Captured: the inputs staged straight into the branch rows and the logits combined inside the replay."""
        b, graphs = self.branches, self.model.graphs
        replayed = None if graphs is None else graphs.forward(tokens, positions, cache, tree_mask, branches=b,
                                                              post=Guidance(self.cfg_scale) if b == 2 else None)
        if replayed is not None:
            return TargetOut(*replayed, graphs=graphs)
        if isinstance(tokens, list):  # built on the host (`forward_span`): the eager forward's on the device
            tokens, positions, tree_mask = host_inputs(tokens, positions, tree_mask, self.device)
        if tree_mask is not None and tree_mask.dim() == 3:
            tree_mask = tree_mask.repeat_interleave(b, 0)
        logits, hidden = self.model.eager(tokens.repeat_interleave(b, 0), positions.repeat_interleave(b, 0), cache,
                                          tree_mask)  # its graphs just declined this call
        return TargetOut(self.combine(logits), hidden, graphs=graphs)

    def commit(self, cache: KVCache, keep: list[int]) -> None:
        cache.commit_seqs({0: keep}, self.branches)  # the one sequence's branch rows


def guided(logits: torch.Tensor, scale: float) -> torch.Tensor:
    """[n * 2, S, V] (rows cond_0, uncond_0, cond_1, ...) -> [n, S, V]: guidance at the logits level; on CUDA one
    launch (`torch.ops.specgen.guided`: the same bits)."""
    if kernel_choice.one_pass(logits):
        return torch.ops.specgen.guided(logits, scale)
    cond, uncond = logits.view(-1, 2, *logits.shape[1:]).unbind(1)  # [n, S, V] each
    return uncond + scale * (cond - uncond)


@dataclass(frozen=True)
class Guidance:
    """A captured verify's post-step under CFG (graphs.StepGraphs.forward): the logits combined at `scale` (equal
    scales share a capture), the features kept per branch row."""

    scale: float

    def __call__(self, logits: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return guided(logits, self.scale), hidden


class CaptionCFGTarget(CFGTarget):
    """Target over a text-conditional Transformer (`cfg.caption_dim`): a sequence's prompt is n_cond copies of its
    caption's index (`prompt(i)`); row 0 embeds the caption, row 1 (CFG) `uncond_embedding`, both under the
    caption's padding mask (as LlamaGen's `generate`)."""

    def __init__(self, model: torch.nn.Module, cfg_scale: float, caption: Caption | list[Caption]) -> None:
        super().__init__(model, cfg_scale)
        self.captions = list(caption) if isinstance(caption, (list, tuple)) else [caption]
        self.n_cond = model.cfg.n_cond

    def prompt(self, i: int = 0) -> list[int]:
        """The n_cond condition positions of caption i (the ids name the caption; their count sets the positions)."""
        return [i] * self.n_cond

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, cache: KVCache) -> TargetOut:
        """tokens [1, n_cond] placeholders; runs the caption positions under the padding mask and commits them."""
        n, b = self.n_cond, self.branches
        emb = self.model.cls_embedding
        caption = self.captions[int(tokens[0, 0])]
        captions = caption.features.to(self.device, self.dtype)[None]  # [1, n, C]
        if self.branches == 2:
            captions = torch.cat([captions, emb.uncond_embedding[None].to(captions)])  # [2, n, C]
        valid = caption.valid.to(self.device)[None].expand(b, n)  # [b, n]
        positions = torch.arange(n, device=self.device).expand(b, n)  # zero RoPE rows
        hidden = self.model.hidden_states(emb(captions), positions, cache, padded_causal_mask(valid))
        self.commit(cache, list(range(n)))
        cache.key_mask = valid.clone()  # padded slots stay hidden from every later query
        return TargetOut(self.combine(self.model.logits(hidden[:, -1:])), hidden)


def cfg_target(model: torch.nn.Module, cfg_scale: float, caption: Caption | list[Caption] | None = None) -> CFGTarget:
    """The CFG adapter for the model's conditioning: a class label in the prompt (c2i) or `caption`(s) (t2i)."""
    if model.cfg.cond_kind != "caption":
        return CFGTarget(model, cfg_scale)
    if caption is None or (isinstance(caption, (list, tuple)) and not caption):
        raise UsageError("a text-conditional model needs caption features")
    return CaptionCFGTarget(model, cfg_scale, caption)
