"""Pre-training: the corpus, the instances (the original algorithm and its streaming form), the inputs."""
