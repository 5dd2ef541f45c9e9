"""BPT's blocked and patchified mesh tokenization (Weng et al. 2025), token for token, with helpers (docs/mesh.md)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np

from specgen.mesh.errors import MeshDecodeError, MeshInputError
from specgen.mesh.quantize import dequantize, quantize_mesh, unique_rows_in_order
from specgen.mesh.types import as_mesh

#: Coarse blocks per axis for BPT's vertex sort (``block_first_order``: bins // 32 at 7 bits).
SORT_BLOCKS_PER_AXIS = 4


@dataclass(frozen=True)
class DecodedMesh:
    """What a tolerant decode recovered (equal bins merged, first-appearance order) and every problem it skipped."""

    vertices: np.ndarray  # [V, 3] float64
    faces: np.ndarray  # [F, 3] int64
    errors: tuple[MeshDecodeError, ...]  # by position; empty when the sequence is well formed


def canonical_mesh(vertices: object, faces: object, bits: int, order: Callable[[np.ndarray], np.ndarray]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """A mesh in [-1, 1] quantised for encoding (BPT would clip outside it; we refuse) in a tokenizer's canonical
    order: vertices sorted by `order` (integer coords [V, 3] -> permutation [V]), each face rotated so its lowest index
    comes first (winding kept), faces stably sorted by their ascending index tuple (PolyGen/BPT face order)."""
    mesh = as_mesh(vertices, faces)
    if len(mesh.vertices) and np.abs(mesh.vertices).max() > 1.0:
        raise MeshInputError("coordinates must lie in [-1, 1]; normalise the mesh with normalize_bbox first")
    coords, faces = quantize_mesh(mesh.vertices, mesh.faces, bits)
    if len(faces) == 0:
        raise MeshInputError("mesh has no non-degenerate faces after quantisation")
    perm = order(coords)
    f = np.argsort(perm)[faces]  # [F, 3]; new vertex i is old vertex perm[i], so old j is new argsort(perm)[j]
    f = np.take_along_axis(f, (np.argmin(f, axis=1)[:, None] + np.arange(3)[None, :]) % 3, axis=1)
    s = np.sort(f, axis=1)  # [F, 3]
    return coords[perm], f[np.lexsort((s[:, 2], s[:, 1], s[:, 0]))]  # lexsort is stable


def as_token_array(tokens: object) -> np.ndarray:
    """Tokens as a 1-D int64 array; MeshInputError for other shapes or non-integer values."""
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise MeshInputError(f"tokens must be a 1-D sequence, got shape {list(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):  # an empty list is float64: no tokens, no error
        raise MeshInputError(f"tokens must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def cut_at_eos(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """Tokens before the first EOS (everything from EOS on is ignored)."""
    hits = np.flatnonzero(tokens == eos_id)
    return tokens[: hits[0]] if len(hits) else tokens


def triangles_to_mesh(corners: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Integer triangle corners [T, 3, 3] -> (merged bin-centre vertices [V, 3] by first appearance, faces [T, 3])."""
    flat = np.asarray(corners, dtype=np.int64).reshape(-1, 3)  # [3T, 3]
    if len(flat) == 0:
        return np.zeros((0, 3)), np.zeros((0, 3), dtype=np.int64)
    unique, index = unique_rows_in_order(flat)
    return dequantize(unique, bits), index.reshape(-1, 3)


class StrictDecode:
    """`decode` from a tokenizer's tolerant `decode_partial`."""

    def decode(self, tokens: object) -> tuple[np.ndarray, np.ndarray]:
        """Strict decode -> (vertices [V, 3] float64, faces [F, 3] int64); raises the earliest MeshDecodeError."""
        decoded = self.decode_partial(tokens)
        if decoded.errors:
            raise decoded.errors[0]
        return decoded.vertices, decoded.faces


def bpt_vertex_order(coords: np.ndarray, bits: int) -> np.ndarray:
    """Permutation sorting integer vertices [V, 3] (x, y, z) in BPT's block-first order."""
    c = np.asarray(coords, dtype=np.int64)
    x, y, z = c[:, 0], c[:, 1], c[:, 2]
    k = SORT_BLOCKS_PER_AXIS
    cs = (1 << bits) // k  # coarse block side in bins (32 at 7 bits)
    block = (y // cs) * k * k + (x // cs) * k + (z // cs)
    return np.lexsort((z, x, y, block))  # primary key last: block, then y, x, z


def _same_winding(face: np.ndarray, a: int, b: int, c: int) -> bool:
    """True when (a, b, c) is a cyclic rotation of ``face``."""
    f = [int(i) for i in face]
    k = f.index(a)
    return f[(k + 1) % 3] == b and f[(k + 2) % 3] == c


def patchify(faces: np.ndarray, num_vertices: int) -> list[list[int]]:
    """Split canonically ordered faces [F, 3] into fans; returns ``[centre, r0, ..., rk]`` lists."""
    faces = np.asarray(faces, dtype=np.int64)
    degree = np.bincount(faces.reshape(-1), minlength=num_vertices).tolist()  # faces per vertex
    around: list[list[int]] = [[] for _ in range(num_vertices)]
    for fi, face in enumerate(faces.tolist()):
        for v in face:
            around[v].append(fi)
    visited = [False] * len(faces)
    first_unvisited = 0
    patches = []
    while True:
        while first_unvisited < len(faces) and visited[first_unvisited]:
            first_unvisited += 1
        if first_unvisited == len(faces):
            return patches
        face = faces[first_unvisited].tolist()
        centre = face[int(np.argmax([degree[v] for v in face]))]  # first max on ties
        fan = sorted(
            (*sorted(v for v in faces[fi].tolist() if v != centre), fi)
            for fi in around[centre]
            if not visited[fi]
        )  # [(u, v, face index)] with u < v
        ends = Counter(x for u, v, _ in fan for x in (u, v))
        open_ends = [v for v, n in ends.items() if n == 1]
        ring = [min(open_ends) if open_ends else fan[0][0]]
        used: list[int] = []
        while len(ring) <= len(fan):
            last = ring[-1]
            step = next(((u, v, fi) for u, v, fi in fan if fi not in used and last in (u, v)), None)
            if step is None:
                break
            u, v, fi = step
            ring.append(v if last == u else u)
            used.append(fi)
        if not _same_winding(faces[used[0]], centre, ring[0], ring[1]):
            ring.reverse()
        degree[centre] = len(fan) - len(used)
        for pos, v in enumerate(ring):
            degree[v] -= 1 if pos in (0, len(ring) - 1) else 2
        for fi in used:
            visited[fi] = True
        patches.append([centre] + ring)


@dataclass(frozen=True)
class BPTTokenizer(StrictDecode):
    """BPT-compatible tokenizer with BPT's 8 x 16 split of 7-bit coordinates (docs/mesh.md has the exact scheme)."""

    block_size: ClassVar[int] = 8  # blocks per axis
    offset_size: ClassVar[int] = 16  # bins per block side: block_size * offset_size = 2**bits
    bits: ClassVar[int] = 7
    offset_base: ClassVar[int] = block_size**3
    special_base: ClassVar[int] = block_size**3 + offset_size**3
    eos_id: ClassVar[int] = special_base + block_size**3
    vocab_size: ClassVar[int] = eos_id + 1

    def kinds(self, tokens: object) -> np.ndarray:
        """Kind of each token id [T] -> int8 [T]: 0 block, 1 offset, 2 special block, 3 EOS,
        -1 outside the vocabulary (BPT adds a learned embedding per kind)."""
        t = as_token_array(tokens)
        edges = [0, self.offset_base, self.special_base, self.eos_id, self.vocab_size]
        kind = np.searchsorted(edges, t, side="right") - 1  # [T]
        kind[(t < 0) | (t >= self.vocab_size)] = -1
        return kind.astype(np.int8)

    def block_and_offset(self, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Integer vertices [V, 3] -> (block token [V], offset token [V], already shifted by 512)."""
        b, o = self.block_size, self.offset_size
        hi, lo = np.asarray(coords) // o, np.asarray(coords) % o  # [V, 3] each
        block = hi[:, 0] * b * b + hi[:, 1] * b + hi[:, 2]
        offset = self.offset_base + lo[:, 0] * o * o + lo[:, 1] * o + lo[:, 2]
        return block, offset

    def encode(
        self, vertices: np.ndarray, faces: np.ndarray, *, add_eos: bool = True
    ) -> np.ndarray:
        """Mesh with coordinates in [-1, 1] -> int64 tokens [T] (EOS last when ``add_eos``)."""
        coords, f = canonical_mesh(vertices, faces, self.bits, lambda c: bpt_vertex_order(c, self.bits))
        block, offset = self.block_and_offset(coords)
        tokens: list[int] = []
        current = -1  # last emitted block token (a special block never equals a plain one)
        for n, patch in enumerate(patchify(f, len(coords))):
            for k, v in enumerate(patch):
                opens = k == 0 and n > 0  # every patch after the first opens with a special block
                if opens or block[v] != current:
                    current = int(block[v]) + (self.special_base if opens else 0)
                    tokens.append(current)
                tokens.append(int(offset[v]))
        if add_eos:
            tokens.append(self.eos_id)
        return np.asarray(tokens, dtype=np.int64)

    def _coords(self, block: int, offset: int) -> list[int]:
        b, o = self.block_size, self.offset_size
        offset -= self.offset_base
        return [
            block // (b * b) * o + offset // (o * o),
            block // b % b * o + offset // o % o,
            block % b * o + offset % o,
        ]

    def decode_partial(self, tokens: object) -> DecodedMesh:
        """Tolerant decode: every recoverable fan, plus the errors met (see module docstring)."""
        seq = cut_at_eos(as_token_array(tokens), self.eos_id)
        errors: list[MeshDecodeError] = []
        if len(seq) == 0:
            errors.append(MeshDecodeError(0, "empty token sequence"))
        patches: list[tuple[int, list[list[int]]]] = []  # (start position, integer vertices)
        block: int | None = None
        pending: int | None = None  # position of a block token still waiting for its offset
        for pos, t in enumerate(seq.tolist()):
            is_block, is_offset = 0 <= t < self.offset_base, self.offset_base <= t < self.special_base
            is_special = self.special_base <= t < self.eos_id
            if pending is not None and (is_block or is_special):
                errors.append(MeshDecodeError(pending, "block token not followed by an offset"))
            if is_special or not patches and (is_block or is_offset):  # the first patch opens with no special
                patches.append((pos, []))
            if is_block or is_special:
                block, pending = t - (self.special_base if is_special else 0), pos
            elif is_offset:
                if block is None:
                    errors.append(MeshDecodeError(pos, "offset token before any block token"))
                patches[-1][1].append(self._coords(0 if block is None else block, t))
                pending = None
            else:
                errors.append(
                    MeshDecodeError(pos, f"token id {t} outside the vocabulary [0, {self.eos_id}]")
                )
        if pending is not None:
            errors.append(MeshDecodeError(pending, "block token not followed by an offset"))
        corners = []
        for start, verts in patches:  # a fan around verts[0]; fewer than 3 vertices make no triangle
            if len(verts) < 3:
                errors.append(MeshDecodeError(start, f"patch has {len(verts)} vertices; a fan needs at least 3"))
            corners += [[verts[0], verts[j], verts[j + 1]] for j in range(1, len(verts) - 1)]
        vertices, faces = triangles_to_mesh(np.asarray(corners).reshape(-1, 3, 3), self.bits)
        errors.sort(key=lambda e: e.position)
        return DecodedMesh(vertices=vertices, faces=faces, errors=tuple(errors))
