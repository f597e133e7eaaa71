"""The model to evaluate and its tokenizer, from a training output folder (its newest intact
checkpoint), one checkpoint, or a Hugging Face model directory.

A Llama directory of our layout (what `pipeline export-hf` writes, or any LlamaForCausalLM
without biases and with default RoPE) is loaded into our own `Transformer` (q/k/v and gate/up
fused back); any other architecture goes through transformers' `AutoModelForCausalLM`. Either
way scoring sees one interface: `logprobs(tokens) -> (B, T, V) float32 log-softmax`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from gristmill.trainer import checkpoint as ckpt


class ModelError(ValueError):
    """A model that cannot be evaluated; the message names the path."""


@dataclass
class Loaded:
    model: torch.nn.Module
    tokenizer: object  # tokenizers.Tokenizer
    vocab_size: int
    max_len: int
    prefix_id: int  # the context of an empty context (lm-evaluation-harness: bos, else eos)
    source: str
    kind: str  # "checkpoint" | "hf-llama" | "hf-auto"
    device: torch.device
    dtype: torch.dtype

    @torch.no_grad()
    def logprobs(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.kind == "hf-auto":
            logits = self.model(tokens).logits
        else:
            logits = self.model(tokens)
        return torch.log_softmax(logits.float(), dim=-1)

    @torch.no_grad()
    def logprobs_at(self, tokens: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """(N, V) float32 log-softmax at positions (rows[i], cols[i]) only: the output layer
        runs on the scored positions, not on every position of the padded batch (at a 50k
        vocabulary the full logits of one 64k-token batch are 13 GB in fp32)."""
        if self.kind == "hf-auto":
            return self.logprobs(tokens)[rows, cols]
        h = self.model.hidden(tokens)[rows, cols]
        out = self.model.output
        weight = out.weight if out is not None else self.model.tok_embeddings.weight
        return torch.log_softmax(torch.nn.functional.linear(h, weight).float(), dim=-1)


def _tokenizer_vocab(tok) -> int:
    return max(tok.get_vocab(with_added_tokens=True).values()) + 1


def _check_vocab(tok, vocab_size: int, where: str, tok_where: str) -> None:
    have = _tokenizer_vocab(tok)
    if have > vocab_size:
        raise ModelError(
            f"{where}: the model's vocabulary has {vocab_size:,} ids, its tokenizer {tok_where} {have:,}:"
            " a checkpoint of another vocabulary than the tokenizer (pass --tokenizer with the one it was trained with)"
        )


def _load_tokenizer(path: str | Path):
    from tokenizers import Tokenizer

    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ModelError(f"{path}: no tokenizer.json")
    try:
        return Tokenizer.from_file(str(path)), path
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
        raise ModelError(f"{path}: not a tokenizers tokenizer.json ({e})") from None


def _device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    dev = torch.device(
        "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
    )
    if dtype == "auto":
        dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    else:
        dt = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[dtype]
    return dev, dt


def _special(tok, *names: str) -> int | None:
    for n in names:
        if n and (i := tok.token_to_id(n)) is not None:
            return i
    return None


def from_checkpoint(path: Path, tokenizer: str | None, device: str, dtype: str) -> Loaded:
    from gristmill.tokenize.reader import open_tokens
    from gristmill.trainer.kernels import Kernels
    from gristmill.trainer.model import ModelArgs, Transformer

    try:
        path = ckpt.resolve(path)
    except (ckpt.CheckpointError, FileNotFoundError) as e:
        raise ModelError(str(e)) from None
    meta = json.loads((path / "meta.json").read_text())
    args = ModelArgs(**meta["model_args"])
    dev, dt = _device_dtype(device, dtype)
    kernels = Kernels(backend="triton" if dev.type == "cuda" and _have_triton() else "reference")
    model = Transformer(args, kernels)
    ckpt.load_model_state(path, model)
    eos = bos = None
    if tokenizer:
        tok, tok_path = _load_tokenizer(tokenizer)
    else:
        tokens = meta.get("config", {}).get("data", {}).get("tokens")
        try:
            tokdir = open_tokens(tokens, verify=False)
            tokdir.verify_tokenizer()
        except Exception as e:  # noqa: BLE001 - a moved or damaged token directory: say which
            raise ModelError(
                f"checkpoint {path}: its tokenizer (in the token directory {tokens}) cannot be read ({e});"
                " pass --tokenizer"
            ) from None
        tok, tok_path = _load_tokenizer(tokdir.tokenizer_path)
        eos, bos = tokdir.eos_id, tokdir.bos_id
    _check_vocab(tok, args.vocab_size, f"checkpoint {path}", str(tok_path))
    if eos is None:
        eos = _special(tok, "<|endoftext|>", "</s>")
        bos = _special(tok, "<|bos|>", "<s>")
    prefix = bos if bos is not None else eos
    if prefix is None:
        raise ModelError(f"{tok_path}: has neither a bos nor an eos token (the context of an empty context)")
    model.to(device=dev, dtype=dt).eval()
    return Loaded(model, tok, args.vocab_size, args.max_seq_len, prefix, str(path), "checkpoint", dev, dt)


def _have_triton() -> bool:
    from gristmill.trainer.kernels import HAVE_TRITON

    return HAVE_TRITON


def _ours_fits(cfg: dict) -> str | None:
    """Why a Llama config.json is not our architecture (None when it is)."""
    if cfg.get("model_type") != "llama":
        return f"model_type {cfg.get('model_type')!r}"
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        return "biases"
    if cfg.get("hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.get('hidden_act')}"
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return f"rope_type {rope.get('rope_type')}"
    return None


def hf_to_ours(sd: dict[str, torch.Tensor], n_layers: int, tied: bool) -> dict[str, torch.Tensor]:
    """export.hf_state_dict's inverse: q/k/v and gate/up fused back."""
    out = {"tok_embeddings.weight": sd["model.embed_tokens.weight"], "norm.weight": sd["model.norm.weight"]}
    for i in range(n_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        a = p + "self_attn."
        out[q + "attention.wqkv.weight"] = torch.cat(
            [sd[a + "q_proj.weight"], sd[a + "k_proj.weight"], sd[a + "v_proj.weight"]]
        )
        out[q + "attention.wo.weight"] = sd[a + "o_proj.weight"]
        out[q + "feed_forward.w13.weight"] = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
        out[q + "feed_forward.w2.weight"] = sd[p + "mlp.down_proj.weight"]
        out[q + "attention_norm.weight"] = sd[p + "input_layernorm.weight"]
        out[q + "ffn_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
    if not tied:
        out["output.weight"] = sd["lm_head.weight"]
    return out


def _hf_special(root: Path, tok) -> tuple[int | None, int | None]:
    """bos and eos ids as transformers would give them: tokenizer_config.json, else config.json."""
    eos = bos = None
    tc = root / "tokenizer_config.json"
    if tc.is_file():
        conf = json.loads(tc.read_text())

        def tid(v):
            v = v.get("content") if isinstance(v, dict) else v
            return tok.token_to_id(v) if isinstance(v, str) else None

        bos, eos = tid(conf.get("bos_token")), tid(conf.get("eos_token"))
    cfg = json.loads((root / "config.json").read_text())
    bos = bos if bos is not None else cfg.get("bos_token_id")
    eos = eos if eos is not None else cfg.get("eos_token_id")
    return (bos if isinstance(bos, int) else None), (eos if isinstance(eos, int) else None)


def from_hf(root: Path, tokenizer: str | None, device: str, dtype: str) -> Loaded:
    from gristmill.trainer.kernels import Kernels
    from gristmill.trainer.model import ModelArgs, Transformer

    cfg = json.loads((root / "config.json").read_text())
    tok, tok_path = _load_tokenizer(tokenizer or root)
    dev, dt = _device_dtype(device, dtype)
    vocab = int(cfg["vocab_size"])
    max_len = int(cfg.get("max_position_embeddings") or 2048)
    why = _ours_fits(cfg)
    if why is None:
        from safetensors.torch import load_file

        files = sorted(root.glob("*.safetensors"))
        if not files:
            raise ModelError(f"{root}: no *.safetensors weights")
        sd = {}
        for f in files:
            sd.update(load_file(str(f)))
        heads = cfg["num_attention_heads"]
        args = ModelArgs(
            dim=cfg["hidden_size"],
            n_layers=cfg["num_hidden_layers"],
            n_heads=heads,
            n_kv_heads=cfg.get("num_key_value_heads") or heads,
            ffn_dim=cfg["intermediate_size"],
            vocab_size=vocab,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rope_theta=float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta") or 10000.0),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            max_seq_len=max_len,
        )
        if cfg.get("head_dim") not in (None, args.head_dim):
            why = f"head_dim {cfg['head_dim']} != hidden_size / heads"
    if why is None:
        kernels = Kernels(backend="triton" if dev.type == "cuda" and _have_triton() else "reference")
        model = Transformer(args, kernels)
        try:
            model.load_state_dict(hf_to_ours(sd, args.n_layers, args.tie_embeddings))
        except (KeyError, RuntimeError) as e:
            raise ModelError(f"{root}: weights do not fit its config.json ({type(e).__name__}: {e})") from None
        kind = "hf-llama"
    else:
        from transformers import AutoModelForCausalLM

        print(f"{root}: {why}: loaded through transformers' AutoModelForCausalLM", file=sys.stderr)
        model = AutoModelForCausalLM.from_pretrained(str(root), torch_dtype=dt)
        kind = "hf-auto"
    _check_vocab(tok, vocab, str(root), str(tok_path))
    bos, eos = _hf_special(root, tok)
    prefix = bos if bos is not None else eos
    if prefix is None:
        raise ModelError(f"{root}: no bos or eos token id (tokenizer_config.json, config.json)")
    model.to(device=dev, dtype=dt).eval()
    return Loaded(model, tok, vocab, max_len, prefix, str(root), kind, dev, dt)


def load(path: str | Path, tokenizer: str | None = None, device: str = "auto", dtype: str = "auto") -> Loaded:
    path = Path(path)
    if not path.exists():
        raise ModelError(f"{path}: no such model (a training output folder, a checkpoint or an HF model directory)")
    if (path / "config.json").is_file() and not (path / "meta.json").is_file():
        return from_hf(path, tokenizer, device, dtype)
    return from_checkpoint(path, tokenizer, device, dtype)
