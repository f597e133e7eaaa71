"""BPE tokenization into Arrow token shards (see docs/token-shards.md).

`open_tokens(dir)` reads a token directory; `tokenizer.load`/`tokenizer.train` give the
tokenizer; `stages.Tokenize` is the global step that plans the tokenization stages.
"""

from gristmill.tokenize.reader import Shard, TokenDir, TokenShardError, open_tokens
from gristmill.tokenize.shards import token_dtype

__all__ = ["Shard", "TokenDir", "TokenShardError", "open_tokens", "token_dtype"]
