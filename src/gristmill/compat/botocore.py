"""botocore internals gristmill leans on, in one place.

- `StreamingBody._raw_stream`: the urllib3 response under a GetObject body. Its `read1(n)` gives
  what has arrived (at most one read from the socket), where `StreamingBody.read(n)` waits for
  `n` bytes: when a connection drops, the bytes that came before it are kept, and the stream
  resumes from the byte after the last one received (`gristmill.input.stream`) instead of
  fetching up to a whole read again. Without it (another botocore), whole reads: slower to
  resume, still exact.
"""

from __future__ import annotations

#: botocore versions (major.minor) this module was written and tested for
WRITTEN_FOR = ("1.43",)


def read_arrived(body, n: int) -> bytes:
    """Up to `n` bytes of a GetObject body, as many as have arrived (at least one, b"" at its end)."""
    read1 = getattr(getattr(body, "_raw_stream", None), "read1", None)
    return body.read(n) if read1 is None else read1(n)
