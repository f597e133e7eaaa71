"""Reading a run's input: which files (`sources`), how their bytes arrive (`stream`, `commoncrawl`:
one transport per scheme, retried and counted), and how records become documents (`wet`: record
framing, damage handling and the WET reader; `warc`: WARC records and HTML to text).

Imports only the core: the planner asks it for the run's files and a reader over them, and the
reader opens each file through the `sources.Opener` it was handed, never through the planner.
"""
