"""Bits per byte on held-out text: the model's negative log-likelihood of every token of a
text, in bits, over the text's UTF-8 bytes. Comparable across tokenizers (unlike a loss per
token), which is what lets two data variants with different tokenizers be compared.

Windows as lm-evaluation-harness's `loglikelihood_rolling`: the token stream behind the prefix
token (bos, else eos), cut into disjoint windows of `max_len` predicted tokens, each window's
input starting with the previous window's last token; every token is predicted once.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch


@torch.no_grad()
def bits_per_byte(model, text: str, *, batch: int = 8, max_tokens: int | None = None) -> dict:
    """`model`: a models.Loaded. `max_tokens`: score only the text's first so many tokens
    (their bytes counted by decoding them)."""
    ids = model.tokenizer.encode(text, add_special_tokens=False).ids
    if max_tokens is not None and len(ids) > max_tokens:
        ids = ids[:max_tokens]
        nbytes = len(model.tokenizer.decode(ids, skip_special_tokens=False).encode("utf-8"))
    else:
        nbytes = len(text.encode("utf-8"))
    if not ids:
        raise ValueError("the text encodes to no token")
    stream = [model.prefix_id, *ids]
    L = model.max_len
    windows = [stream[s : s + L + 1] for s in range(0, len(ids), L)]
    nll = 0.0
    for k in range(0, len(windows), batch):
        chunk = windows[k : k + batch]
        width = max(len(w) - 1 for w in chunk)
        x = torch.zeros(len(chunk), width, dtype=torch.long)
        for j, w in enumerate(chunk):
            x[j, : len(w) - 1] = torch.tensor(w[:-1])
        logp = model.logprobs(x.to(model.device))
        for j, w in enumerate(chunk):
            t = torch.tensor(w[1:], device=logp.device)
            nll -= logp[j, : len(w) - 1].gather(-1, t[:, None]).sum().item()
    return {
        "bits_per_byte": nll / math.log(2) / nbytes,
        "token_perplexity": math.exp(nll / len(ids)),
        "tokens": len(ids),
        "bytes": nbytes,
        "windows": len(windows),
    }


def read_corpus(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None
