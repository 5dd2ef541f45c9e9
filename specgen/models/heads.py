"""XSpecMesh decoding heads: head d predicts token s + d + 1 from h_s (eq. 4; options: docs/methods/xspecmesh.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specgen.models.transformer import RMSNorm, rms_norm, split_kv

HEAD_KINDS = ("ca", "mlp")


@dataclass(frozen=True)
class HeadsConfig:
    """Shape of a head stack; JSON-serialisable."""

    num_heads: int = 4  # D
    kind: str = "ca"  # "ca" (cross-attention) | "mlp"
    dim: int = 256  # backbone hidden width
    cross_dim: int = 256  # condition width (backbone's cross_dim)
    n_heads: int = 4  # attention heads inside a CA head
    inner_dim: int = 128  # attention width inside a CA head
    vocab_size: int = 5121
    token_input: bool = False  # beyond the paper: heads also see E(x_{s+1})
    res_layers: int = 1  # residual blocks per head (Medusa's medusa_num_layers)
    history: int = 0  # beyond the paper: CA heads also attend to the last `history` hidden states

    def __post_init__(self) -> None:
        if self.kind not in HEAD_KINDS:
            raise ValueError(f"unknown head kind {self.kind!r}; kinds: {', '.join(HEAD_KINDS)}")
        if self.res_layers < 1:
            raise ValueError(f"res_layers must be >= 1, got {self.res_layers}")
        if self.history < 0 or (self.history and self.kind != "ca"):
            raise ValueError(f"history must be >= 0 and needs cross-attention heads, got {self.history} ({self.kind})")

    def to_dict(self) -> dict:
        return asdict(self)


class ResBlock(nn.Module):
    """Medusa's residual block x + SiLU(Linear(x)), zero-initialised (identity at start)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class HeadBody(nn.Module):
    """One head body: h -> (CA heads) h + CrossAttn(norm h, c [+ recent h]) -> res_layers ResBlocks (MLP heads, the
    ablation: the residual blocks only, no condition)."""

    def __init__(self, cfg: HeadsConfig) -> None:
        super().__init__()
        self.cross, self.history = cfg.kind == "ca", cfg.history
        self.n, self.hd = cfg.n_heads, cfg.inner_dim // cfg.n_heads
        if self.cross:
            self.norm = RMSNorm(cfg.dim, 1e-5)
            self.wq = nn.Linear(cfg.dim, cfg.inner_dim, bias=False)
            self.wkv = nn.Linear(cfg.cross_dim, 2 * cfg.inner_dim, bias=False)
            self.wo = nn.Linear(cfg.inner_dim, cfg.dim, bias=False)
            nn.init.zeros_(self.wo.weight)
        if cfg.history:  # keys/values of a window row: wkv_h(norm h) + wkv_h(pos_h[k]) (one projection per h)
            self.wkv_h = nn.Linear(cfg.dim, 2 * cfg.inner_dim, bias=False)
            self.pos_h = nn.Parameter(torch.randn(cfg.history, cfg.dim) * 0.02)
        self.res = ResBlock(cfg.dim)  # the residual blocks: `res` (Medusa-1's one; key kept so old files load), `more`
        self.more = nn.Sequential(*(ResBlock(cfg.dim) for _ in range(cfg.res_layers - 1)))

    def context_kv(self, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Keys/values [B, H, M, hd] of the condition [B, M, cross_dim] (None: an MLP head)."""
        return split_kv(self.wkv(cond), self.n, self.hd) if self.cross else None

    def forward(self, h: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor] | None,
                past: torch.Tensor | None = None) -> torch.Tensor:
        """h [B, S, dim] -> [B, S, dim]; past [B, S, dim] = the hidden rows the history window reads (default h)."""
        if self.cross:
            b, s, _ = h.shape
            q = self.wq(self.norm(h)).view(b, s, self.n, self.hd).transpose(1, 2)  # [B, H, S, hd]
            if self.history:
                y = self.attend_with_history(q, kv, h if past is None else past)
            else:
                y = F.scaled_dot_product_attention(q, kv[0], kv[1])  # [B, H, S, hd]
            h = h + self.wo(y.transpose(1, 2).reshape(b, s, -1))
        return self.more(self.res(h))

    def attend_with_history(self, q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                            past: torch.Tensor) -> torch.Tensor:
        """Softmax over the condition's M keys and row s's W window keys at once; q [B, H, S, hd] -> [B, H, S, hd]."""
        b, s, _ = past.shape
        w = self.history
        rows = F.pad(self.wkv_h(self.norm(past)), (0, 0, w - 1, 0)).unfold(1, w, 1).flip(-1).transpose(-1, -2)
        rows = rows + self.wkv_h(self.pos_h)  # [B, S, W, 2 inner]: slot k of row s is row s - k's, + offset tags
        valid = torch.arange(s, device=q.device)[:, None] >= torch.arange(w, device=q.device)[None]  # [S, W]: s >= k
        kh, vh = rows.view(b, s, w, 2, self.n, self.hd).permute(3, 0, 4, 1, 2, 5)  # [B, H, S, W, hd] each
        scale = self.hd**-0.5
        s_cond = q @ kv[0].transpose(-1, -2) * scale  # [B, H, S, M]
        s_hist = torch.einsum("bhsd,bhswd->bhsw", q, kh) * scale  # [B, H, S, W]
        s_hist = s_hist.masked_fill(~valid, float("-inf"))
        att = torch.cat([s_cond, s_hist], -1).softmax(-1)
        m = s_cond.shape[-1]
        return att[..., :m] @ kv[1] + torch.einsum("bhsw,bhswd->bhsd", att[..., m:], vh)


class XSpecMeshHeads(nn.Module):
    """D decoding heads over the backbone's final hidden states (head d = index d - 1), logits by the backbone's LM
    head; residual branches start at zero, so an untrained head predicts the next-token distribution."""

    def __init__(self, **kwargs) -> None:
        super().__init__()
        cfg = self.cfg = HeadsConfig(**kwargs)
        self.heads = nn.ModuleList(HeadBody(cfg) for _ in range(cfg.num_heads))
        if cfg.token_input:  # Linear_d(E(x_{s+1})) added to h_s, zero at start
            self.tok = nn.ModuleList(nn.Linear(cfg.dim, cfg.dim, bias=False) for _ in range(cfg.num_heads))
            for lin in self.tok:
                nn.init.zeros_(lin.weight)
        self.graphs = None  # models/graphs.StepGraphs: `head_logits` as CUDA-graph replays (graphs.attach)

    @property
    def num_heads(self) -> int:
        return self.cfg.num_heads

    def context_kv(self, cond: torch.Tensor) -> list:
        """Per-head condition K/V (None for MLP heads); compute once per mesh."""
        return [head.context_kv(cond) for head in self.heads]

    def head_features(self, d: int, hidden: torch.Tensor, kv, emb: torch.Tensor | None = None) -> torch.Tensor:
        """Head d + 1 (index d) on hidden [B, S, dim]; emb [B, S, dim] = E(x_{s+1}) per row (token_input)."""
        if self.cfg.token_input:
            if emb is None:
                raise ValueError("these heads take the next token's embedding (token_input); pass emb")
            return self.heads[d](hidden + self.tok[d](emb), kv, hidden)
        return self.heads[d](hidden, kv)

    def stacked(self) -> "StackedHeads":
        """Detached copies of the weights stacked for one-row decoding (see StackedHeads)."""
        hs, cfg = list(self.heads), self.cfg
        stack = lambda get, mods=hs: torch.stack([get(x).detach() for x in mods])  # noqa: E731
        weights = lambda get, mods=hs: stack(lambda x: get(x).t(), mods).contiguous()  # noqa: E731  [D, in, out]
        # the residual blocks (`res`, then `more`) layer-major [L, D, ...]: each layer batched over the D heads
        res_w = stack(lambda x: torch.stack([b.linear.weight.t() for b in (x.res, *x.more)]))  # [D, L, in, out]
        res_b = stack(lambda x: torch.stack([b.linear.bias for b in (x.res, *x.more)]))  # [D, L, dim]
        common = dict(kind=cfg.kind, n_heads=cfg.n_heads, res_w=res_w.transpose(0, 1).contiguous(),
                      res_b=res_b.transpose(0, 1).contiguous())
        if cfg.token_input:
            common["tok_w"] = weights(lambda lin: lin.weight, self.tok)
        if cfg.kind != "ca":
            return StackedHeads(eps=0.0, **common)
        if cfg.history:
            common["wkv_h"] = weights(lambda x: x.wkv_h.weight)
            common["pos_kv"] = stack(lambda x: x.wkv_h(x.pos_h))
        return StackedHeads(eps=hs[0].norm.eps, norm_w=stack(lambda x: x.norm.weight),
                            wq=weights(lambda x: x.wq.weight), wo=weights(lambda x: x.wo.weight), **common)


@dataclass(frozen=True)
class StackedHeads:
    """The D head bodies' weights stacked along a leading D axis, input-major [D, in, out], for decoding one row:
    `features` equals the D `XSpecMeshHeads.head_features` on one hidden state (or on several, each alike: a row's
    verify positions) with each layer of all D heads one `bmm`.
    Built per generation (`XSpecMeshHeads.stacked`), so it reflects the current weights; inference only."""

    kind: str
    n_heads: int
    eps: float
    res_w: torch.Tensor  # [L, D, dim (in), dim (out)]: the L = res_layers residual blocks
    res_b: torch.Tensor  # [L, D, dim]
    norm_w: torch.Tensor | None = None  # [D, dim]        (CA heads only, below)
    wq: torch.Tensor | None = None  # [D, dim, inner]
    wo: torch.Tensor | None = None  # [D, inner, dim]
    tok_w: torch.Tensor | None = None  # [D, dim, dim]     (token_input heads only)
    wkv_h: torch.Tensor | None = None  # [D, dim, 2 inner]  (history heads only)
    pos_kv: torch.Tensor | None = None  # [D, W, 2 inner]    wkv_h(pos_h), the offset tags' K/V

    def context_kv(self, per_head: list) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Per-head condition K/V ([1, H, M, hd] each, from `XSpecMeshHeads.context_kv`) -> [D, H, M, hd] x 2."""
        return None if self.kind != "ca" else (torch.cat([k for k, _ in per_head]), torch.cat([v for _, v in per_head]))

    @property
    def token_input(self) -> bool:
        return self.tok_w is not None

    @property
    def history(self) -> int:
        return 0 if self.pos_kv is None else self.pos_kv.shape[1]

    def features(self, h: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor] | None,
                 emb: torch.Tensor | None = None, past: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states h [S, dim] (+ E(x_{s+1}) emb [S, dim]) -> head features [D S, dim], head-major (before the LM
        head; [D, dim] for one state); each layer of all D heads on all S states one `bmm`. past [D, W', 2 inner]
        (history heads, S = 1): `project_history` of the latest hidden states, newest (= h) first. Condition K/V of R
        rows ([R, D, H, M, hd] each): h holds R rows' states, S / R each in row order, each attending to its own."""
        z = h.expand(self.res_b.shape[1], *h.shape)  # [D, S, dim]
        if self.tok_w is not None:
            z = z + torch.bmm(emb.expand_as(z), self.tok_w)  # [D, S, dim]
        if self.kind == "ca":
            q = torch.bmm(rms_norm(z, self.norm_w[:, None], self.eps), self.wq)  # [D, S, inner]
            d, s, inner = q.shape
            k, v = kv if not self.history else self.with_history(kv, past)  # [(R,) D, H, M (+ W'), hd]
            r = k.shape[0] if k.dim() == 5 else 1
            q = q.view(d, r, s // r, self.n_heads, inner // self.n_heads).permute(1, 0, 3, 2, 4)  # [R, D, H, S/R, hd]
            y = F.scaled_dot_product_attention(q.flatten(0, 1), k.reshape(-1, *k.shape[-3:]),
                                               v.reshape(-1, *v.shape[-3:]))  # [R D, H, S/R, hd]
            y = y.view(r, d, *y.shape[1:]).permute(1, 0, 3, 2, 4).reshape(d, s, inner)  # [D, S, inner]
            z = z + torch.bmm(y, self.wo)  # [D, S, dim]
        for w, b in zip(self.res_w, self.res_b):  # one ResBlock of each of the D heads at once
            z = z + F.silu(torch.baddbmm(b.unsqueeze(1), z, w))
        return z.reshape(-1, z.shape[-1])

    def project_history(self, rows: torch.Tensor) -> torch.Tensor:
        """Hidden states rows [n, dim] -> each head's window K/V rows [D, n, 2 inner] (RMSNorm, wkv_h; no offset tag),
        projected once per committed hidden state."""
        return torch.bmm(rms_norm(rows, self.norm_w[:, None], self.eps), self.wkv_h)  # [D, n, 2 inner]

    def with_history(self, kv: tuple[torch.Tensor, ...], past: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Condition K/V [D, H, M, hd] x 2 extended by the window past [D, W', 2 inner] -> [D, H, M + W', hd] x 2."""
        w = min(past.shape[1], self.history)
        rows = past[:, :w] + self.pos_kv[:, :w]  # + offset tags, [D, W', 2 inner]
        d, h, _, hd = kv[0].shape
        kh, vh = rows.view(d, w, 2, h, hd).permute(2, 0, 3, 1, 4)  # [D, H, W', hd] each
        return torch.cat([kv[0], kh], 2), torch.cat([kv[1], vh], 2)


def head_logits(stacked: StackedHeads, lm_head: nn.Module, embed: nn.Module, dtype: torch.dtype, d: int,
                h: torch.Tensor, token: torch.Tensor | None = None, k: torch.Tensor | None = None,
                v: torch.Tensor | None = None, past: torch.Tensor | None = None) -> tuple[torch.Tensor]:
    """The first d heads' logits [d S, V] (float32; head-major, [d, V] for one state) on one row's hidden states
    h [S, dim]: token [S] = x_{s+1} of each (token_input heads), k, v [D, H, M, hd] its condition's K/V (CA heads),
    past [D, W', 2 inner] its window (history heads, S = 1); the LM head runs in `dtype`. Device ops only, shapes
    fixed by the inputs' (what a captured heads step replays)."""
    emb = embed(token) if stacked.token_input else None  # [S, dim]
    feats = stacked.features(h, None if k is None else (k, v), emb, past)[: d * h.shape[0]].to(dtype)  # [d S, dim]
    return (lm_head(feats).float(),)
