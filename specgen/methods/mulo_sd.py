"""MuLo-SD: multi-scale local speculative decoding for visual AR models (LOSSY; docs/methods/mulo-sd.md)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from safetensors import safe_open

from specgen import checkpoints, registry
from specgen.decoding.draft import Draft
from specgen.decoding.draft_verify import DrafterBase
from specgen.decoding.pool import PolicyBase, RowStep
from specgen.decoding.sampling import logits_to_probs, pick
from specgen.decoding.verify import forward_span
from specgen.devices import host_tensor
from specgen.errors import IncompatibleError, UsageError
from specgen.image.neighbours import neighbour_table, scaled_k
from specgen.image.target import CFGTarget
from specgen.methods.options import MuloOptions
from specgen.models.graphs import attach
from specgen.models.layout import decode_layout

def pooled_mass(probs: torch.Tensor, draft: torch.Tensor, neighbours: torch.Tensor, delta: float) -> torch.Tensor:
    """Eq. 5 mass per draft token: p_t(x~_t) + the largest k-NN prefix mass <= delta; probs [L, V], draft [L]."""
    own = probs.gather(1, draft[:, None])[:, 0]
    c = probs.gather(1, neighbours[draft]).cumsum(1)  # [L, k], non-decreasing
    pooled = torch.where(c <= delta, c, torch.zeros_like(c)).amax(1) if c.shape[1] else torch.zeros_like(own)
    return own.double() + pooled.double()


def neighbourhood(t: int, t0: int, radius: int, width: int, start: int, end: int) -> list[int]:
    """N(t, l) of Eq. 6, clipped to the grid's columns and to the block [start, end); sorted."""
    i, j = divmod(t, width)
    cells = (r * width + c for r in range(max(0, i - radius), i + radius + 1)
             for c in range(max(0, j - radius), min(width - 1, j + radius) + 1))
    return [u for u in cells if max(t0, start) <= u < end]


def expand_rejections(rejected: Iterable[int], radius: int, width: int, start: int, end: int,
                      mode: str = "local") -> list[int]:
    """R_X (sorted) for rejected positions R_T in the block [start, end): local expansion of radius l (Eq. 7), or
    raster [t_0, end) (`mode` and `radius` as `MuloOptions` checked them)."""
    rejected = sorted(set(rejected))
    if not rejected:
        return []
    if mode == "raster":
        return list(range(rejected[0], end))
    return sorted({u for t in rejected for u in neighbourhood(t, rejected[0], radius, width, start, end)})


@dataclass
class MuLoSD(DrafterBase):
    """One image's MuLo-SD parts and options; `MuLoBatch` runs the rows."""

    lowres: torch.nn.Module  # class-conditional GPT on the g x g grid
    pair: Any  # UpDownSampler (scale r = G / g)
    neighbours: torch.Tensor  # [V, k] nearest codes (LANTERN table)
    grid: int  # G
    tau: float = 1e-4  # the paper's, for 16,384 codes (`build_mulo` scales it to the codebook)
    delta: float = MuloOptions.lantern_delta
    radius: int = MuloOptions.radius
    rejection: str = MuloOptions.rejection
    draft_rows: int = MuloOptions.draft_rows
    seed: int = 0

    @property
    def low_grid(self) -> int:
        return self.lowres.cfg.rope_grid

    def step_policy(self, make: Callable[[int], "MuLoSD"], target, rule, budget) -> "MuLoBatch":
        """MuLo-SD's own steps on the shared batched loop (`make(0)` is this row); its own accept rule."""
        return MuLoBatch(make, target)


@dataclass
class MuLoRow:
    """One image's MuLo-SD state in a slot, kept across loop steps."""

    dec: MuLoSD
    lhead: torch.Tensor  # drafter logits after the fed low-res prefix
    head: torch.Tensor | None = None  # target logits for image token 0 (nothing fed yet)
    dgen: torch.Generator | None = None
    n: int = 0  # image tokens emitted (whole blocks)
    pending: list[int] = field(default_factory=list)  # emitted tokens not yet fed to the target
    low_tokens: list[int] = field(default_factory=list)  # y fed to the drafter
    block: list[int] | None = None  # the block being settled (draft tokens, re-sampled in place)
    redo: list[int] = field(default_factory=list)  # block positions still to re-sample (after the first)
    fed_upto: int = 0
    feed: int = 0  # nodes fed this step


class MuLoBatch(PolicyBase):
    """StepPolicy: per row and step a draft or a re-sample step; a block's tokens are emitted once re-sampled (R_X).

    Each row keeps its own drafter cache rows and generators, so its output does not depend on its batch mates."""

    extras = ("draft_tokens", "pass_tokens", "rejected_tokens", "resampled_tokens", "expanded_tokens",
              "resample_forwards", "lowres_tokens", "drafter_prefix_forwards")

    def __init__(self, make: Callable[[int], MuLoSD], target) -> None:
        self.make, self.target = make, target
        dec = make(0)
        self.max_feed = 2 * (dec.grid // dec.low_grid) * dec.grid * dec.draft_rows  # pending + a block

    def open(self, width: int, max_len: int) -> None:
        dec = self.make(0)
        steps = self.target.model.graphs  # the drafter's forwards are captured where the target's are
        if steps is None:
            attach(dec.lowres, "off")
        elif dec.lowres.graphs is None:
            attach(dec.lowres, "on" if steps.strict else "auto", steps.capture)
        self.low = CFGTarget(dec.lowres, self.target.cfg_scale)  # one drafter cache for the batch
        self.br = self.low.branches
        self.cache = self.low.new_cache(width, 2 + dec.low_grid ** 2)
        super().open(width, max_len)

    def admit(self, slot: int, index: int, prompt: list[int], first) -> None:
        dec = self.make(index)  # its `lowres` is the batch's: `_load` returns one module per checkpoint and device
        rows = self.cache.clear_seq(slot, self.br)
        view = self.cache.rows(rows.start, rows.stop)
        lhead = self.low.prefill(torch.tensor([prompt]), view).logits[0, -1]
        self.cache.absorb(view, rows.start)
        self.rows[slot] = MuLoRow(dec, lhead, first.logits[0, -1])

    def start(self, slot: int, first, params, generator, stats) -> list[int]:
        row = self.rows[slot]
        base = generator.initial_seed() if generator is not None else 0  # derived: the decode generator is not consumed
        row.dgen = torch.Generator().manual_seed((base * 1_000_003 + 7919 * row.dec.seed + 0x5EED) % (2**63))
        stats.extras.update(dict.fromkeys(self.extras, 0))
        stats.drafter_forwards += 1  # the drafter's prefill
        return []  # token 0 is drafted too

    def finished(self, slot: int) -> bool:
        row = self.rows[slot]
        return row.n >= row.dec.grid ** 2

    def plan(self, seqs, budgets, stats, generators, params, clock) -> list[RowStep]:
        rows = self.rows[: len(seqs)]
        # Rows verify together: while any row re-samples (a short feed), the others wait instead of drafting, so a
        # verify (r * G tokens or more) never pads re-sampling rows to its length. Waiting changes no row's output.
        drafting = [] if any(row.redo for row in rows) else list(range(len(rows)))
        if drafting:
            for i, x_hi in zip(drafting, self.draft(drafting, seqs, params, stats, clock)):
                rows[i].block = x_hi
        steps = []
        for row in rows:
            if row.redo:  # 6. re-sample: feed the tokens since the last re-sampled one
                chunk = row.block[row.fed_upto : row.redo[0]]
            elif not drafting:
                steps.append(RowStep())  # waits (sits out the forward)
                continue
            else:  # 3. verify: pending + x~[:-1]
                chunk = row.pending + row.block[:-1]
            row.feed = len(chunk)
            steps.append(RowStep(chunk[0], Draft.chain(chunk[1:])))
        return steps

    def low_forward(self, feeds: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """One drafter forward over the slots in `feeds` (`forward_span`), chains committed; logits [S_i, V] each."""
        lo = min(feeds)
        span = forward_span(self.low, self.cache, {i: (c[0], Draft.chain(c[1:])) for i, c in feeds.items()})
        span.view.commit_seqs({i - lo: list(range(len(chain))) for i, chain in feeds.items()}, self.br)
        self.cache.absorb(span.view, lo * self.br)
        return {i: span.out.logits[i - lo, : len(chain)] for i, chain in feeds.items()}

    def draft(self, slots: list[int], seqs, params, stats, clock) -> list[list[int]]:
        """7. down-sample each row's accepted prefix and feed its new low-res rows to the drafter, 1. draft
        whole low-res rows (one drafter forward per drafted token over every drafting row), 2. up-sample: x~ per
        row."""
        device, rows = self.target.device, self.rows
        feeds, shape = {}, {}
        for i in slots:
            row, seq = rows[i], seqs[i]
            G, g = row.dec.grid, row.dec.low_grid
            r, n = G // g, row.n
            m = n // (r * G)
            shape[i] = (m, min(row.dec.draft_rows, g - m), g, r)
            if m * g > len(row.low_tokens):
                with clock("downsample"):
                    grid_hi = host_tensor(seq[len(seq) - n :], device).view(1, m * r, G)
                    y = row.dec.pair.downsample_tokens(grid_hi)[0].flatten().tolist()
                feeds[i] = y[len(row.low_tokens) :]
                row.low_tokens = y
                stats[i].drafter_forwards += 1
                stats[i].extras["drafter_prefix_forwards"] += 1
        with clock("propose"):
            if feeds:
                for i, logits in self.low_forward(feeds).items():
                    rows[i].lhead = logits[-1]
            drafted = {i: [] for i in slots}
            logits = {i: rows[i].lhead for i in slots}
            for k in range(max(d * g for _, d, g, _ in shape.values())):
                feeds = {}
                for i in slots:
                    total = shape[i][1] * shape[i][2]
                    if k < total:
                        drafted[i].append(pick(logits[i], params, rows[i].dgen))
                        if k + 1 < total:
                            feeds[i] = [drafted[i][-1]]
                            stats[i].drafter_forwards += 1
                if feeds:
                    logits = {i: lg[-1] for i, lg in self.low_forward(feeds).items()}
            for i in slots:  # forget the drafted rows: next step feeds D_r(x) instead
                for b in range(i * self.br, (i + 1) * self.br):
                    self.cache.rollback(b, 1 + len(rows[i].low_tokens))
        out = []
        for i in slots:
            m, d, g, r = shape[i]
            stats[i].extras["lowres_tokens"] += len(drafted[i])
            with clock("upsample"):
                y_all = host_tensor(rows[i].low_tokens + drafted[i], device).view(1, m + d, g)
                out.append(rows[i].dec.pair.upsample_tokens(y_all)[0, m * r :].flatten().tolist())
        return out

    def settle(self, fed, lo, out, sizes, params, generators, stats, clock) -> list[tuple[list[int], list[int]]]:
        results = []
        for i, gen, s in zip(fed, generators, stats):
            row, j = self.rows[i], i - lo
            if row.redo:  # 6. the last logits of the chunk give the next re-sampled token
                t = row.redo.pop(0)
                with clock("resample"):
                    row.block[t] = pick(out.logits[j, sizes[j] - 1], params, gen)
                row.fed_upto = t
                s.extras["resample_forwards"] += 1
                results.append((list(range(row.feed)), self.emit(row)))
                continue
            results.append(self.verify(row, out.logits[j, : sizes[j]], params, gen, s, clock))
        return results

    def verify(self, row: MuLoRow, logits: torch.Tensor, params, gen, stats, clock) -> tuple[list[int], list[int]]:
        """3.-6. the pooled-mass rule on a block's verify logits, the expansion, and the first re-sample."""
        dec, x_hi, n, P = row.dec, row.block, row.n, len(row.pending)
        L = len(x_hi)
        rows = logits[P - 1 :] if P else torch.cat([row.head[None], logits])
        lg = rows[:L].float()
        with clock("accept"):  # 4./5. accept by pooled mass, expand the rejections
            probs = lg.softmax(-1) if params.greedy else logits_to_probs(lg, params)
            mass = pooled_mass(probs, host_tensor(x_hi, lg.device), dec.neighbours, dec.delta)
            passed = (mass >= dec.tau).tolist()
            rejected = [n + t for t, ok in enumerate(passed) if not ok]
            redo = [u - n for u in expand_rejections(rejected, dec.radius, dec.grid, n, n + L, dec.rejection)]
        stats.record(L, L, L - len(redo))
        x = stats.extras
        x["draft_tokens"] += L
        x["pass_tokens"] += sum(passed)
        x["rejected_tokens"] += len(rejected)
        x["resampled_tokens"] += len(redo)
        x["expanded_tokens"] += len(redo) - len(rejected)
        if not redo:
            row.fed_upto = L - 1
            return list(range(row.feed)), self.emit(row)
        t0 = redo[0]
        with clock("resample"):
            x_hi[t0] = pick(lg[t0], params, gen)
        row.fed_upto, row.redo = t0, redo[1:]
        return list(range(P + t0)), self.emit(row)  # their KV saw only accepted tokens

    @staticmethod
    def emit(row: MuLoRow) -> list[int]:
        """The block's tokens once its re-sampling is done (nothing before)."""
        if row.redo:
            return []
        tokens, row.block = row.block, None
        row.pending = tokens[row.fed_upto :]
        row.n += len(tokens)
        return tokens


# --- building from method options --------------------------------------------------------------------------

_LOADED: dict[tuple[str, str], tuple[int, torch.nn.Module]] = {}  # (path, device) -> (weights' mtime, module)


def _load(entry, device) -> torch.nn.Module:
    key = (str(entry.path), str(device))
    stamp = (entry.path / registry.WEIGHTS).stat().st_mtime_ns
    hit = _LOADED.get(key)
    if hit is None or hit[0] != stamp:
        hit = _LOADED[key] = (stamp, decode_layout(checkpoints.load_module(entry, device)))
    return hit[1]


def vq_codebook_of(entry) -> torch.Tensor | None:
    """The raw codebook [V, D] of the VQ a GPT entry was trained on (only that tensor is read), or None."""
    vq = entry.meta.get("vq")
    if not vq:
        return None
    with safe_open(str(checkpoints.find(vq).path / registry.WEIGHTS), "pt") as f:
        return f.get_tensor("quantize.embedding.weight").float()


def same_codebook(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.float().cpu(), b.float().cpu(), atol=1e-3, rtol=1e-3)


def build_mulo(parts, o: MuloOptions) -> MuLoSD:
    """A row's MuLo-SD from `ImageParts` and its options (defaults: docs/methods/mulo-sd.md); misfit assets: a line."""
    if parts.codebook is None:
        raise UsageError("mulo-sd needs the target's VQ codebook")
    G, vocab = parts.grid, parts.model.cfg.vocab_size
    device = parts.target.device
    low_entry = checkpoints.find(o.lowres or MuloOptions.lowres)
    if low_entry.meta.get("modality") != "image" or low_entry.kind != "target":  # an up-sampler, VQ: no GPT
        raise UsageError(f"mulo-sd low-resolution drafter {low_entry.ref} is not an image GPT (a target entry)")
    low_vocab = low_entry.meta.get("vocab_size", low_entry.meta.get("kwargs", {}).get("vocab_size"))
    low_cb = vq_codebook_of(low_entry)
    if low_vocab != vocab or (low_cb is not None and not same_codebook(low_cb, parts.codebook)):
        raise IncompatibleError(f"mulo-sd low-resolution drafter {low_entry.ref} uses another VQ codebook "
                                f"({low_entry.meta.get('vq')}, {low_vocab} codes) than the target ({vocab} codes)")
    lowres = _load(low_entry, device)
    g = lowres.cfg.rope_grid
    if g >= G or G % g or (G // g) & (G // g - 1):
        raise IncompatibleError(f"mulo-sd needs a drafter grid g with G / g a power of two >= 2 "
                                f"(target {G}x{G}, drafter {low_entry.ref} {g}x{g})")
    if lowres.cfg.num_classes != parts.model.cfg.num_classes:
        raise IncompatibleError(f"mulo-sd drafter {low_entry.ref} has {lowres.cfg.num_classes} classes, "
                                f"the target {parts.model.cfg.num_classes}")
    r = G // g
    up_entry = checkpoints.find(o.upsampler or f"tiny-image-upsampler-{r}x")
    scale = up_entry.meta.get("scale", up_entry.meta.get("kwargs", {}).get("scale"))
    if up_entry.meta.get("builder") != "mulo-updown":
        raise UsageError(f"{up_entry.ref} is not a MuLo-SD up/down-sampler pair")
    if scale != r:
        raise IncompatibleError(f"up-sampler {up_entry.ref} is for {scale}x, but {g}x{g} -> {G}x{G} needs {r}x")
    pair = _load(up_entry, device)
    if not same_codebook(pair.codebook, parts.codebook):
        raise IncompatibleError(f"up-sampler {up_entry.ref} was trained for another VQ codebook than the target's")
    table = neighbour_table(parts.codebook, o.lantern_k or scaled_k(parts.codebook.shape[0])).to(device)
    tau = 1e-4 * 16384 / vocab if o.tau is None else o.tau  # the paper's tau as the same multiple of 1 / vocab
    return MuLoSD(lowres, pair, table, G, tau=tau, delta=o.lantern_delta, radius=o.radius, rejection=o.rejection,
                  draft_rows=min(o.draft_rows, g), seed=o.seed)
