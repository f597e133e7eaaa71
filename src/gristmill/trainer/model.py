"""A Llama-style decoder, top to bottom in one file (nanoGPT's habit).

Pre-norm RMSNorm, RoPE ("rotate half", as Hugging Face Llama), one fused q/k/v projection,
SwiGLU with one fused gate/up projection, no biases, optional grouped-query attention and tied embeddings. Attention
is `F.scaled_dot_product_attention(is_causal=True)`; with per-document masking it gets a
block-diagonal causal mask instead (dense mask → SDPA's memory-efficient/math path: a
reference path, correct everywhere, not the fast one on GPU).

Init (`init_weights`, also after meta-device construction): every matrix N(0, 0.02), the two
projections that write into the residual stream (`wo`, `w2`) N(0, 0.02/√(2·n_layers)) (GPT-2's
scaled init), norms 1. The ops come from `Kernels` (Triton or PyTorch reference).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from gristmill.trainer.config import ModelShape
from gristmill.trainer.kernels import Kernels, rope_tables


class ModelArgs(ModelShape):
    """What the model is built from: the train config's `model:` parameters (declared once, in
    `ModelShape`) with the vocabulary size and the longest sequence given, the derived sizes
    filled in. Checkpoints record it (`to_dict`); an export rebuilds it from there."""

    vocab_size: int = Field(ge=2)
    max_seq_len: int = Field(2048, ge=1, description="the longest sequence (RoPE tables): the data's seq_len")

    @model_validator(mode="after")
    def _derived(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.ffn_dim is None:
            self.ffn_dim = self.multiple_of * math.ceil(8 * self.dim / 3 / self.multiple_of)
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"dim {self.dim} / n_heads {self.n_heads} / n_kv_heads {self.n_kv_heads} do not divide")
        if (self.dim // self.n_heads) % 2:
            raise ValueError("head_dim must be even for RoPE")
        return self

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict:
        return self.model_dump()

    def non_embedding_params(self) -> int:
        """Parameters of the blocks and the final norm (not the embedding or the output head)."""
        d, kv = self.dim, self.n_kv_heads * self.head_dim
        attn = d * d * 2 + d * kv * 2
        mlp = 3 * d * self.ffn_dim
        return self.n_layers * (attn + mlp + 2 * d) + d

    def embedding_params(self) -> int:
        """The token embedding, and the output head unless it is the same matrix (tied)."""
        return self.vocab_size * self.dim * (1 if self.tie_embeddings else 2)

    def matmul_params(self) -> int:
        """Weights that multiply every token: the blocks' linear layers and the output head
        (tied or not: the logits are a matmul either way). Not the embedding (a lookup) or the
        norms (elementwise)."""
        d, kv = self.dim, self.n_kv_heads * self.head_dim
        per_block = d * d * 2 + d * kv * 2 + 3 * d * self.ffn_dim
        return self.n_layers * per_block + self.vocab_size * d

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6·N + 12·L·d·T, N = every matmul's weights, the output head
        included (`matmul_params`), 12·L·d·T attention's two matmuls (PaLM's count). The one
        formula behind every MFU figure, ours and the reference's."""
        return 6 * self.matmul_params() + 12 * self.n_layers * self.dim * seq_len


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, kernels: Kernels):
        super().__init__()
        self.eps, self.kernels = eps, kernels
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x, residual=None):
        """With `residual`: returns (norm(x + residual), x + residual) in one fused pass."""
        return self.kernels.rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, kernels: Kernels):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.kernels = kernels
        # [q; k; v] in one matmul (one launch, and one input gradient instead of three to add up)
        self.wqkv = nn.Linear(args.dim, (args.n_heads + 2 * args.n_kv_heads) * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x, cos, sin, mask=None):
        B, T, _ = x.shape
        qkv = self.wqkv(x).view(B, T, self.n_heads + 2 * self.n_kv_heads, self.head_dim)
        q, k, v = self.kernels.rope_qkv(qkv, cos, sin, self.n_heads, self.n_kv_heads)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, head_dim)
        gqa = self.n_kv_heads != self.n_heads
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return self.wo(o.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs, kernels: Kernels):
        super().__init__()
        self.kernels = kernels
        self.w13 = nn.Linear(args.dim, 2 * args.ffn_dim, bias=False)  # [gate; up]: one matmul
        self.w2 = nn.Linear(args.ffn_dim, args.dim, bias=False)

    def forward(self, x):
        return self.w2(self.kernels.swiglu(self.w13(x)))


class Block(nn.Module):
    def __init__(self, args: ModelArgs, kernels: Kernels):
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps, kernels)
        self.attention = Attention(args, kernels)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps, kernels)
        self.feed_forward = FeedForward(args, kernels)

    def forward(self, x, cos, sin, mask=None):
        attn = self.attention(self.attention_norm(x), cos, sin, mask)
        y, h = self.ffn_norm(attn, residual=x)  # h = x + attn, y = norm(h), fused
        return h + self.feed_forward(y)


def head(h, weight, targets, kernels: Kernels, args: ModelArgs):
    """Logits of `h` under the output `weight`, or with `targets` their mean loss through the
    chunked linear + cross-entropy, which never materialises them."""
    if targets is None:
        return F.linear(h, weight)
    return kernels.linear_cross_entropy(h, weight, targets, args.z_loss, args.ce_chunk_tokens)


class OutputLayer(nn.Linear):
    """The untied output projection, `head` run as a module (not its weight read from outside)
    so that FSDP2's hooks gather and reduce it as a unit of its own."""

    def __init__(self, args: ModelArgs, kernels: Kernels):
        super().__init__(args.dim, args.vocab_size, bias=False)
        self.args, self.kernels = args, kernels

    def forward(self, h, targets=None):
        return head(h, self.weight, targets, self.kernels, self.args)


def document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) document index per position → (B, 1, T, T) bool: causal and within one document."""
    T = doc_ids.shape[1]
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=doc_ids.device).tril()
    return (same & causal)[:, None]


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs, kernels: Kernels | None = None):
        super().__init__()
        self.args = args
        self.kernels = kernels or Kernels()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args, self.kernels) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps, self.kernels)
        self.output = None if args.tie_embeddings else OutputLayer(args, self.kernels)
        cos, sin = rope_tables(args.max_seq_len, args.head_dim, args.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # called with a unit's index before the forward uses its parameters (0: the embedding,
        # 1..L: the blocks, L + 1: final norm and head; `units()`): an optimizer that updates
        # beside the forward makes the forward wait there for that unit alone
        self.before_unit = None

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """(Re-)initialise everything, e.g. after `to_empty()` from the meta device.

        Each matrix is drawn whole from one seeded generator, in a fixed order, and a sharded
        (FSDP) parameter keeps its shard of it: the initial weights do not depend on the number
        of ranks (DTensor's own random ops would draw each shard differently).
        """
        gen = torch.Generator(device=self.rope_cos.device).manual_seed(seed)

        def normal_(p: torch.Tensor, std: float) -> None:
            full = torch.empty(p.shape, device=self.rope_cos.device).normal_(0.0, std, generator=gen)
            if hasattr(p, "device_mesh"):  # DTensor
                from torch.distributed.tensor import distribute_tensor

                full = distribute_tensor(full, p.device_mesh, p.placements).to_local()
                p = p.to_local()
            p.copy_(full)

        std = self.args.init_std
        cos, sin = rope_tables(self.args.max_seq_len, self.args.head_dim, self.args.rope_theta, self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)
        normal_(self.tok_embeddings.weight, std)
        for block in self.layers:
            for lin in (block.attention.wqkv, block.feed_forward.w13):
                normal_(lin.weight, std)
            for lin in (block.attention.wo, block.feed_forward.w2):
                normal_(lin.weight, std / math.sqrt(2 * self.args.n_layers))
            nn.init.ones_(block.attention_norm.weight)
            nn.init.ones_(block.ffn_norm.weight)
        nn.init.ones_(self.norm.weight)
        if self.output is not None:
            normal_(self.output.weight, std)

    def hidden(self, tokens: torch.Tensor, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        T = tokens.shape[1]
        if T > self.args.max_seq_len:
            raise ValueError(f"sequence of {T} tokens exceeds max_seq_len {self.args.max_seq_len}")
        wait = self.before_unit or (lambda i: None)
        wait(0)
        x = self.tok_embeddings(tokens)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        mask = document_mask(doc_ids) if doc_ids is not None else None
        for i, block in enumerate(self.layers):
            wait(i + 1)
            x = block(x, cos, sin, mask)
        wait(len(self.layers) + 1)
        return self.norm(x)

    def units(self) -> list[list[nn.Parameter]]:
        """The parameters in the order the forward uses them, by `before_unit`'s index: the
        embedding, each block, then the final norm and the output head (the embedding's matrix
        when tied, which unit 0 already holds)."""
        tail = [*self.norm.parameters(), *(self.output.parameters() if self.output is not None else [])]
        return [list(self.tok_embeddings.parameters()), *(list(b.parameters()) for b in self.layers), tail]

    def forward(self, tokens, targets=None, doc_ids=None):
        """Logits (B, T, V) without `targets`; the mean loss with them (logits never materialised
        on the fused path)."""
        h = self.hidden(tokens, doc_ids)
        if self.output is not None:
            return self.output(h, targets)
        return head(h, self.tok_embeddings.weight, targets, self.kernels, self.args)  # tied
