"""specgen: speculative and parallel decoding for autoregressive generators (text, image, mesh)."""

__version__ = "0.1.0"
