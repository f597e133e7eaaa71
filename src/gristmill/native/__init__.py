"""gristmill's C extension modules, built by `pip install` (setuptools `ext-modules` in
pyproject.toml):

- `_fasttext`: fastText's supervised prediction with a per-word cache (wrapped by
  `gristmill.filters.fasttext_native`, which reads the model file);
- `_words`: the word tokenizer (`gristmill.text.words.WORD_TOKEN` as a scanner) and `Words`, a
  page's words as numbers with the Gopher filters' counts (used through `gristmill.text.words`).
"""
