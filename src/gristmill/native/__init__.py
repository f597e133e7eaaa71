"""gristmill's C extension modules, built by `pip install` (setuptools `ext-modules` in
pyproject.toml):

- `_fasttext`: fastText's supervised prediction with a per-word cache (wrapped by
  `gristmill.filters.fasttext_native`, which reads the model file);
- `_html`: the most attributes of an element of an HTML page, counted as the HTML standard's
  tokenizer reads tags, before a parser sees the page (used by `gristmill.input.warc`);
- `_words`: the word tokenizer (`gristmill.text.words.WORD_TOKEN` as a scanner) and `Words`, a
  page's words as numbers with the Gopher filters' counts (used through `gristmill.text.words`).
"""
