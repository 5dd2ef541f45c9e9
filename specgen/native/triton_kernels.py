"""The Triton kernels behind cuda_ops.py, imported on a CUDA forward's first use (Triton is optional; with
`TRITON_INTERPRET=1` set before the import they run on CPU tensors, which is how the default suite tests them)."""

import triton
import triton.language as tl


@triton.jit
def rounded(x, dtype: tl.constexpr):
    # float32 x to `dtype`, to nearest, ties to even (a GPU's cast; torch's elementwise kernels round so). bfloat16
    # through its bits, because Triton's CPU interpreter truncates that cast: the top 16 bits after adding 0x7FFF and
    # the lowest kept bit (a carry moves into the exponent as it should)
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    elif dtype == tl.float32:
        return x
    else:
        return x.to(dtype)


@triton.jit
def tanh(x):
    # float32 tanh (Triton has no tanh op its interpreter also runs): (1 - e) / (1 + e) with e = exp(-2|x|) <= 1 (no
    # overflow; the sign restored after), and near 0, where 1 - e would cancel, its series x - x^3/3 + 2x^5/15 (the
    # next term is under 3e-7 of it at |x| < 1/8); within a few float32 ulps of tanh (tests/models/test_softcap.py)
    a = tl.abs(x)
    e = tl.exp(-2.0 * a)
    x2 = x * x
    t = tl.where(a < 0.125, a * (1.0 - x2 * (1.0 / 3.0 - x2 * (2.0 / 15.0))), (1.0 - e) / (1.0 + e))
    return tl.where(x < 0, -t, t)


# The invariant (docs/precision.md, "The invariant attention"): a query's result depends only on its own list of
# visible slots (ascending: AR's key order, for tree nodes too) and their keys and values, never on the forward's
# width, its other queries or its batch. One program computes one (query, kv head) pair: its group of query heads as
# the rows of fixed-shape tiles, keys taken from its list in tiles of BLOCK from the list's start, with an online
# softmax in float32. The loop stops at the query's own count, so slots it cannot see are never read, and every
# constexpr (tile shapes, warps) is fixed per model, so a query runs the same instructions in every forward.
@triton.jit(do_not_specialize=["n_q", "sqb", "sqh", "sqs", "skb", "skh", "skt", "svb", "svh", "svt", "sib",
                               "sis", "sob", "sos", "soh"])
def attend_lists(Q, K, V, IDX, COUNT, OUT, n_q, scale, cap, sqb, sqh, sqs, skb, skh, skt, svb, svh, svt, sib, sis,
                 sob, sos, soh, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_D: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr):
    # 1. this program's query (b, s), kv head, and its GROUP query heads as tile rows (padding rows: zeros)
    row = tl.program_id(0)  # b * n_q + s
    kvh = tl.program_id(1)
    b = row // n_q
    s = row - b * n_q
    heads = kvh * GROUP + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    dims = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    real_rows = tl.arange(0, BLOCK_M) < GROUP
    real_dims = dims < D
    q = tl.load(Q + b * sqb + s * sqs + heads[:, None] * sqh + dims[None, :],
                mask=real_rows[:, None] & real_dims[None, :], other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_D]
    n = tl.load(COUNT + row)  # how many slots this query sees (>= 1: itself)
    top = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # 2. its list in blocks from the start: scores, the running max, and the rescaled sums (online softmax)
    start = n * 0  # a while loop, not range(0, n): Triton's interpreter cannot take a loaded bound
    while start < n:
        pos = start + tl.arange(0, BLOCK)  # [BLOCK]
        seen = pos < n
        slot = tl.load(IDX + b * sib + s * sis + pos, mask=seen, other=0)
        keep = seen[:, None] & real_dims[None, :]
        k = tl.load(K + b * skb + kvh * skh + slot[:, None] * skt + dims[None, :], mask=keep,
                    other=0.0).to(tl.float32)  # [BLOCK, BLOCK_D]
        v = tl.load(V + b * svb + kvh * svh + slot[:, None] * svt + dims[None, :], mask=keep, other=0.0).to(tl.float32)
        score = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [BLOCK_M, BLOCK]
        if CAP:  # Gemma 2's softcap, transformers' order: cap tanh(s / cap)
            score = tanh(score / cap) * cap
        score = tl.where(seen[None, :], score, float("-inf"))  # past the list: p = 0 exactly
        new_top = tl.maximum(top, tl.max(score, 1))
        keep_old = tl.exp(top - new_top)  # the first block: exp(-inf) = 0
        p = tl.exp(score - new_top[:, None])
        total = total * keep_old + tl.sum(p, 1)
        acc = acc * keep_old[:, None] + tl.dot(p, v, input_precision="ieee")
        top = new_top
        start += BLOCK
    # 3. divide (a query that sees nothing: 0, as attention.c), round once to the output's dtype, store
    out = acc / tl.maximum(total, 1.1754944e-38)[:, None]
    tl.store(OUT + b * sob + s * sos + heads[:, None] * soh + dims[None, :], rounded(out, OUT.dtype.element_ty),
             mask=real_rows[:, None] & real_dims[None, :])


@triton.jit
def norm_rows(X, A, W, TOTAL, OUT, dim, eps, ADD: tl.constexpr, BLOCK: tl.constexpr):
    # one program a row: (x [+ a]) rounded to its dtype, then w * (its float32 RMSNorm rounded to the dtype), as
    # transformer.rms_norm computes (HF's formula); the sum of squares in one fixed order per model width
    # (each product and sum in float32, rounded once to the dtype: what torch's elementwise kernels do). Offsets in
    # int64: a prefill's rows pass 2^31 elements, where int32 (program_id's type) wraps
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    real = cols < dim
    dtype = X.dtype.element_ty
    x = tl.load(X + row * dim + cols, mask=real, other=0.0).to(tl.float32)
    if ADD:
        x = rounded(x + tl.load(A + row * dim + cols, mask=real, other=0.0).to(tl.float32), dtype)
        tl.store(TOTAL + row * dim + cols, x, mask=real)
        x = x.to(tl.float32)
    y = rounded(x * tl.math.rsqrt(tl.sum(x * x, 0) / dim + eps), dtype).to(tl.float32)
    w = tl.load(W + cols, mask=real, other=0.0).to(tl.float32)
    tl.store(OUT + row * dim + cols, rounded(w * y, dtype), mask=real)


@triton.jit(do_not_specialize=["n_h", "n_q", "n_kv", "n_s", "n_b", "sxb", "sxh", "sxs", "scb", "scs", "skc", "skh",
                               "skt"])
def rope_rows(X, COS, SIN, OUT, K, V, META, n_h, n_q, n_kv, n_s, n_b, sxb, sxh, sxs, scb, scs, skc, skh, skt,
              D: tl.constexpr, BLOCK_D: tl.constexpr, HALF: tl.constexpr, STORE: tl.constexpr):
    # one program a (batch, head, position) row of x [B, H, S, D]: x * cos + partner(x) * sin, each product and the
    # sum rounded once to x's dtype (rope.rotate's torch ops, in one pass); partner swaps each pair's two slots.
    # Rows h < n_q go to OUT [B, n_q, S, D]. STORE: x is a step's qkv (n_q + 2 n_kv heads) and its k rows (rotated)
    # and v rows (as they are) go to the cache layer K, V [C, Hkv, T, D] (strides skc, skh, skt) at row META[1, b],
    # slot META[0, b] + s. Offsets in int64: a prefill's qkv passes 2^31 elements, where int32 wraps
    row = tl.program_id(0).to(tl.int64)  # (b * n_h + h) * n_s + s
    s = row % n_s
    h = (row // n_s) % n_h
    b = row // (n_s * n_h)
    j = tl.arange(0, BLOCK_D)
    real = j < D
    src = X + b * sxb + h * sxh + s * sxs
    dst = OUT + ((b * n_q + h) * n_s + s) * D
    value = False
    if STORE:
        at = tl.load(META + n_b + b) * skc + (tl.load(META + b) + s) * skt  # the cache row and slot
        value = h >= n_q + n_kv
        if value:
            dst = V + at + (h - n_q - n_kv) * skh
        elif h >= n_q:
            dst = K + at + (h - n_q) * skh
    if HALF:
        partner = (j + D // 2) % D
    else:
        partner = j ^ 1
    dtype = OUT.dtype.element_ty
    x = tl.load(src + j, mask=real, other=0.0).to(tl.float32)
    y = tl.load(src + partner, mask=real, other=0.0).to(tl.float32)
    c = tl.load(COS + b * scb + s * scs + j, mask=real, other=0.0).to(tl.float32)
    sn = tl.load(SIN + b * scb + s * scs + j, mask=real, other=0.0).to(tl.float32)
    out = rounded(x * c, dtype).to(tl.float32) + rounded(y * sn, dtype).to(tl.float32)
    tl.store(dst + j, rounded(tl.where(value, x, out), dtype), mask=real)  # a value as it is (exact in float32)


@triton.jit
def swiglu(a, b, dtype: tl.constexpr):
    # SwiGLU's gate silu(a) * b of float32 a, b with torch's two roundings: silu in float32, a / (1 + exp(-a)) (the
    # GPU's fast exp and division: within an ulp or two of torch's silu before rounding), rounded to `dtype`; then the
    # product in float32, rounded. Elementwise: an element's bits never depend on the others
    gate = rounded(a / (1.0 + tl.exp(-a)), dtype).to(tl.float32)
    return rounded(gate * b, dtype)


@triton.jit(do_not_specialize=["n"])
def silu_mul_rows(A, B, OUT, n, BLOCK: tl.constexpr):
    # `swiglu` over n elements. Offsets in int64: a prefill's gate passes 2^31 elements (from ~113K tokens of a 7B
    # model), where int32 wraps
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    real = i < n
    a = tl.load(A + i, mask=real, other=0.0).to(tl.float32)
    b = tl.load(B + i, mask=real, other=0.0).to(tl.float32)
    tl.store(OUT + i, swiglu(a, b, OUT.dtype.element_ty), mask=real)


@triton.jit
def seen_at(src, pos, real, length, n_q, st, TREE: tl.constexpr):
    # whether slots pos (real: < T) are visible to a query whose mask row starts at src: read from the mask, or with
    # TREE its step's visibility (static_step.visibility), the row's committed slots (pos < length) and the pending
    # slots its tree row [S] names (slot length + c for tree column c), without a mask made first
    if TREE:
        col = pos - length
        pending = real & (col >= 0) & (col < n_q)
        return real & ((pos < length) | ((tl.load(src + col * st, mask=pending, other=0) != 0) & pending))
    return (tl.load(src + pos * st, mask=real, other=0) != 0) & real


# The list attention's plan (attention.c's specgen_plan): one program a query (b, s) of the mask seen [B, S, T]
# (strides sb, ss, st: a mask broadcast over queries is read as it is; TREE: a step's tree rows [B, S, S] and each
# row's committed length LENGTHS[b], `seen_at`), its visible slots ascending, then its hidden ones ascending, into
# IDX[b, s, :]; COUNT[b, s] = how many it sees; LEAD[b, s] = its leading run of visible slots 0, 1, .. (the row's
# shared run is their minimum). Two passes over T: the count, then every slot at its place.
@triton.jit(do_not_specialize=["n_q", "t", "sb", "ss", "st", "ib", "is_"])
def plan_rows(SEEN, LENGTHS, IDX, COUNT, LEAD, n_q, t, sb, ss, st, ib, is_, BLOCK: tl.constexpr,
              TREE: tl.constexpr):
    row = tl.program_id(0)  # b * n_q + s
    b = row // n_q
    s = row - b * n_q
    src = SEEN + b.to(tl.int64) * sb + s.to(tl.int64) * ss
    dst = IDX + b.to(tl.int64) * ib + s.to(tl.int64) * is_
    length = tl.load(LENGTHS + b) if TREE else 0
    lanes = tl.arange(0, BLOCK)
    # 1. how many slots it sees, and the first it does not
    seen_total = tl.sum(tl.zeros([BLOCK], tl.int32), 0)
    first_hidden = seen_total + t
    start = t * 0  # while loops: Triton's interpreter cannot take a runtime bound in range()
    while start < t:
        pos = start + lanes
        real = pos < t
        vis = seen_at(src, pos, real, length, n_q, st, TREE)
        seen_total += tl.sum(vis.to(tl.int32), 0)
        first_hidden = tl.minimum(first_hidden, tl.min(tl.where(real & ~vis, pos, t), 0))
        start += BLOCK
    # 2. each slot at its place: visible ones from 0, hidden ones from the count, both ascending
    before_vis = seen_total * 0
    before_hid = seen_total * 0
    start = t * 0
    while start < t:
        pos = start + lanes
        real = pos < t
        vis = seen_at(src, pos, real, length, n_q, st, TREE)
        hid = real & ~vis
        v = vis.to(tl.int32)
        h = hid.to(tl.int32)
        place = tl.where(vis, before_vis + tl.cumsum(v, 0) - 1, seen_total + before_hid + tl.cumsum(h, 0) - 1)
        tl.store(dst + place, pos, mask=real)
        before_vis += tl.sum(v, 0)
        before_hid += tl.sum(h, 0)
        start += BLOCK
    tl.store(COUNT + row, seen_total)
    tl.store(LEAD + row, first_hidden)


# A tree growth's rankings (methods/eagle_grow.py) order (value, index) pairs by value descending, then index
# ascending: one int64 key each, larger ranks first: the value's float32 bits made monotone as a signed int32 in
# the high half, 2^31 - 1 - index in the low (indices < 2^31). A key below every real one: KEY_NONE.
KEY_NONE = tl.constexpr(-(2**63))
KEY_ALL = tl.constexpr(2**63 - 1)  # above every key: a lane out of the kept set's minimum


@triton.jit
def ordered(bits):
    # float32 bits as an int32 that orders as the floats do (a negative float's magnitude bits flipped); its own inverse
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def rank_key(x, index):
    return (ordered(x.to(tl.int32, bitcast=True)).to(tl.int64) << 32) + (0x7FFFFFFF - index.to(tl.int64))


@triton.jit
def key_value(key):
    return ordered((key >> 32).to(tl.int32)).to(tl.float32, bitcast=True)


@triton.jit
def key_index(key):
    return 0x7FFFFFFF - (key & 0xFFFFFFFF)


# Each node's K best children (EagleBatch.children): one program a node (row i, node s) of a drafter head's logits
# [n * br, S, V] (rows cond_i, uncond_i under CFG), its guided logits uncond + scale (cond - uncond) rounded as
# image/target.guided rounds them, in float32 from there. One pass over the vocabulary in BLOCK-wide tiles keeps the
# softmax's running max and rescaled sum and the K best (logit, token) keys seen so far (a tile's key enters while it
# beats the worst kept one); then the keys sorted, each a log-prob (x - max) - log(sum), plus the node's path score,
# into a growth's record (eagle_grow.Frame: row i's K x n_s from column `at`, rows `so` apart). Ties rank the lower
# token first. Not torch's bits (its own sums): a drafter's log-probs only choose what is proposed.
@triton.jit(do_not_specialize=["n_s", "v", "srow", "ss", "sp", "so", "at"])
def top_children(LOGITS, SCORES, VALUES, INDEX, n_s, v, scale, srow, ss, sp, so, at, K: tl.constexpr,
                 BLOCK_K: tl.constexpr, CFG: tl.constexpr, SCORED: tl.constexpr, BLOCK: tl.constexpr):
    node = tl.program_id(0)  # i * n_s + s
    i = node // n_s
    s = node - i * n_s
    dtype = LOGITS.dtype.element_ty
    src = LOGITS + (i * (2 if CFG else 1)).to(tl.int64) * srow + s.to(tl.int64) * ss
    lanes = tl.arange(0, BLOCK)
    ks = tl.arange(0, BLOCK_K)
    best = tl.full([BLOCK_K], KEY_NONE, tl.int64)  # the kept keys (lanes >= K unused)
    top = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
    total = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
    start = v * 0  # while loops: the interpreter takes no runtime bound in range()
    while start < v:
        # 1. a tile of guided logits (past V: -inf)
        pos = start + lanes
        real = pos < v
        x = tl.load(src + pos, mask=real, other=0.0).to(tl.float32)
        if CFG:
            u = tl.load(src + srow + pos, mask=real, other=0.0).to(tl.float32)
            d = rounded(x - u, dtype).to(tl.float32)
            x = rounded(u + rounded(scale * d, dtype).to(tl.float32), dtype).to(tl.float32)
        x = tl.where(real, x, float("-inf"))
        # 2. the softmax's running max and sum
        new_top = tl.maximum(top, tl.max(x, 0))
        total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), 0)
        top = new_top
        # 3. the tile's keys enter the kept set while they beat its worst
        key = tl.where(real, rank_key(x, pos), KEY_NONE)
        kept = tl.where(ks < K, best, KEY_ALL)
        m = tl.max(key, 0)
        while m > tl.min(kept, 0):
            best = tl.where(ks == tl.argmin(kept, 0), m, best)
            key = tl.where(key == m, KEY_NONE, key)
            kept = tl.where(ks < K, best, KEY_ALL)
            m = tl.max(key, 0)
        start += BLOCK
    # 4. the K keys in rank order, as log-probs plus the path score
    ranked = tl.sort(tl.where(ks < K, best, KEY_NONE), descending=True)
    lp = (key_value(ranked) - top) - tl.log(total)
    if SCORED:
        lp = tl.load(SCORES + i.to(tl.int64) * sp + s) + lp  # the node's path score, rows `sp` apart
    out = i.to(tl.int64) * so + at + s * K + ks
    tl.store(VALUES + out, lp, mask=ks < K)
    tl.store(INDEX + out, key_index(ranked), mask=ks < K)


# A level's beam (methods/eagle_grow.beam): one program a row, its W x W children in a growth's record (rows
# `n_nodes` apart, from column `recorded`: path SCORES, TOKENS, PAD for the not-real ones, scored -inf) ranked as
# `top_children` ranks, the best NXT kept: their scores, parents (index // W) and tokens, each branch row's copy side
# by side; their slots (`recorded` + index), each NXT times, are the next level's PARENTS in the record; and each
# branch row's predicted features HID [R, W, D] (rows `shr`, nodes `shs` apart) at the kept parents, FHID [R, NXT, D]
# (a gather: the bits as they are), read back from PARENT after a barrier (its lanes are spread over the threads).
# JOIN: FHID is the next level's drafter input [R, NXT, 2 D] instead, [EMB[token] | features] (embed_rows' bits).
# LISTED: the next level's attention lists too (eagle_grow.LevelLists.level's bits): kept node j of branch row r
# copies its parent's list, PREV [R, W, t] (the level's), with every entry p from its tail on (TAIL [R, t]) its own
# slot OWN [R, NXT], into LISTS [R, NXT, t].
@triton.jit(do_not_specialize=["n_nodes", "recorded", "shr", "shs", "t"])
def beam_rows(SCORES, TOKENS, PAD, PARENTS, HID, EMB, PREV, OWN, TAIL, SCORE, PARENT, FTOK, FHID, LISTS, n_nodes,
              recorded, shr, shs, t, W: tl.constexpr, NXT: tl.constexpr, BRANCHES: tl.constexpr, BLOCK: tl.constexpr,
              BLOCK_NXT: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, JOIN: tl.constexpr,
              LISTED: tl.constexpr, BLOCK_T: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    real = lanes < W * W
    row = i * n_nodes + recorded
    c = tl.load(SCORES + row + lanes, mask=real, other=0.0)
    pad = tl.load(PAD + row + lanes, mask=real, other=1) != 0
    key = tl.where(real, rank_key(tl.where(pad, float("-inf"), c), lanes), KEY_NONE)
    ranked = tl.sort(key, descending=True)  # the first NXT lanes are kept
    index = key_index(ranked)
    keep = lanes < NXT
    tl.store(SCORE + i * NXT + lanes, key_value(ranked), mask=keep)
    tl.store(PARENT + i * NXT + lanes, index // W, mask=keep)
    tok = tl.load(TOKENS + row + index, mask=keep, other=0)
    for b in tl.static_range(BRANCHES):
        tl.store(FTOK + (i * BRANCHES + b) * NXT + lanes, tok, mask=keep)
    each = tl.arange(0, BLOCK_NXT)[None, :]  # the next level's children of kept node j: columns j * NXT + each
    slot = (recorded + index)[:, None] + each * 0
    tl.store(PARENTS + row + W * W + lanes[:, None] * NXT + each, slot, mask=keep[:, None] & (each < NXT))
    tl.debug_barrier()  # every thread's PARENT and FTOK stores before any thread reads them back
    js = tl.arange(0, BLOCK_NXT)
    kept = js < NXT
    par = tl.load(PARENT + i * NXT + js, mask=kept, other=0)[:, None]  # [BLOCK_NXT, 1]
    ftok = tl.load(FTOK + i * BRANCHES * NXT + js, mask=kept, other=0)[:, None]  # [BLOCK_NXT, 1]: branch 0's
    row_width: tl.constexpr = 2 * D if JOIN else D
    for b in tl.static_range(BRANCHES):
        r = i * BRANCHES + b
        out = FHID + (r * NXT + js[:, None]) * row_width + (D if JOIN else 0)
        for d0 in range(0, D, BLOCK_D):  # D a constexpr: the interpreter's loops take no runtime bound
            ds = d0 + tl.arange(0, BLOCK_D)[None, :]
            both = kept[:, None] & (ds < D)
            feats = tl.load(HID + r * shr + par * shs + ds, mask=both)
            tl.store(out + ds, feats, mask=both)
            if JOIN:
                tl.store(out - D + ds, tl.load(EMB + ftok * D + ds, mask=both), mask=both)
        if LISTED:
            own = tl.load(OWN + r * NXT + js, mask=kept, other=0)[:, None]  # [BLOCK_NXT, 1]
            src, dst = PREV + (r * W + par) * t, LISTS + (r * NXT + js[:, None]) * t
            start = t * 0  # while loops: the interpreter takes no runtime bound in range()
            while start < t:
                p = start + tl.arange(0, BLOCK_T)[None, :]
                entry = kept[:, None] & (p < t)  # (not `real`: a while loop's names keep their types)
                mine = tl.load(TAIL + r * t + p, mask=p < t, other=0) != 0
                tl.store(dst + p, tl.where(mine, own, tl.load(src + p, mask=entry & ~mine, other=0)), mask=entry)
                start += BLOCK_T


# A step's tree growth's tail (methods/eagle_grow.py): one program a tree row, its output the bits of `best_nodes`,
# `in_slot_order` and `tree_inputs` in sequence. 1. The row's first t ranks (t = min(total, N)) by the key
# (clamp(-score, max=FLT_MAX), slot), padding's score +inf: the float key as an order-preserving int32 (-0.0 as 0.0,
# every NaN one NaN above +inf: torch's sort's order), the slot in the low 32 bits, so that every key is distinct and
# ties keep slot order (the stable sort); merged over the N nodes in chunks of CHUNK, keeping the best SB. 2. The
# first m = min(count, t) of them, then the last slot t - m times, sorted: in_slot_order's slots, after a -1 in
# lane 0, which is `tree_inputs`' input order and the array its parents are searched in (one sort: lane q = input q).
# 3. Each node's parent index by a binary search of that sorted array (searchsorted's count of smaller entries).
# 4. The mask, ROWS inputs at a time: an input sees the inputs up^h(q) for h < 2^rounds (`hops` + 1 of them), which
# is what `tree_inputs`' `rounds` pointer-jumping rounds reach; its position the root's plus that count minus one.
# Lanes past N and past t + 1 hold keys above every real one, so they are never kept or read. Every size (N, t, the
# hops) is a runtime value and the blocks fixed per node budget: a decode's growths share one compiled variant.
@triton.jit(do_not_specialize=["COUNTS", "ROOTS", "ROOT_POS", "n_nodes", "t", "hops"])
def kept_tree_rows(SCORES, PAD, TOKENS, PARENTS, COUNTS, ROOTS, ROOT_POS, TOK_OUT, PAR_OUT, INPUTS, POSITIONS, MASK,
                   n_nodes, t, hops, SB: tl.constexpr, CHUNK: tl.constexpr, ROWS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    src = row * n_nodes
    s = t + 1  # the verify's inputs: the root, then the t nodes
    top_key = 0x7FFFFFFFFFFFFFFF
    # 1. the best SB keys (ascending) over the row's nodes, CHUNK at a time
    best = tl.full([SB], top_key, tl.int64)
    lanes = tl.arange(0, CHUNK)
    start = n_nodes * 0  # while loops: Triton's interpreter cannot take a runtime bound in range()
    while start < n_nodes:
        slot = start + lanes
        real = slot < n_nodes
        key = -tl.load(SCORES + src + slot, mask=real, other=0.0).to(tl.float32)
        key = tl.where(key > 3.4028234663852886e38, 3.4028234663852886e38, key)  # a NaN stays one
        key = tl.where(tl.load(PAD + src + slot, mask=real, other=1) != 0, float("inf"), key)
        bits = ordered(tl.where(key == 0.0, 0, key.to(tl.int32, bitcast=True)))  # -0.0 ties with 0.0
        bits = tl.where(key != key, 0x7FC00000, bits)
        both = (bits.to(tl.int64) << 32) | slot.to(tl.int64)
        both = tl.where(real, both, top_key)
        chunk = ~tl.topk(~both, SB)  # the chunk's best SB, ascending
        best = ~tl.topk(~tl.reshape(tl.join(best, chunk), [2 * SB]), SB)
        start += CHUNK
    # 2. lane q: input q's slot (q = 1..t), -1 in lane 0, past t a slot above all
    q = tl.arange(0, SB)
    count = tl.load(COUNTS + row)
    kept_ranks = tl.minimum(tl.maximum(count, 0), t)
    ranked = best.to(tl.int32)  # the low 32 bits: the slot
    order = tl.where(q < kept_ranks, ranked, tl.where(q < t, n_nodes - 1, 0x7FFFFFFF))
    order = tl.sort(tl.where(q == SB - 1, -1, order))  # lane SB - 1 >= t + 1 held a slot above all
    node = (q >= 1) & (q <= t)
    at = tl.where(node, order, 0)
    tokens = tl.load(TOKENS + src + at, mask=node, other=0)
    parent = tl.minimum(tl.maximum(tl.load(PARENTS + src + at, mask=node, other=-1), -2), n_nodes).to(tl.int32)
    # 3. how many entries of the sorted lanes are below each parent slot: the parent's input (lanes past t are above)
    below = tl.zeros([SB], tl.int32)
    for i in tl.static_range(1, 17):
        if (SB >> i) > 0:
            probe = tl.gather(order, below + ((SB >> i) - 1), 0)
            below = tl.where(probe < parent, below + (SB >> i), below)
    kept = node & (q <= count)
    out = row * t + q - 1
    tl.store(TOK_OUT + out, tokens, mask=node)
    tl.store(PAR_OUT + out, tl.where(kept, below - 1, -1).to(tl.int64), mask=node)
    root = tl.load(ROOTS + row)
    tl.store(INPUTS + row * s + q, tl.where(kept, tokens, root), mask=q < s)
    up = tl.minimum(tl.where(kept, below, q), SB - 1)  # each input's parent's input (the root and padding: itself)
    # 4. the mask and positions, ROWS inputs at a time
    cols = tl.arange(0, SB)
    root_pos = tl.load(ROOT_POS + row)
    first = t * 0
    while first < s:
        rows = first + tl.arange(0, ROWS)
        above = rows
        seen = rows[:, None] == cols[None, :]
        h = hops * 0
        while h < hops:
            above = tl.gather(up, above, 0)
            seen = seen | (above[:, None] == cols[None, :])
            h += 1
        inside = cols[None, :] < s
        depth = tl.sum((seen & inside).to(tl.int64), 1)
        tl.store(POSITIONS + row * s + rows, root_pos + depth - 1, mask=rows < s)
        tl.store(MASK + (row * s + rows[:, None]) * s + cols[None, :], seen.to(tl.uint8),
                 mask=(rows[:, None] < s) & inside)
        first += ROWS


# A captured growth's constants (methods/eagle_grow.GrowthSetup), all from the host-known ints [6, n] (root position,
# top-k, depth, kept count, drafter prefix, root token) and each cache row's write row WRITES [R] (R = n * BRANCHES):
# one program a (level l, cache row r = i * BRANCHES + b) writes that row's level-l RoPE position (root position +
# l + 1 while the row grows there) and the RoPE table's row there (TABLE [P, ROW] -> ROT [L, R, ROW]), cache meta
# (first slot prefix + W l, write row), attention lists' own slots, count and tail (entries p >= prefix + l), and in
# sequence i's record (eagle_grow.Frame, [n, n_nodes], branch 0) the padding and parents of its level-(l + 1) children
# where the record has them (level 1's the root children 0 .. W - 1, W children each; a later level's -1 until its
# beam writes them); level 0 also the row's shared run (its prefix), its level-0 lists FIRST [R, W, T] (slot p before
# its tail, its own slot from it on), and the root children's padding and parents (-1).
@triton.jit(do_not_specialize=["n", "n_nodes", "t"])
def setup_rows(INTS, WRITES, TABLE, PADDING, PARENTS, AT, META, OWN, COUNT, TAIL, SHARED, FIRST, ROT, n, n_nodes, t,
               W: tl.constexpr, BRANCHES: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK: tl.constexpr,
               ROW: tl.constexpr, BLOCK_ROW: tl.constexpr):
    level = tl.program_id(0)
    r = tl.program_id(1)
    rows = n * BRANCHES
    i = r // BRANCHES
    root_pos = tl.load(INTS + i)
    k = tl.load(INTS + n + i)
    depth = tl.load(INTS + 2 * n + i)
    prefix = tl.load(INTS + 4 * n + i)
    live = depth > level + 1
    at = level * rows + r
    # 1. the row's level: RoPE position, cache meta [L, 2, R], own slots and count [L, R, W] (int32)
    pos = root_pos + (level + 1) * live.to(tl.int64)
    tl.store(AT + at, pos)
    cols = tl.arange(0, BLOCK_ROW)
    tl.store(ROT + at.to(tl.int64) * ROW + cols, tl.load(TABLE + pos * ROW + cols, mask=cols < ROW), mask=cols < ROW)
    tl.store(META + (2 * level) * rows + r, prefix + W * level)
    tl.store(META + (2 * level + 1) * rows + r, tl.load(WRITES + r))
    j = tl.arange(0, BLOCK_W)
    real = j < W
    tl.store(OWN + at * W + j, (prefix + W * level + j).to(tl.int32), mask=real)
    tl.store(COUNT + at * W + j, tl.zeros([BLOCK_W], tl.int32) + (prefix + level + 1).to(tl.int32), mask=real)
    # 2. its lists' tail over the T slots: entries p >= prefix + l
    lanes = tl.arange(0, BLOCK)
    start = t * 0  # while loops: the interpreter takes no runtime bound in range()
    while start < t:
        p = start + lanes
        tl.store(TAIL + at.to(tl.int64) * t + p, (p >= prefix + level).to(tl.uint8), mask=p < t)
        if level == 0:
            entry = tl.where(p[None, :] >= prefix, prefix + j[:, None], p[None, :]).to(tl.int32)  # [BLOCK_W, BLOCK]
            tl.store(FIRST + (r.to(tl.int64) * W + j[:, None]) * t + p[None, :], entry,
                     mask=real[:, None] & (p[None, :] < t))
        start += BLOCK
    # 3. the sequence's record: this level's children's padding; level 0: the root children's, and the known parents
    if r % BRANCHES == 0:
        a = tl.arange(0, BLOCK_W)[:, None]
        c = tl.arange(0, BLOCK_W)[None, :]
        block = (a < W) & (c < W) & (a * 0 + W + (level + 1) * W * W <= n_nodes)  # (a tensor: the interpreter's mask)
        row = i.to(tl.int64) * n_nodes
        pad = (depth <= level + 1) | (a >= k) | (c >= k)
        tl.store(PADDING + row + W + level * W * W + a * W + c, pad.to(tl.uint8), mask=block)
        parent = tl.where(level == 0, a.to(tl.int64), -1) + c * 0
        tl.store(PARENTS + row + W + level * W * W + a * W + c, parent, mask=block)
        if level == 0:
            tl.store(PADDING + row + j, (j >= k).to(tl.uint8), mask=real)
            tl.store(PARENTS + row + j, tl.full([BLOCK_W], -1, tl.int64), mask=real)
    if level == 0:
        tl.store(SHARED + r, prefix.to(tl.int32))


# CFG's combine (image/target.guided): uncond + scale * (cond - uncond) over each pair of rows cond_i, uncond_i of
# LOGITS [2 n, S, V] (contiguous) into OUT [n, S, V], one program a (node, BLOCK entries), each of the three steps
# rounded to the logits' dtype as torch's three elementwise ops round it (and no fused multiply-add: the launch turns fp
# fusion off), so the bits are torch's.
@triton.jit(do_not_specialize=["n_s", "v"])
def guided_rows(LOGITS, OUT, n_s, v, scale, BLOCK: tl.constexpr):
    node = tl.program_id(0).to(tl.int64)  # i * n_s + s
    i = node // n_s
    s = node - i * n_s
    dtype = LOGITS.dtype.element_ty
    cond = LOGITS + (2 * i * n_s + s) * v
    pos = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    real = pos < v
    c = tl.load(cond + pos, mask=real, other=0.0).to(tl.float32)
    u = tl.load(cond + n_s * v + pos, mask=real, other=0.0).to(tl.float32)  # uncond_i: S rows on
    d = rounded(c - u, dtype).to(tl.float32)
    tl.store(OUT + node * v + pos, rounded(u + rounded(scale * d, dtype).to(tl.float32), dtype), mask=real)


# An EAGLE drafter's input (static_step.eagle_step): one program a (row, node) writes its token's embedding row and
# its feature row side by side, [E[tok] | f], into OUT [R, S, 2 D]: torch.cat of an embedding and the features, bits
# as they are (a copy); the features through their strides (a level's frontier may be a broadcast of its root's).
@triton.jit(do_not_specialize=["n_s", "dim", "sfr", "sfs"])
def embed_rows(WEIGHT, TOKENS, FEATS, OUT, n_s, dim, sfr, sfs, BLOCK: tl.constexpr):
    node = tl.program_id(0).to(tl.int64)  # r * n_s + s
    r = node // n_s
    s = node - r * n_s
    j = tl.arange(0, BLOCK)
    real = j < dim
    tok = tl.load(TOKENS + node)
    tl.store(OUT + node * 2 * dim + j, tl.load(WEIGHT + tok * dim + j, mask=real), mask=real)
    tl.store(OUT + node * 2 * dim + dim + j, tl.load(FEATS + r * sfr + s * sfs + j, mask=real), mask=real)


# A commit's moves (models/cache.KVCache.commit_seqs): kept tree nodes' keys and values from their slots to the
# slots after their row's committed ones, in every layer and kv head of both caches K, V [L, B, Hkv, T, D] (strides
# skl, skb, skh, skt; D contiguous), in one launch. One program a (layer, kv head), over MOVES [3, N] (cache row,
# source slot, destination slot) BLOCK moves at a time in list order, each block's sources all loaded (by all of the
# program's threads: a barrier) before any of its stores (torch's gather, then write). Across blocks: a row's moves
# come from one ascending keep, so the source of its move j (slot n + keep[j], keep[j] >= j) is the destination of
# its move keep[j] >= j alone, never of an earlier block's move. A copy: every bit as it is, any dtype. Offsets in
# int64 (MOVES' own type): a cache passes 2^31 elements
@triton.jit(do_not_specialize=["n", "n_h", "skl", "skb", "skh", "skt", "svl", "svb", "svh", "svt"])
def commit_rows(K, V, MOVES, n, n_h, skl, skb, skh, skt, svl, svb, svh, svt, D: tl.constexpr, BLOCK: tl.constexpr,
                BLOCK_D: tl.constexpr):
    program = tl.program_id(0)
    layer = (program // n_h).to(tl.int64)
    h = (program % n_h).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    lanes = tl.arange(0, BLOCK)
    k_base = K + layer * skl + h * skh
    v_base = V + layer * svl + h * svh
    start = n * 0  # while loops: the interpreter takes no runtime bound in range()
    while start < n:
        i = start + lanes
        real = i < n
        row = tl.load(MOVES + i, mask=real, other=0)[:, None]  # [BLOCK, 1]
        src = tl.load(MOVES + n + i, mask=real, other=0)[:, None]
        dst = tl.load(MOVES + 2 * n + i, mask=real, other=0)[:, None]
        both = real[:, None] & (dims < D)[None, :]
        k = tl.load(k_base + row * skb + src * skt + dims[None, :], mask=both)  # [BLOCK, BLOCK_D]
        v = tl.load(v_base + row * svb + src * svt + dims[None, :], mask=both)
        # every thread's loads before any thread's stores (a store's value needs only its own thread's load): a slot
        # one move stores into may be another's source, loaded by another thread, in this block or the last one
        tl.debug_barrier()
        tl.store(k_base + row * skb + dst * skt + dims[None, :], k, mask=both)
        tl.store(v_base + row * svb + dst * svt + dims[None, :], v, mask=both)
        start += BLOCK
