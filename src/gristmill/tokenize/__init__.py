"""BPE tokenization into Arrow token shards (see docs/token-shards.md).

`open_tokens(dir)` reads a token directory; `tokenizer.load`/`tokenizer.train` give the
tokenizer; `stages.Tokenize` is the global step that plans the tokenization stages.
"""

__all__ = ["Shard", "TokenDir", "TokenShardError", "open_tokens", "token_dtype"]
_FROM = {"token_dtype": "gristmill.tokenize.shards"}


def __getattr__(name: str):
    # imported when first asked for: the reader imports numpy and pyarrow, which the CLI's
    # commands that read no tokens (most) should not pay for at start-up
    if name not in __all__:
        raise AttributeError(f"module 'gristmill.tokenize' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_FROM.get(name, "gristmill.tokenize.reader")), name)
