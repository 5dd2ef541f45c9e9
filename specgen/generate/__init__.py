"""Generation per modality, above the methods: prompts, classes or point clouds in; tokens, images or meshes out."""
