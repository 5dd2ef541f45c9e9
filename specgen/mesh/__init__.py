"""Mesh foundation: quantisation, BPT/naive tokenizers, procedural data, sampling, export, metrics."""

from specgen.mesh.errors import MeshDecodeError, MeshInputError
from specgen.mesh.tokenizers import TOKENIZERS, BPTTokenizer, NaiveTokenizer

__all__ = ["TOKENIZERS", "BPTTokenizer", "MeshDecodeError", "MeshInputError", "NaiveTokenizer"]
