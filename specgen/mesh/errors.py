"""Errors raised by the mesh package: bad user input and token sequences that do not decode."""

from __future__ import annotations


class MeshInputError(ValueError):
    """A mesh, point cloud, file or option given to the mesh package is unusable.

    The message is one line that names the offending input; callers map it to a usage error.
    """


class MeshDecodeError(ValueError):
    """A token sequence does not decode to a mesh.

    Attributes:
        position: 0-based index into the token sequence as given to ``decode`` (a leading BOS
            token, when present, counts as position 0).
        reason: short human-readable explanation.
    """

    def __init__(self, position: int, reason: str) -> None:
        self.position = int(position)
        self.reason = reason
        super().__init__(f"token {self.position}: {reason}")

    def __reduce__(self):  # keep the two-argument constructor picklable
        return (type(self), (self.position, self.reason))
