"""Errors raised by the mesh package: bad user input and token sequences that do not decode."""

from __future__ import annotations

from specgen.errors import UsageError


class MeshInputError(UsageError, ValueError):
    """A mesh, point cloud, file or option given to the mesh package is unusable (a one-line message naming it)."""


class MeshDecodeError(ValueError):
    """A token sequence does not decode to a mesh: `position` (0-based, a leading BOS counts) and `reason`."""

    def __init__(self, position: int, reason: str) -> None:
        self.position = int(position)
        self.reason = reason
        super().__init__(f"token {self.position}: {reason}")

    def __reduce__(self):  # keep the two-argument constructor picklable
        return (type(self), (self.position, self.reason))
