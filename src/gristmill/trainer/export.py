"""`pipeline export-hf CKPT OUT`: a checkpoint as a Hugging Face `LlamaForCausalLM` directory
(`config.json` + `model.safetensors`, fp32) whose logits equal ours, with the run's tokenizer
(`tokenizer.json` + `tokenizer_config.json`) when its token directory is still there.

Our layout maps one-to-one except the fused `wqkv` = [q; k; v] and `w13` = [gate; up], which are split. RoPE already
uses Hugging Face's "rotate half" convention, so q/k need no permutation.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gristmill.trainer import checkpoint as ckpt
from gristmill.trainer.model import ModelArgs, Transformer


def load_model(path: str | Path) -> tuple[Transformer, Path]:
    path = ckpt.resolve(path)
    meta = json.loads((path / "meta.json").read_text())
    model = Transformer(ModelArgs(**meta["model_args"]))
    ckpt.load_model_state(path, model)
    return model, path


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    a = model.args
    sd = {"model.embed_tokens.weight": model.tok_embeddings.weight, "model.norm.weight": model.norm.weight}
    for i, b in enumerate(model.layers):
        p = f"model.layers.{i}."
        gate, up = b.feed_forward.w13.weight.split(a.ffn_dim, dim=0)
        kv = a.n_kv_heads * a.head_dim
        q, k, v = b.attention.wqkv.weight.split([a.n_heads * a.head_dim, kv, kv], dim=0)
        sd.update(
            {
                p + "input_layernorm.weight": b.attention_norm.weight,
                p + "self_attn.q_proj.weight": q,
                p + "self_attn.k_proj.weight": k,
                p + "self_attn.v_proj.weight": v,
                p + "self_attn.o_proj.weight": b.attention.wo.weight,
                p + "post_attention_layernorm.weight": b.ffn_norm.weight,
                p + "mlp.gate_proj.weight": gate,
                p + "mlp.up_proj.weight": up,
                p + "mlp.down_proj.weight": b.feed_forward.w2.weight,
            }
        )
    if model.output is not None:
        sd["lm_head.weight"] = model.output.weight
    return {k: v.detach().float().contiguous().clone() for k, v in sd.items()}


def hf_config(a: ModelArgs, eos_id: int | None = None, bos_id: int | None = None) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": a.vocab_size,
        "hidden_size": a.dim,
        "intermediate_size": a.ffn_dim,
        "num_hidden_layers": a.n_layers,
        "num_attention_heads": a.n_heads,
        "num_key_value_heads": a.n_kv_heads,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": a.max_seq_len,
        "rms_norm_eps": a.norm_eps,
        "rope_theta": a.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": a.rope_theta},
        "tie_word_embeddings": a.tie_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": a.init_std,
        "torch_dtype": "float32",
        "dtype": "float32",
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
    }


def export_hf(checkpoint: str | Path, out: str | Path) -> Path:
    from safetensors.torch import save_file

    model, path = load_model(checkpoint)
    meta = json.loads((path / "meta.json").read_text())
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    eos = bos = None
    tokenizer = None
    try:  # the tokenizer and its special ids, when the token directory is still there
        from gristmill.tokenize.reader import open_tokens

        toks = open_tokens(meta["config"]["data"]["tokens"], verify=False)
        toks.verify_tokenizer()
        eos, bos, tokenizer = toks.eos_id, toks.bos_id, toks.tokenizer_path
    except Exception:  # noqa: BLE001 - optional metadata
        pass
    save_file(hf_state_dict(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(model.args, eos, bos), indent=2))
    if tokenizer is not None:
        write_tokenizer(out, tokenizer, eos, bos, model.args.max_seq_len)
    return out


def write_tokenizer(out: Path, tokenizer_json: Path, eos: int, bos: int, max_len: int) -> None:
    """tokenizer.json and a tokenizer_config.json naming its special tokens, so that
    `AutoTokenizer.from_pretrained(out)` (and lm-evaluation-harness through it) encodes as we do."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    (out / "tokenizer.json").write_text(tok.to_str())
    conf = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": tok.id_to_token(eos),
        "bos_token": tok.id_to_token(bos),
        "model_max_length": max_len,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(conf, indent=2))
