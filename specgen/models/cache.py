"""Static, slot-indexed KV cache [layers, B, H_kv, T_max, D] with per-row lengths, rollback and tree-path commit."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from specgen.devices import host_tensor
from specgen.memory import check_cache_fits
from specgen.models import kernel_choice


@dataclass
class KVCache:
    """Preallocated keys/values plus host-side integer lengths (one per batch row)."""

    k: torch.Tensor  # [L, B, H_kv, T_max, D]
    v: torch.Tensor  # [L, B, H_kv, T_max, D]
    lengths: list[int]
    cross: list[tuple[torch.Tensor, torch.Tensor]] | None = field(default=None)  # per layer [B, H, M, D]
    key_mask: torch.Tensor | None = field(default=None)  # [B, M] bool: False = a slot no later query sees
    _ragged: tuple | None = field(default=None, repr=False, compare=False)  # (key, index) of `ragged_rows`

    @cached_property
    def layers(self) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """Per-layer writable keys and values [B, H_kv, T_max, D] (a native kernel writes its pending slots itself, as
        `write` does), made on first use: `write` runs in every layer of every eager forward, and a cache whose forwards
        are all replays (its rows' views, made each step) never needs them."""
        return tuple((self.k[i], self.v[i]) for i in range(self.k.shape[0]))

    @classmethod
    def allocate(
        cls,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        max_len: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> "KVCache":
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        check_cache_fits(shape, dtype, device)  # refuse before allocating, naming what fits
        return cls(
            k=torch.zeros(shape, dtype=dtype, device=device),
            v=torch.zeros(shape, dtype=dtype, device=device),
            lengths=[0] * batch,
        )

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def check_room(self, new: int) -> None:
        """Raise when writing `new` pending slots would overflow any row."""
        if max(self.lengths) + new > self.k.shape[3]:
            raise ValueError(f"KV cache overflow: {max(self.lengths)} + {new} > {self.k.shape[3]} slots")

    def store(self, layer: int, qkv: torch.Tensor, rot, heads: int) -> tuple[torch.Tensor, ...]:
        """A forward's qkv [B, Hq + 2 Hkv, S, D] at `layer`: q rotated by `rot` (a rope.Rotation) [B, Hq, S, D], and
        the visible prefix [B, Hkv, T, D] of keys and values once its k (rotated) and v are written."""
        q, k, v = rot.split(qkv, heads)
        return (q, *self.write(layer, k, v))

    def write(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store pending keys/values [B, H_kv, S, D]; return the visible prefix [B, H_kv, T, D]."""
        s = k_new.shape[2]
        k, v = self.layers[layer]
        end = max(self.lengths) + s
        if len(set(self.lengths)) == 1:  # one length: every row's nodes go to the same slots
            k.narrow(2, end - s, s).copy_(k_new)
            v.narrow(2, end - s, s).copy_(v_new)
        else:  # ragged rows (a batch): row b's nodes go to slots [lengths[b], lengths[b] + S), whole D-vectors
            d = k_new.shape[-1]
            index = self.ragged_rows(s)  # made by the forward's first layer, used by all of them
            k.view(-1, d).index_copy_(0, index, k_new.reshape(-1, d))  # a layer's rows [B, H_kv, T_max] flat
            v.view(-1, d).index_copy_(0, index, v_new.reshape(-1, d))
        return k.narrow(2, 0, end), v.narrow(2, 0, end)

    def ragged_rows(self, s: int) -> torch.Tensor:
        """[B*H_kv*S] rows of a layer's flat [B*H_kv*T_max, D] view where S pending nodes go: (b, h, j) -> slot
        lengths[b] + j. Kept until the lengths or S change: one forward's layers share it."""
        key = (tuple(self.lengths), s)
        if self._ragged is None or self._ragged[0] != key:
            b, h, t = self.k.shape[1], self.k.shape[2], self.k.shape[3]
            dev = self.k.device
            slots = host_tensor(self.lengths, dev)[:, None] + torch.arange(s, device=dev)  # [B, S]
            base = (torch.arange(b, device=dev)[:, None] * h + torch.arange(h, device=dev)) * t  # [B, H_kv]
            self._ragged = (key, (base[:, :, None] + slots[:, None, :]).reshape(-1))
        return self._ragged[1]

    def commit(self, row: int, keep: list[int]) -> None:
        """Keep pending nodes `keep` (ascending indices into the last write) in slots [n, n + len(keep)); advance."""
        self.commit_seqs({row: keep}, 1)

    def commit_seqs(self, keeps: dict[int, list[int]], branches: int) -> None:
        """`commit` on the branch rows of each sequence in `keeps` (sequence -> keep), all moved nodes in one copy.
        A sequence's branch rows were fed the same nodes, so they hold one length."""
        moves: list[list[int]] = [[], [], []]  # row, source slot, destination slot of each node that moves
        for seq, keep in keeps.items():
            rows = range(seq * branches, (seq + 1) * branches)
            n = self.lengths[rows.start]
            if any(self.lengths[r] != n for r in rows):
                raise ValueError(f"rows {rows.start}..{rows.stop - 1} of one sequence hold different lengths")
            if keep != list(range(len(keep))):
                if any(b <= a for a, b in zip(keep, keep[1:])):  # commit_slots' moves rely on it (one tree path)
                    raise ValueError(f"a commit keeps a tree path, its nodes ascending: {keep}")
                for r in rows:
                    moves[0] += [r] * len(keep)
                    moves[1] += [n + i for i in keep]
                    moves[2] += range(n, n + len(keep))
            self.lengths[rows.start : rows.stop] = [n + len(keep)] * branches
        if moves[0]:
            moved = host_tensor(moves, self.k.device)  # [3, N]; a row's moves in its keep's (ascending) order
            if kernel_choice.one_pass(self.k):  # CUDA with the Triton kernels: k and v of every layer in one launch
                torch.ops.specgen.commit_slots(self.k, self.v, moved)
                return
            row, src, dst = moved.unbind()  # [N] each; sources precede destinations
            self.k[:, row, :, dst] = self.k[:, row, :, src]  # [N, L, H_kv, D] gathered whole, then written
            self.v[:, row, :, dst] = self.v[:, row, :, src]

    def commit_first(self, k: torch.Tensor, v: torch.Tensor, branches: int) -> None:
        """Every row's slot 0 holds keys and values k, v [L, B, Hkv, 1, D] (`static_step.first_node`'s: its rows'
        first node), committed: empty rows, each sequence on its `branches` rows."""
        self.k[:, :, :, :1].copy_(k)
        self.v[:, :, :, :1].copy_(v)
        self.commit_seqs(dict.fromkeys(range(self.batch // branches), [0]), branches)

    def rollback(self, row: int, length: int) -> None:
        """Forget everything at or after slot `length` in `row`."""
        if length > self.lengths[row]:
            raise ValueError(f"cannot roll row {row} forward from {self.lengths[row]} to {length}")
        self.lengths[row] = length

    def rows(self, start: int, stop: int) -> "KVCache":
        """A cache over rows [start, stop) sharing this one's buffers (writes land here); its lengths are a copy:
        hand the view back with `absorb` after committing through it."""
        if (start, stop) == (0, self.batch):  # every row: the same tensors, no views to make (each is a host op)
            return KVCache(self.k, self.v, list(self.lengths), self.cross, self.key_mask)
        return KVCache(
            self.k[:, start:stop], self.v[:, start:stop], self.lengths[start:stop],
            None if self.cross is None else [(k[start:stop], v[start:stop]) for k, v in self.cross],
            None if self.key_mask is None else self.key_mask[start:stop],
        )

    def absorb(self, view: "KVCache", start: int) -> None:
        """Take back the lengths, condition and key mask of `view` = `rows(start, start + view.batch)`."""
        stop = start + view.batch
        self.lengths[start:stop] = view.lengths
        if view.key_mask is None and self.key_mask is not None:
            self.key_mask[start:stop] = True  # the view's rows hide nothing
        elif view.key_mask is not None and (self.key_mask is None or not at_row(view.key_mask, self.key_mask, start)):
            if self.key_mask is None or self.key_mask.shape[1] != view.key_mask.shape[1]:
                self.key_mask = torch.ones(self.batch, view.key_mask.shape[1], dtype=torch.bool, device=self.k.device)
            self.key_mask[start:stop] = view.key_mask
        if view.cross is not None and view.cross is not self.cross:  # the same list: `rows`' view of every row
            if self.cross is None:
                self.cross = [(k.new_zeros((self.batch, *k.shape[1:])), v.new_zeros((self.batch, *v.shape[1:])))
                              for k, v in view.cross]
            for (k, v), (vk, vv) in zip(self.cross, view.cross):
                if not (at_row(vk, k, start) and at_row(vv, v, start)):  # `rows`' own views: already in place
                    k[start:stop], v[start:stop] = vk, vv

    def move_seq(self, src: int, dst: int, branches: int) -> None:
        """Copy the `branches` rows of sequence `src` (committed slots, lengths, condition, key mask) into those of
        sequence `dst` (compacting a batch)."""
        for s, d in zip(range(src * branches, (src + 1) * branches), range(dst * branches, (dst + 1) * branches)):
            n = self.lengths[s]
            self.k[:, d, :, :n] = self.k[:, s, :, :n]
            self.v[:, d, :, :n] = self.v[:, s, :, :n]
            self.lengths[d] = n
            if self.key_mask is not None:
                self.key_mask[d] = self.key_mask[s]
            for k, v in self.cross or ():
                k[d], v[d] = k[s], v[s]

    def clear_seq(self, seq: int, branches: int) -> range:
        """Empty the `branches` rows of sequence `seq`; their row range."""
        rows = range(seq * branches, (seq + 1) * branches)
        self.lengths[rows.start : rows.stop] = [0] * branches
        return rows

    def prefix_mask(self, s: int, tree_mask: torch.Tensor | None) -> torch.Tensor | None:
        """Boolean attention mask [B, 1, S, T] for S pending nodes (None: all visible); `tree_mask` [S, S] or [B, S, S]:
        which pending nodes see which (None: causal). Committed slots are visible, except `key_mask` ones."""
        if s == 1 and self.key_mask is None and len(set(self.lengths)) == 1:
            return None
        total = max(self.lengths) + s
        device = self.k.device
        lengths = host_tensor(self.lengths, device)
        if s == 1:  # one node per row (a batched AR step over ragged rows): its slot and the committed ones, 3 ops
            mask = torch.arange(total, device=device)[None, :] <= lengths[:, None]  # [B, T]
            return self.hide_keys(mask[:, None, None, :])
        if tree_mask is None:
            tree_mask = torch.ones(s, s, dtype=torch.bool, device=device).tril()
        tree_mask = tree_mask.to(device)
        if tree_mask.dim() == 2:
            tree_mask = tree_mask.unsqueeze(0).expand(self.batch, s, s)
        elif tree_mask.shape[0] != self.batch:  # one mask per sequence over several branch rows each (CFG)
            tree_mask = tree_mask.repeat_interleave(self.batch // tree_mask.shape[0], 0)
        rel = torch.arange(total, device=device)[None, :] - lengths[:, None]  # [B, T]: slot - row length
        pending = tree_mask.gather(2, rel.clamp(0, s - 1)[:, None, :].expand(self.batch, s, total))  # [B, S, T]
        pending &= ((rel >= 0) & (rel < s))[:, None, :]
        mask = (pending | (rel < 0)[:, None, :]).unsqueeze(1)  # committed slots (rel < 0) are visible
        return self.hide_keys(mask)

    def mask_every_slot(self) -> torch.Tensor:
        """A key mask over every slot of every row ([B, T], all visible, made once): what a step that hides its own
        rejected nodes until a later commit writes (a run_ahead loop step's, methods/*_ahead.py)."""
        if self.key_mask is None:
            self.key_mask = torch.ones(self.batch, self.k.shape[3], dtype=torch.bool, device=self.k.device)
        return self.key_mask

    def hide_keys(self, mask: torch.Tensor) -> torch.Tensor:
        """`mask` [B, 1, S, T] over slots with the `key_mask` slots hidden (unchanged when there is none)."""
        if self.key_mask is None:
            return mask
        m = min(self.key_mask.shape[1], mask.shape[-1])
        mask = mask.clone()
        mask[..., :m] &= self.key_mask[:, None, None, :m].to(mask.device)
        return mask


def at_row(view: torch.Tensor, whole: torch.Tensor, row: int) -> bool:
    """Whether `view` starts at row `row` of `whole` (the same memory: a copy between them would change nothing)."""
    return view.data_ptr() == whole.data_ptr() + row * whole.stride(0) * whole.element_size()
