"""FSDP pretraining on the Arrow token shards. Not built yet."""
