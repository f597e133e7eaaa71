"""gristmill's C extension modules, built by `pip install` (setuptools `ext-modules` in
pyproject.toml): `_fasttext`, fastText's supervised prediction with a per-word cache
(`gristmill.filters.fasttext_native` reads the model file and wraps it)."""
