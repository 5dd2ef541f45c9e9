"""Mesh foundation: quantisation, the BPT tokenizer, procedural data, sampling, export, metrics."""
