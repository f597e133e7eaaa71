"""gristmill: Common Crawl WET files to curated, deduplicated, tokenized training data."""

__version__ = "0.1.0"
