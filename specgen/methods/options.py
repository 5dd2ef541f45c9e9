"""Method options (`method_options.NAME=VALUE`) as frozen dataclasses: one class per method family."""

from __future__ import annotations

# imports nothing heavy: `--dry-run` and every suite's plan parse each row's options before a model loads
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from specgen.errors import UsageError

Check = tuple[Callable[[Any], bool], str]  # (predicate, what a value must be)


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    return (is_int(v) or isinstance(v, float)) and math.isfinite(v)


MAX_INT = 2 ** 31 - 1  # sizes beyond this are not sizes (and overflow int32 kernels)


def int_at_least(lo: int) -> Check:
    return (lambda v: is_int(v) and lo <= v <= MAX_INT), f">= {lo} (an integer below 2**31)"


def number_in(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> Check:
    def ok(v: Any) -> bool:
        return is_number(v) and (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)

    return ok, f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'} (a finite number)"


def one_of(*choices: str) -> Check:
    return (lambda v: v in choices), "one of " + ", ".join(choices)


def int_in(lo: int, hi: int) -> Check:
    return (lambda v: is_int(v) and lo <= v <= hi), f"an integer in {lo}..{hi}"


TEXT: Check = ((lambda v: isinstance(v, str)), "a string")
FLAG: Check = ((lambda v: isinstance(v, bool)), "true or false")
NONNEG_NUMBER: Check = ((lambda v: is_number(v) and v >= 0), ">= 0 (a finite number)")
POS_NUMBER: Check = ((lambda v: is_number(v) and v > 0), "> 0 (a finite number)")
SEED: Check = int_at_least(0)  # `seed` is accepted by every method


def opt(default: Any, check: Check | None = None, gpu: Any = None) -> Any:
    """A dataclass field with its default and its single-value check (None: any value, e.g. `budget`); `gpu`: its
    default on a GPU where that differs (`gpu_defaults`)."""
    return field(default=default, metadata={"check": check, "gpu": gpu})


def gpu_defaults(cls: type) -> dict[str, Any]:
    """The fields of an options class whose default differs on a GPU, each with that default: what a verify costs
    differs there (c(64) ~ 1 one-node step against ~n/2 on a CPU core), so a draft's best size does."""
    return {f.name: f.metadata["gpu"] for f in fields(cls) if f.metadata.get("gpu") is not None}


def check_value(name: str, value: Any, check: Check | None, method: str) -> None:
    if check is not None and not check[0](value):
        raise UsageError(f"{name} must be {check[1]} (option {name} of {method}), got {value!r}")


class Options:
    """Base of the option dataclasses: `validate()`."""

    def check(self) -> None:
        """Rules between options (a family overrides it); single values are checked by their fields."""

    def check_use(self, modality: str, greedy: bool) -> None:
        """Rules between the options and the run: the modality decoded, greedy or sampled (a family overrides it)."""

    def validate(self, method: str = "") -> None:
        """Every field against its check (a None that is the field's default means "derived"), then `check()`."""
        for f in fields(self):
            value = getattr(self, f.name)
            if not (value is None and f.default is None):
                check_value(f.name, value, f.metadata.get("check"), method or type(self).__name__)
        self.check()


# --- ar -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ArOptions(Options):
    """AR (`ar`): `run_ahead` steps a host read, greedy or sampled (decoding/ar_steps.py): the same tokens, fewer
    host round trips where a step is a CUDA graph replay. 1: one step a read, as every method's."""

    run_ahead: int = opt(1, int_in(1, 64))


# --- text: the shared batched loop's option, Jacobi, n-gram, pcLLM multi-block ------------------------------------

#: `budget` = "fixed" (the method's own draft size) or "auto": text methods cap their draft per number of live rows
#: from the measured cost curve and step times (`AutoBudget`), tree methods choose per number of live rows between
#: batched AR and their own tree from measured throughput (`MeasuredBudget`; decoding/budget.py). The loop applies
#: it; the drafters never see it. `ngram` defaults to "auto" (it drafts less where drafts do not pay: docs/results/
#: text.md, batching.md); a sampled run plans (text) or measures (trees) by the stored cost curve, so its seed
#: repeats it.
BUDGET_DEFAULT = "fixed"


def budget_opt(default: str = BUDGET_DEFAULT) -> Any:
    return opt(default, ((lambda v: v in ("fixed", "auto")), "fixed or auto"))


@dataclass(frozen=True)
class JacobiOptions(Options):
    """Jacobi decoding (`jacobi`, `pcllm`): a block of n tokens = the root plus n - 1 guesses."""

    block_size: int = opt(4, int_at_least(1))
    budget: str = budget_opt()


@dataclass(frozen=True)
class CllmOptions(JacobiOptions):
    """Jacobi decoding of the CLLM-distilled model: the CLLM baseline's block of 16."""

    block_size: int = opt(16, int_at_least(1))


GPU_DRAFT = 16  # n-gram tokens drafted on a GPU: TPF 1.84 (4) -> 2.15 on held-out HumanEval (docs/results/text.md)


@dataclass(frozen=True)
class NgramOptions(Options):
    """Prompt lookup (`ngram`): up to num_draft tokens after the latest earlier max_ngram..min_ngram-gram suffix
    (`candidates` > 1: after each of that many latest, as one trie); `cache`: a static n-gram cache (a shipped name such
    as smollm2-135m, or a file) drafts where that finds none."""

    num_draft: int = opt(4, int_at_least(1), gpu=GPU_DRAFT)  # a longer draft accepts more; it costs ~0 on a GPU
    max_ngram: int = opt(3, int_at_least(1))
    # a GPU verifies a wrong draft for free: unigram matches there too (TPF +10% without a cache, the same with one)
    min_ngram: int = opt(2, int_at_least(1), gpu=1)
    cache: str = opt("", TEXT)
    # continuations of the most recent matches (and the cache's) merged into a trie: a GPU verifies the siblings for
    # free (16 held-out HumanEval answers: TPF +11%, +23% with the cache: text.md); a CPU pays for every node
    candidates: int = opt(1, int_at_least(1), gpu=4)
    budget: str = budget_opt("auto")

    def check(self) -> None:
        """The suffix lengths looked up, max_ngram down to min_ngram, are at least one."""
        if self.min_ngram > self.max_ngram:
            raise UsageError(f"ngram's min_ngram ({self.min_ngram}) must be <= max_ngram ({self.max_ngram})")


@dataclass(frozen=True)
class MultiBlockOptions(Options):
    """pcLLM multi-block decoding + rejection recycling (`pcllm-mr`, `methods/pcllm.py`)."""

    # n: the root plus at least one guess (Jacobi's n = 1 is AR); CPU default measured fastest, paper 64: recipes/full
    block_size: int = opt(4, int_at_least(2))
    num_blocks: int = opt(2, int_at_least(1))  # K (real-active + pseudo-active)
    spawn_ratio: float = opt(0.85, number_in(0, 1, lo_open=True))  # r: spawn at ceil(r n) accepted tokens
    pool_size: int = opt(4, int_at_least(0))  # n-gram pool entries
    verify: int = opt(1, int_at_least(1))  # recycling candidates verified per step
    ngram: int = opt(0, int_at_least(0))  # candidate length (0 = n - 1)
    lookup: int = opt(0, int_at_least(0))  # prompt-lookup branch of up to this many tokens (0 = off, the paper)
    budget: str = budget_opt()


# --- image: EAGLE-2 trees, ADT-Tree, LANTERN, VVS, MuLo-SD ---------------------------------------------------------
# Tree shapes are the ones measured best on the shipped tiny models: narrow, at most 16 nodes on a CPU, where a verify
# of n nodes costs ~n/2 one-node steps; GPU_TREE_NODES on a GPU, where a verify costs about one step while its rows
# fit one product slice (docs/results/image.md, gpu.md). The papers' own settings are passed explicitly
# (docs/methods/eagle2.md, adt-tree.md, recipes/full).
# The most nodes whose CFG verify is one SlicedLinear slice (models/sliced_linear.SLICE_ROWS = 64 rows: the root and 31
# nodes a branch; tested): measured c(32) 1.00 against c(64) 1.87-1.90 at every LlamaGen size with CFG, while 31 nodes
# keep 0.83-0.93 of 60's tokens a step on the tiny c2i GPT (docs/results/image.md).
GPU_TREE_NODES = 31


@dataclass(frozen=True)
class TreeShapeOptions(Options):
    """An EAGLE-2 fixed tree shape (VVS's drafts too)."""

    depth: int = opt(6, int_at_least(1))
    # a narrower beam fills 31 nodes deeper: TPF +6% (EAGLE-2), +11% (LANTERN), +14% (VVS-U) against top-k 4 on the
    # tiny c2i GPT (docs/results/image.md), at the same cost on a GPU (a level's frontier is bucketed to 4 either way)
    top_k: int = opt(4, int_at_least(1), gpu=3)
    total_tokens: int = opt(16, int_at_least(1), gpu=GPU_TREE_NODES)


def check_ahead(run_ahead: int, budget: str) -> None:
    """EAGLE-2's and ADT-Tree's `run_ahead` > 1 (that many tree steps a host read, the lossless rule:
    methods/eagle_ahead.py) grows a loop step's trees on the device: a fixed budget."""
    if run_ahead > 1 and budget != "fixed":
        raise UsageError("run_ahead (option of eagle2, adt-tree) needs budget=fixed: a loop step's trees are grown on "
                         "the device")


def lossless_ahead(run_ahead: int, method: str) -> None:
    """A relaxed rule's trees take no `run_ahead`: a loop step's verdicts are the greedy rule's, made on the device."""
    if run_ahead > 1:
        raise UsageError(f"run_ahead (option of eagle2, adt-tree) needs the lossless greedy rule: {method}'s relaxed "
                         "acceptance is judged on the host")


@dataclass(frozen=True)
class TreeOptions(TreeShapeOptions):
    """EAGLE-2 (`eagle2`): its tree shape, the loop's draft budget, and `run_ahead` (`check_ahead`)."""

    budget: str = budget_opt()
    run_ahead: int = opt(1, int_in(1, 64))

    def check(self) -> None:
        check_ahead(self.run_ahead, self.budget)


@dataclass(frozen=True)
class LanternOptions(Options):
    """LANTERN relaxed acceptance (mixed in first, so its fields follow the other base's): k latent neighbours,
    total mass delta."""

    lantern_k: int = opt(0, int_at_least(0))  # 0 = 1000 of 16,384 codes scaled to the codebook
    lantern_delta: float = opt(0.1, number_in(0, 1))  # a probability mass


@dataclass(frozen=True)
class LanternTreeOptions(LanternOptions, TreeOptions):
    """EAGLE-2 trees with LANTERN relaxed acceptance (`lantern`)."""

    def check(self) -> None:
        lossless_ahead(self.run_ahead, "lantern")


@dataclass(frozen=True)
class AdtOptions(Options):
    """ADT-Tree (`adt-tree`, `methods/adt_tree.AdtPolicy`), with the shipped model's tree defaults."""

    # one adaptation on every device: session 63's deeper GPU steps (beta 0.75, l_k 1, k_max 8; 8% more tokens a step)
    # cost an H200's host 0.24-0.30 ms a step more drafting, ~10% slower at the eighth lease (docs/results/gpu.md)
    beta: float = opt(1.0, POS_NUMBER)
    l_d: int = opt(1, int_at_least(0))
    l_k: int = opt(2, int_at_least(0))
    d_min: int = opt(0, int_at_least(0))
    d_max: int = opt(10, int_at_least(1))
    k_min: int = opt(1, int_at_least(0))
    k_max: int = opt(12, int_at_least(1))
    d0: int = opt(4, int_at_least(1))
    k0: int = opt(4, int_at_least(1))
    total_tokens: int = opt(16, int_at_least(1), gpu=GPU_TREE_NODES)
    budget: str = budget_opt()
    init: str = opt("horizontal", one_of("horizontal", "vertical", "random"))  # first row/column start of an image
    seed: int = opt(0, SEED)
    run_ahead: int = opt(1, int_in(1, 64))  # `check_ahead`

    def check(self) -> None:
        """The depth and width bounds leave room to adapt, and the first tree lies strictly inside them; `run_ahead`'s
        budget (`check_ahead`)."""
        check_ahead(self.run_ahead, self.budget)
        if not (self.d_max - self.d_min >= 2 and self.k_max - self.k_min >= 2):
            raise UsageError("adt-tree bounds must leave room to adapt: d_max - d_min >= 2 and k_max - k_min >= 2, "
                             f"got d_min {self.d_min}, d_max {self.d_max}, k_min {self.k_min}, k_max {self.k_max}")
        outside = [(n, v, lo, hi) for n, v, lo, hi in (("d", self.d0, self.d_min, self.d_max),
                                                       ("k", self.k0, self.k_min, self.k_max)) if not lo < v < hi]
        if outside:
            raise UsageError("adt-tree's first tree must lie strictly inside the bounds: " + ", ".join(
                f"{n}0 {v} is not in ({lo}, {hi}) ({n}_min, {n}_max)" for n, v, lo, hi in outside)
                + f"; set {' and '.join(f'{o[0]}0' for o in outside)}, or widen the bounds")


@dataclass(frozen=True)
class AdtLanternOptions(LanternOptions, AdtOptions):
    """ADT-Tree trees with LANTERN relaxed acceptance (`adt-tree+lantern`)."""

    def check(self) -> None:
        lossless_ahead(self.run_ahead, "adt-tree+lantern")
        super().check()


@dataclass(frozen=True)
class VvsOptions(LanternOptions, TreeShapeOptions):
    """VVS partial verification skipping on EAGLE-2 + LANTERN (`vvs`, `methods/vvs.build_vvs`).
    No `budget`: its own step logic decides what each step drafts and verifies."""

    schedule: str = opt("uniform", one_of("uniform", "dynamic", "none"))
    interval: int = opt(3, int_at_least(2))  # never two skipped steps in a row; the paper's ablation setting 3
    threshold: float = opt(0.75, number_in(-1, 1))  # dynamic schedule: cosine similarity
    alpha: float = opt(0.8, number_in(0, 1, lo_open=True))
    stride: int = opt(2, int_at_least(1))
    staleness: int = opt(0, int_at_least(0))
    refresh: bool = opt(True, FLAG)
    seed: int = opt(0, SEED)  # the paths of skipped steps at T = 0 without a generator


@dataclass(frozen=True)
class MuloOptions(LanternOptions):
    """MuLo-SD (`mulo-sd`, `methods/mulo_sd.build_mulo`). None = derived when it is built:
    upsampler tiny-image-upsampler-{r}x for r = G / g, tau 1e-4 * 16384 / V."""

    lowres: str = opt("tiny-image-gpt-lowres", TEXT)
    upsampler: str | None = opt(None, TEXT)
    tau: float | None = opt(None, NONNEG_NUMBER)
    radius: int = opt(3, int_in(0, 64))  # neighbourhood radius l
    rejection: str = opt("local", one_of("local", "raster"))  # re-sampling after a rejection
    draft_rows: int = opt(1, int_at_least(1))
    seed: int = opt(0, SEED)  # the low-res drafter's stream (derived with the decode generator's seed)


# --- mesh: XSpecMesh --------------------------------------------------------------------------------------------

def tree_widths_ok(v: Any) -> bool:
    """`candidate_tree`: "" or comma-separated positive integers (YAML may give one width as an int)."""
    return str(v) == "" or all(w.strip().isdigit() and int(w) > 0 for w in str(v).split(","))


@dataclass(frozen=True)
class XSpecMeshOptions(Options):
    """XSpecMesh (`xspecmesh`, `methods/xspecmesh.py`): D, the acceptance rule and the candidate sampler; checked when
    built (the paper's two lossy rules, and the lossless one)."""

    heads: str = opt("xspecmesh-ca-tiny", TEXT)  # registry name of the heads (they name backbone + adapter)
    num_heads: int = opt(0, int_at_least(0))  # D; 0 = every head the checkpoint has (paper: 4)
    criterion: str = opt("threshold", one_of("threshold", "topk", "rejection"))  # p > delta, top-K_a: lossy
    delta: float = opt(0.5, number_in(0, 1))
    top_k_accept: int = opt(1, int_at_least(1))  # K_a
    sampling: str = opt("independent", one_of("independent", "tree"))  # independent | tree (top-K_s probability tree)
    top_k_tree: int = opt(2, int_at_least(1))  # K_s
    draft_dtype: str = opt("float32", one_of("float32", "bfloat16"))  # bfloat16: heads' LM-head product in bf16
    lookup: int = opt(0, int_at_least(0))  # > 0: candidates first from n-gram lookup (n = lookup .. 1) (beyond)
    vertex_lookup: bool = opt(False, FLAG)  # offsets after known blocks, heads elsewhere (beyond)
    min_path_prob: float = opt(0.0, number_in(0, 1, hi_open=True))  # > 0: cut the chain below this path probability
    # widths of a candidate tree, one a head ("4,2,2,1": head j's top w_j tokens under every depth-(j-1) node; the
    # vertex memory's known offset alone where it has one): lossless only, verified as one tree (beyond the paper,
    # Medusa's tree over the heads); "" = the chain of each head's argmax
    candidate_tree: str = opt("", (tree_widths_ok, "comma-separated widths, one a head, each >= 1 (e.g. 4,2,2,1)"))
    budget: str = budget_opt()  # auto: per batch size, the faster of batched AR and the heads
    # > 1: that many chain steps a host read (lossless greedy chain; methods/xspecmesh_ahead.py): the same tokens
    run_ahead: int = opt(1, int_in(1, 64))

    def __post_init__(self) -> None:
        self.validate("xspecmesh")

    def check(self) -> None:
        """One candidate source besides the heads; the lossless rule needs deterministic candidates (no head q); a
        candidate tree is lossless, without a chain's path cut or n-gram lookup."""
        if self.lookup and self.vertex_lookup:
            raise UsageError("lookup and vertex_lookup are exclusive; choose one candidate source besides the heads")
        if self.lossless and not (self.sampling == "tree" and self.top_k_tree == 1):
            raise UsageError("criterion rejection (lossless) needs deterministic candidates: "
                             "sampling=tree top_k_tree=1 (the heads' argmaxes)")
        if self.candidate_tree and (not self.lossless or self.min_path_prob or self.lookup):
            raise UsageError("candidate_tree needs criterion=rejection (the paper's rules judge one chain), without "
                             "min_path_prob or lookup (a chain's)")
        if self.run_ahead > 1 and (not self.lossless or self.candidate_tree or self.min_path_prob or self.lookup
                                   or self.budget != "fixed"):
            raise UsageError("run_ahead (option of xspecmesh) needs criterion=rejection and the chain of every head's "
                             "candidate (vertex_lookup allowed): no candidate_tree, min_path_prob, lookup or "
                             "budget=auto")

    def check_use(self, modality: str, greedy: bool) -> None:
        if self.run_ahead > 1 and not greedy:
            raise UsageError("run_ahead (option of xspecmesh) needs --temperature 0: each step's verdict is made on "
                             "the device, by the greedy rule")

    @property
    def tree_widths(self) -> tuple[int, ...]:
        """`candidate_tree` as widths, one a head; () for the chain."""
        return tuple(int(w) for w in str(self.candidate_tree).split(",")) if self.candidate_tree else ()

    @property
    def lossless(self) -> bool:
        """Does decoding preserve the backbone's distribution (greedy: its output)?"""
        return self.criterion == "rejection"

    def label(self) -> str:
        s = "IS" if self.sampling == "independent" else f"PTS(K_s={self.top_k_tree})"
        bf = ", bf16 head logits" if self.draft_dtype == "bfloat16" else ""
        lk = f", lookup {self.lookup}-gram" if self.lookup else ", vertex lookup" if self.vertex_lookup else ""
        cut = f", path cut {self.min_path_prob:g}" if self.min_path_prob else \
            f", candidate tree {self.candidate_tree}" if self.candidate_tree else ""
        auto = ", budget auto" if self.budget == "auto" else ""
        rule = "rejection sampling" if self.lossless else \
            f"p>{self.delta:g}" if self.criterion == "threshold" else f"top-{self.top_k_accept}"
        return f"{rule}, {s}{bf}{lk}{cut}{auto}"
