"""Mesh foundation: quantisation, BPT/naive tokenizers, procedural data, sampling, export, metrics."""
