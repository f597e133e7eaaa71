"""Model files are validated in the planning process, before any document is read.

A truncated or damaged model is dangerous to load: fastText has no checksum and reads past the
end of a truncated dictionary into a multi-GB allocation, or segfaults; a fastText file cut in
its last matrix loads "fine" and scores with zeros; a KenLM binary cut in its vocabulary list
loads too. So each model file gets, once per (path, size, mtime) in a process:

1. checks with a precise message: size and magic number; a fastText file is read whole by
   gristmill's own reader (`fasttext_file.read_model`: every size against the file, every row
   a word can name, nothing left over; gristmill predicts with it, not with fastText's loader);
   a KenLM binary's header and the vocabulary list at its end; a file named like a published
   model (lid.176.ftz) must have that model's sha256;
2. for KenLM, a trial load in a short-lived child process with an address-space limit and a
   timeout: a signal, a non-zero exit or an exception there means the file is corrupt, and the
   planning process is unharmed.

Steps keep the `Checked` record and load the file in their task only if it is unchanged
(`unchanged`), so no task loads a file that was not validated.

A model given as a URL (`s3://...`, `gs://...`, `hf://...`) is downloaded once per machine into
the content-addressed cache of `gristmill.core.storage.cached_copy` and validated there; a task
on another machine downloads the same object again (same size, same fixed mtime) before loading.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from gristmill.core import storage
from gristmill.filters.fasttext_file import FASTTEXT_MAGIC, FastTextFileError, read_model


class ModelError(ValueError):
    """The model file is missing or unusable: raised before any document is read."""


@dataclass(frozen=True)
class Checked:
    """A model file that passed validation, as it was then (`unchanged` compares)."""

    path: str
    size: int
    mtime_ns: int
    info: dict = field(default_factory=dict, compare=False)  # e.g. a classifier's labels
    #: the URL the file was downloaded from (a model given as a URL), fetched again where missing
    source: str | None = field(default=None, compare=False)


# Models published under a fixed name: a file of that name must be that file.
PUBLISHED = {
    "lid.176.ftz": (938013, "8f3472cfe8738a7b6099e8e999c3cbfae0dcd15696aac7d7738a8039db603e83"),
    "lid.176.bin": (None, "7e69ec5451bc261cc7844e49e4792a85d7f09c06789ec800fc4a44aec362764e"),
}
_KENLM_MAGIC = b"mmap lm http://kheafield.com/code format version 5\n\0"
_KENLM_INCOMPLETE = b"mmap lm http://kheafield.com/code incomplete\n"
_verdicts: dict[tuple, Checked | ModelError] = {}


def _stat_key(path: Path, kind: str) -> tuple:
    st = path.stat()
    return kind, str(path.resolve()), st.st_size, st.st_mtime_ns


def _existing(path: str | Path, what: str) -> Path:
    if storage.is_url(path):
        try:
            return storage.cached_copy(str(path))
        except OSError as e:
            raise ModelError(f"{what}: {e}") from None
    path = Path(storage.local_or_url(path))
    if not path.is_file():
        raise ModelError(f"{what} not found: {path}")
    if path.stat().st_size == 0:
        raise ModelError(f"{path}: empty file; expected a {what}")
    return path


def _cached(key: tuple, check) -> Checked:
    verdict = _verdicts.get(key)
    if verdict is None:
        try:
            verdict = check()
        except ModelError as e:
            verdict = e
        _verdicts[key] = verdict
    if isinstance(verdict, ModelError):
        raise ModelError(str(verdict))
    return verdict


def unchanged(checked: Checked) -> str:
    """The path of a validated model, refusing a file replaced or modified since it was checked.
    A model downloaded from a URL that this machine has no copy of is downloaded first."""
    path = checked.path
    if checked.source is not None and not os.path.exists(path):
        try:
            path = str(storage.cached_copy(checked.source))
        except OSError as e:
            raise ModelError(f"{checked.source}: model file unreadable since the run was planned ({e})") from None
    try:
        st = os.stat(path)
    except OSError as e:
        raise ModelError(f"{path}: model file gone since the run was planned ({e.strerror})") from None
    if (st.st_size, st.st_mtime_ns) != (checked.size, checked.mtime_ns):
        raise ModelError(f"{checked.source or path}: model file changed since the run was planned; re-run the command")
    return path


_KENLM_TRIAL = r"""
import json, math, resource, sys
sys.path[:] = json.loads(sys.argv[3])
import kenlm
vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + int(sys.argv[2]),) * 2)
model = kenlm.Model(sys.argv[1])
score = model.score("a short probe sentence", bos=True, eos=True)
assert math.isfinite(score) and score < 0, score
print(json.dumps({"order": model.order}))
"""


def trial_load(code: str, path: Path, library: str) -> dict:
    """Load `path` with `code` in a child process with a memory limit and a timeout.

    Returns what the child printed (JSON); raises ModelError with why the load failed.
    """
    size = path.stat().st_size
    # Address space beyond the child's interpreter with the library imported: twice the file
    # plus headroom. A valid model never needs more; a corrupt size field asks for far more
    # and fails at once instead of taking the machine's memory.
    limit = 2 * size + (2 << 30)
    timeout = 60 + size / 20e6
    try:
        res = subprocess.run(
            [sys.executable, "-c", code, str(path), str(limit), json.dumps(sys.path)],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise ModelError(f"{library} did not load it within {timeout:.0f} s") from None
    if res.returncode < 0:
        try:
            name = signal.Signals(-res.returncode).name
        except ValueError:
            name = f"signal {-res.returncode}"
        raise ModelError(f"{library} could not load it: killed by {name}")
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1]
        if "MemoryError" in last or "bad_alloc" in last:
            last += f" (asked for more than {limit / 2**30:.1f} GiB more)"
        raise ModelError(f"{library} could not load it: {last}")
    return json.loads(res.stdout.strip().splitlines()[-1])


# --- fastText ---------------------------------------------------------------------------------


def _published(path: Path) -> str:
    """' (expected ...)' for a file named like a published model, else ''."""
    known = PUBLISHED.get(path.name)
    if not known:
        return ""
    size, sha = known
    size_text = f"{size:,}-byte " if size else ""
    return f"; expected the {size_text}{path.name} published by fastText (sha256 {sha[:12]}...)"


def check_fasttext(path: str | Path, what: str = "fastText model") -> Checked:
    """Validate a fastText model file (see the module doc); returns it with its labels and the
    shapes of its matrices."""
    source = str(path) if storage.is_url(path) else None
    path = _existing(path, what)

    def check() -> Checked:
        expected = _published(path) or f"; expected a complete {what} (.bin/.ftz as fastText saves it)"
        with open(path, "rb") as f:
            head = f.read(16)
        if head[:4] != FASTTEXT_MAGIC.to_bytes(4, "little"):
            raise ModelError(
                f"{path}: not a fastText model (it starts with {head!r}, not fastText's magic number){expected}"
            )
        try:
            model = read_model(path)
        except FastTextFileError as e:
            raise ModelError(f"{path}: truncated or corrupt fastText model ({e}){expected}") from None
        known = PUBLISHED.get(path.name)
        if known:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            if digest.hexdigest() != known[1]:
                raise ModelError(
                    f"{path}: corrupt fastText model (its sha256 is {digest.hexdigest()[:12]}...,"
                    f" not the published file's){expected}"
                )
        st = path.stat()
        info = {
            "labels": model.labels,
            "words": sum(t == 0 for t in model.types),
            "dim": model.dim,
            "input_rows": model.input.shape[0],
            "output_rows": model.output.shape[0],
        }
        return Checked(str(path), st.st_size, st.st_mtime_ns, info)

    return _from(source, _cached(_stat_key(path, "fasttext"), check))


def _from(source: str | None, checked: Checked) -> Checked:
    return replace(checked, source=source) if source else checked


# --- KenLM ------------------------------------------------------------------------------------


def kenlm_binary_layout(path: Path) -> dict:
    """Header and vocabulary-list checks of a KenLM binary; raises ModelError (reason only)."""
    size = path.stat().st_size
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[: len(_KENLM_INCOMPLETE)] == _KENLM_INCOMPLETE:
            raise ModelError("build_binary did not finish writing it")
        # Sanity block (magic padded to 56 bytes, test values), then order, probing multiplier,
        # model type, has_vocabulary, search version, and one uint64 count per order.
        if size < 108 or struct.unpack_from("<fffII", buf, 56) != (0.0, 1.0, -0.5, 1, 0xFFFFFFFF):
            raise ModelError(f"the header is cut or damaged (file of {size:,} bytes)")
        order, _mult, _type, has_vocab, _version = struct.unpack_from("<B3xfi?3xI", buf, 88)
        if not 1 <= order <= 20 or size < 108 + 8 * order:
            raise ModelError(f"impossible n-gram order {order} in the header")
        counts = struct.unpack_from(f"<{order}Q", buf, 108)
        if has_vocab:
            # build_binary ends the file with the vocabulary: counts[0] NUL-terminated words in
            # id order, so the counts[0]-th word from the end is <unk> (id 0).
            if buf[size - 1] != 0:
                raise ModelError("the file is cut: it does not end with its vocabulary list")
            pos, found = size - 1, 0
            while found < counts[0]:
                prev = buf.rfind(b"\0", 0, pos)
                found += 1
                if found == counts[0]:
                    if buf[prev + 1 : pos] != b"<unk>":
                        raise ModelError(f"its vocabulary list of {counts[0]:,} words is cut or damaged")
                    break
                if prev < 0:
                    raise ModelError(f"its vocabulary list of {counts[0]:,} words is cut or damaged")
                pos = prev
    return {"order": order, "counts": list(counts)}


def check_kenlm(path: str | Path) -> Checked:
    """Validate a KenLM binary or ARPA file (see the module doc)."""
    source = str(path) if storage.is_url(path) else None
    path = _existing(path, "KenLM model")

    def check() -> Checked:
        with open(path, "rb") as f:
            head = f.read(4096)
        expected = "; expected a KenLM binary (build_binary) or ARPA file"
        if head.startswith(_KENLM_MAGIC[:33]):
            try:
                kenlm_binary_layout(path)
            except ModelError as e:
                raise ModelError(f"{path}: truncated or corrupt KenLM binary ({e}){expected}") from None
        elif not head.lstrip().startswith(b"\\data\\"):
            raise ModelError(f"{path}: not a KenLM model (neither a KenLM binary nor an ARPA file){expected}")
        try:
            info = trial_load(_KENLM_TRIAL, path, "KenLM")
        except ModelError as e:
            raise ModelError(f"{path}: truncated or corrupt KenLM model ({e}){expected}") from None
        st = path.stat()
        return Checked(str(path), st.st_size, st.st_mtime_ns, info)

    return _from(source, _cached(_stat_key(path, "kenlm"), check))
