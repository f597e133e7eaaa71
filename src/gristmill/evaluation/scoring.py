"""Log-likelihood of continuations, batched, and the per-item scores built from them.

Tokenization is lm-evaluation-harness's (`_encode_pair`): the context's trailing whitespace
moves to the continuation, the whole string is encoded, and the continuation is what follows
the encoded context's length; an empty context is the prefix token (bos, else eos). A sequence
longer than the model's `max_len + 1` keeps its last `max_len + 1` tokens (left truncation, as
lm-evaluation-harness does), counted per task.

Batching: items are taken longest first and whole (the choices of one item, which share their
context, go into one forward), as many as fit `batch_tokens` padded tokens; right padding, so
a causal model's logits of the real positions do not see it.

Scores (lm-evaluation-harness's definitions): `acc` argmax of the summed log-likelihoods is
gold; `acc_norm` argmax of log-likelihood / the answer's length in characters (Python `len`,
as its code computes it; its docs call it byte length); `acc_bytes` / UTF-8 bytes. Language
modelling: `acc` (greedy exact match: every continuation token is the argmax) and the item's
log-likelihood, from which the task's perplexity is exp(−mean), as lm-evaluation-harness's
`perplexity`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from gristmill.evaluation.tasks import Item


@dataclass
class Encoded:
    item: int
    choice: int
    context: list[int]
    continuation: list[int]


@dataclass
class Counters:
    truncated: int = 0  # requests whose context lost tokens on the left
    truncated_tokens: int = 0
    forwards: int = 0
    tokens: int = 0


def encode_pair(tok, context: str, continuation: str, prefix_id: int) -> tuple[list[int], list[int]]:
    if context == "":
        cont = tok.encode(continuation, add_special_tokens=False).ids
        return ([prefix_id], cont) if cont[:1] != [prefix_id] else (cont[:1], cont[1:])
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = tok.encode(context + continuation).ids
    ctx = tok.encode(context).ids
    return ctx, whole[len(ctx) :]


def encode_items(items: list[Item], tok, prefix_id: int, max_len: int) -> tuple[list[Item], list[list[Encoded]], dict]:
    """The items that can be scored, their encoded requests, and the skipped ones counted by
    reason: a continuation of more tokens than the model's sequence (no left truncation of the
    context leaves room to score it whole; lm-evaluation-harness stops on it), or one that
    encodes to no token."""
    kept, out, skipped = [], [], {}
    for it in items:
        reqs, why = [], None
        for c, (ctx, cont) in enumerate(it.requests):
            e_ctx, e_cont = encode_pair(tok, ctx, cont, prefix_id)
            if not e_cont:
                why = "continuation_encodes_to_nothing"
            elif len(e_cont) > max_len:
                why = "continuation_longer_than_model_sequence"
            reqs.append(Encoded(it.index, c, e_ctx, e_cont))
        if why:
            skipped[why] = skipped.get(why, 0) + 1
            continue
        kept.append(it)
        out.append(reqs)
    return kept, out, skipped


def _batches(encoded: list[list[Encoded]], max_len: int, batch_tokens: int) -> list[list[int]]:
    """Item indices per forward: longest first, whole items, padded tokens ≤ batch_tokens."""
    lengths = [min(max(len(r.context) + len(r.continuation) - 1 for r in reqs), max_len) for reqs in encoded]
    order = sorted(range(len(encoded)), key=lambda i: -lengths[i])
    batches, cur, rows, width = [], [], 0, 0
    for i in order:
        n, length = len(encoded[i]), lengths[i]
        if cur and (rows + n) * max(width, length) > batch_tokens:
            batches.append(cur)
            cur, rows, width = [], 0, 0
        cur.append(i)
        rows += n
        width = max(width, length)
    if cur:
        batches.append(cur)
    return batches


@torch.no_grad()
def loglikelihoods(
    model, encoded: list[list[Encoded]], batch_tokens: int = 16384, counters: Counters | None = None
) -> list[list[tuple[float, bool]]]:
    """(log-likelihood, greedy) of every request of every item; `model`: a models.Loaded."""
    counters = counters if counters is not None else Counters()
    results: list[list[tuple[float, bool] | None]] = [[None] * len(reqs) for reqs in encoded]
    limit = model.max_len + 1
    for batch in _batches(encoded, model.max_len, batch_tokens):
        rows, conts = [], []
        for i in batch:
            for r in encoded[i]:
                seq = r.context + r.continuation
                if len(seq) > limit:
                    counters.truncated += 1
                    counters.truncated_tokens += len(seq) - limit
                    seq = seq[-limit:]
                rows.append(seq[:-1])
                conts.append((i, r.choice, r.continuation))
        width = max(map(len, rows))
        x = torch.zeros(len(rows), width, dtype=torch.long)
        for j, row in enumerate(rows):
            x[j, : len(row)] = torch.tensor(row, dtype=torch.long)
        # the positions whose next token is a continuation token: the last len(cont) of each row
        r_idx = [j for j, (_, _, cont) in enumerate(conts) for _ in cont]
        c_idx = [p for j, (_, _, cont) in enumerate(conts) for p in range(len(rows[j]) - len(cont), len(rows[j]))]
        targets = torch.tensor([t for _, _, cont in conts for t in cont], device=model.device)
        logp = model.logprobs_at(
            x.to(model.device), torch.tensor(r_idx, device=model.device), torch.tensor(c_idx, device=model.device)
        )
        token_ll = logp.gather(-1, targets[:, None])[:, 0]
        hit = logp.argmax(-1) == targets
        # one transfer to the host per batch, then per-request sums there (float64)
        token_ll, hit = token_ll.double().cpu().numpy(), hit.cpu().numpy()
        counters.forwards += 1
        counters.tokens += sum(map(len, rows))
        start = 0
        for i, c, cont in conts:
            end = start + len(cont)
            results[i][c] = (float(token_ll[start:end].sum()), bool(hit[start:end].all()))
            start = end
    return results  # type: ignore[return-value]


@dataclass
class ItemScore:
    index: int
    layout: str
    gold: int | None
    lls: list[float]
    greedy: list[bool]
    pred: int | None = None
    pred_norm: int | None = None
    pred_bytes: int | None = None
    scores: dict[str, float] = field(default_factory=dict)
    n_choices: int = 1
    tokens: int | None = None  # continuation tokens (language modelling)

    def record(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def score_items(
    items: list[Item], results: list[list[tuple[float, bool]]], encoded: list[list[Encoded]]
) -> list[ItemScore]:
    out = []
    for it, res, enc in zip(items, results, encoded, strict=True):
        lls = [r[0] for r in res]
        greedy = [r[1] for r in res]
        s = ItemScore(it.index, it.layout, it.gold, lls, greedy, n_choices=len(res))
        if it.layout == "lm":
            s.scores = {"acc": float(greedy[0]), "loglikelihood": lls[0]}
            s.tokens = len(enc[0].continuation)
        else:
            ll = np.array(lls)
            s.pred = int(np.argmax(ll))
            s.scores["acc"] = float(s.pred == it.gold)
            if it.layout == "mc":
                chars = np.array([float(len(c)) for c in it.choices])
                nbytes = np.array([float(len(c.encode("utf-8"))) for c in it.choices])
                s.pred_norm = int(np.argmax(ll / chars))
                s.pred_bytes = int(np.argmax(ll / nbytes))
                s.scores["acc_norm"] = float(s.pred_norm == it.gold)
                s.scores["acc_bytes"] = float(s.pred_bytes == it.gold)
        out.append(s)
    return out


def perplexity(scores: list[ItemScore]) -> float:
    """lm-evaluation-harness's `perplexity`: exp(−mean item log-likelihood)."""
    return math.exp(-float(np.mean([s.scores["loglikelihood"] for s in scores])))
