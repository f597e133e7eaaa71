"""Training windows from the Arrow token shards, read zero-copy through `gristmill.tokenize`.

The split's token stream is the values buffers of its shards in manifest order (each shard's
array is a view into the memory-mapped file; only the windows of a batch are copied). The stream
is cut into `n = (tokens − 1) // seq_len` windows of `seq_len + 1` tokens (window i starts at
i·seq_len; inputs are its first seq_len tokens, targets the last seq_len).

Order: epoch e visits the windows in `permutation(n)` drawn from a generator seeded by
(seed, e, fingerprint of the manifest's shard hashes) — a pure function of (manifest, seed,
epoch). The only state is `consumed`, the number of samples of all ranks taken so far: global
batch g holds samples [g·B, (g+1)·B); rank r of W takes the r-th of W equal slices, cut into
micro-batches in order. So a run resumes exactly, also on a different number of ranks (the same
samples form each global batch).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from gristmill.tokenize.reader import open_tokens


class TokenStream:
    """A split's tokens as one logical array over zero-copy shard views, with document starts."""

    def __init__(self, token_dir, split: str, verify="lazy"):
        self.tokdir = open_tokens(token_dir, verify=verify) if not hasattr(token_dir, "shards") else token_dir
        self.split = split
        shards = [s for s in self.tokdir.shards(split) if s.num_tokens]
        self.parts = [s.tokens for s in shards]
        self.starts = np.zeros(len(shards) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in self.parts], out=self.starts[1:])
        self.doc_starts = np.concatenate(
            [s.offsets[:-1] + start for s, start in zip(shards, self.starts[:-1])] or [np.zeros(0, np.int64)]
        )
        entries = self.tokdir.entries(split)
        self.fingerprint = int.from_bytes(
            hashlib.sha256("".join(e.get("sha256", e["path"]) for e in entries).encode()).digest()[:8], "little"
        )

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    @property
    def vocab_size(self) -> int:
        return self.tokdir.vocab_size

    def window(self, start: int, length: int) -> np.ndarray:
        """tokens[start:start+length] as int64 (a copy of just these tokens)."""
        out = np.empty(length, dtype=np.int64)
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        filled = 0
        while filled < length:
            part = self.parts[i]
            lo = start + filled - int(self.starts[i])
            take = min(length - filled, len(part) - lo)
            out[filled : filled + take] = part[lo : lo + take]
            filled += take
            i += 1
        return out

    def doc_ids(self, start: int, length: int) -> np.ndarray:
        """Per position, the index of its document (relative to the window's first document)."""
        ids = np.searchsorted(self.doc_starts, np.arange(start, start + length), side="right")
        return (ids - ids[0]).astype(np.int32)


@dataclass
class Batch:
    inputs: torch.Tensor  # (micro_batch, seq_len) int64
    targets: torch.Tensor
    doc_ids: torch.Tensor | None  # (micro_batch, seq_len) int32 when document masking is on


class WindowSampler:
    """Window index of global sample k: a pure function of (manifest, seed, epoch = k // n)."""

    def __init__(self, num_windows: int, seed: int, fingerprint: int):
        if num_windows < 1:
            raise ValueError("the token split holds fewer than seq_len + 1 tokens: no training window")
        self.n, self.seed, self.fingerprint = num_windows, seed, fingerprint
        self._epoch, self._perm = -1, None

    def __call__(self, k: int) -> int:
        epoch, i = divmod(k, self.n)
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch, self.fingerprint])
            self._epoch, self._perm = epoch, rng.permutation(self.n)
        return int(self._perm[i])


class TrainLoader:
    def __init__(
        self,
        stream: TokenStream,
        *,
        seq_len: int,
        global_batch: int,
        micro_batch: int,
        rank: int,
        world: int,
        seed: int,
        device: torch.device,
        doc_mask: bool = False,
    ):
        if global_batch % (world * micro_batch):
            raise ValueError(
                f"data.global_batch {global_batch} is not a multiple of micro_batch {micro_batch} × world size {world}"
            )
        self.stream, self.seq_len, self.global_batch, self.micro_batch = stream, seq_len, global_batch, micro_batch
        self.rank, self.world, self.device, self.doc_mask = rank, world, device, doc_mask
        self.accum_steps = global_batch // (world * micro_batch)
        self.sampler = WindowSampler((stream.total - 1) // seq_len, seed, stream.fingerprint)
        self.consumed = 0

    @property
    def epoch(self) -> float:
        return self.consumed / self.sampler.n

    def _micro(self, first_sample: int) -> Batch:
        L = self.seq_len
        starts = [self.sampler(first_sample + j) * L for j in range(self.micro_batch)]
        win = torch.from_numpy(np.stack([self.stream.window(s, L + 1) for s in starts]))
        docs = torch.from_numpy(np.stack([self.stream.doc_ids(s, L) for s in starts])) if self.doc_mask else None
        if self.device.type == "cuda":
            win = win.pin_memory()
            docs = docs.pin_memory() if docs is not None else None
        win = win.to(self.device, non_blocking=True)
        docs = docs.to(self.device, non_blocking=True) if docs is not None else None
        return Batch(win[:, :-1], win[:, 1:], docs)

    def next_global_batch(self) -> list[Batch]:
        """This rank's micro-batches of the next global batch; advances `consumed`."""
        first = self.consumed + self.rank * (self.global_batch // self.world)
        batches = [self._micro(first + a * self.micro_batch) for a in range(self.accum_steps)]
        self.consumed += self.global_batch
        return batches

    def state_dict(self) -> dict:
        return {
            "consumed_samples": self.consumed,
            "seq_len": self.seq_len,
            "seed": self.sampler.seed,
            "fingerprint": self.stream.fingerprint,
        }

    def load_state_dict(self, state: dict) -> None:
        if state["seq_len"] != self.seq_len:
            raise ValueError(f"checkpoint was trained with seq_len {state['seq_len']}, config says {self.seq_len}")
        if state["fingerprint"] != self.stream.fingerprint:
            raise ValueError("checkpoint was trained on a different token directory (shard hashes differ)")
        self.consumed = int(state["consumed_samples"])


def val_batches(
    stream: TokenStream,
    *,
    seq_len: int,
    micro_batch: int,
    batches: int,
    rank: int,
    world: int,
    device: torch.device,
    doc_mask: bool = False,
):
    """Fixed validation windows, in stream order, dealt to ranks: the same set every evaluation.

    Every rank gets the same number of batches (FSDP's collectives need all ranks in each forward).
    """
    n = (stream.total - 1) // seq_len
    total = min(n, batches * micro_batch * world) // world * world
    mine = list(range(rank, total, world))
    for i in range(0, len(mine), micro_batch):
        starts = [j * seq_len for j in mine[i : i + micro_batch]]
        win = torch.from_numpy(np.stack([stream.window(s, seq_len + 1) for s in starts])).to(device)
        docs = torch.from_numpy(np.stack([stream.doc_ids(s, seq_len) for s in starts])).to(device) if doc_mask else None
        yield Batch(win[:, :-1], win[:, 1:], docs)
