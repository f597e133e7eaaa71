"""`pipeline ablate ablate.yaml`: curate every variant of a recipe, tokenize them with one
tokenizer, train a proxy model on each for the same token budget and several seeds, and say per
task whether each variant is better or worse than the baseline (docs/ablation.md)."""
