"""Visual AR: class-conditional LlamaGen-style targets with CFG, image drafters and generation."""
