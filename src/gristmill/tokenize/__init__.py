"""BPE tokenization into Arrow token shards. Not built yet."""
