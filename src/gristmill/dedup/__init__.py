"""Exact (Bloom filter) and near (MinHash-LSH) deduplication. Not built yet."""
