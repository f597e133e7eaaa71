"""`pipeline eval`'s scoring against lm-evaluation-harness (0.4.13, HFLM) on the same HF model
directory and the same items: items/s each, and how many items' predictions agree.

    python benchmarks/eval_throughput.py --model runs/t125-hf [--tasks piqa,arc_easy,...] [--limit 500]
    python benchmarks/eval_throughput.py --size 125m     # a randomly initialised Llama of that shape
    python benchmarks/eval_throughput.py --smoke         # a tiny random Llama on CPU, 8 items a task

Both sides get the model already loaded (ours through `gristmill.trainer.eval_models.load`,
lm-eval's HFLM built once) and are timed from the task file to the scores: reading and
prompting the items, tokenizing, the forwards. On a GPU both run bf16 (lm-eval `dtype=bfloat16`,
`batch_size` as given, default 64); on CPU fp32. Without `--model` the model is a Llama of
`--size`'s shape with the GPT-2 tokenizer (../shared/data/tokenizers/gpt2), random weights
(seed 0): throughput does not depend on training, and agreement is per item either way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("GRISTMILL_DATA") or REPO.parent / "shared" / "data")
SIZES = {  # hidden, layers, heads, ffn
    "tiny": (64, 2, 4, 192),
    "125m": (768, 12, 12, 2048),
    "350m": (1024, 24, 16, 2816),
}


def build_model(folder: Path, size: str, max_len: int) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from gristmill.tokenize.tokenizer import load
    from gristmill.trainer.export import write_tokenizer

    tok = load(DATA / "tokenizers" / "gpt2")
    d, n, h, f = SIZES[size]
    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=d,
        intermediate_size=f,
        num_hidden_layers=n,
        num_attention_heads=h,
        num_key_value_heads=h,
        max_position_embeddings=max_len,
        tie_word_embeddings=False,
        eos_token_id=tok.token_to_id("<|endoftext|>"),
        bos_token_id=tok.token_to_id("<|endoftext|>"),
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(folder))
    (folder / "tok.json").write_text(tok.to_str())
    eos = tok.token_to_id("<|endoftext|>")
    write_tokenizer(folder, folder / "tok.json", eos, eos, max_len)
    return folder


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="an HF model directory (default: a random Llama of --size)")
    ap.add_argument("--size", default="125m", choices=sorted(SIZES))
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--tasks", default="piqa,arc_easy,copa,winogrande,lambada_openai,boolq")
    ap.add_argument("--limit", type=int, default=500)
    ap.add_argument("--batch-size", type=int, default=64, help="lm-eval's batch size")
    ap.add_argument("--batch-tokens", type=int, default=65536, help="ours: padded tokens per forward")
    ap.add_argument("--dtype", choices=["auto", "bf16", "fp32"], default="auto", help="both sides (auto: bf16 on GPU)")
    ap.add_argument(
        "--softmax-dtype",
        default="float32",
        help="lm-eval's log-softmax dtype (ours: float32; lm-eval's default, the model's dtype, sums bf16 values)",
    )
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.size, args.max_len, args.limit, args.batch_size, args.batch_tokens = "tiny", 256, 8, 8, 4096
        args.tasks = "piqa,copa,winogrande,lambada_openai"
    os.environ.setdefault("GRISTMILL_DATA", str(DATA))
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")

    from gristmill.evaluation.lm_eval_tasks import write_task_dir
    from gristmill.evaluation.tasks import load_tasks_file, read_records, resolve_tasks
    from gristmill.trainer import eval_models as models
    from gristmill.trainer.evaluate import evaluate_task

    tmp = Path(tempfile.mkdtemp(prefix="eval-bench-"))
    os.environ.setdefault("HF_DATASETS_CACHE", str(tmp / "hf-datasets"))
    model_dir = Path(args.model) if args.model else build_model(tmp / "model", args.size, args.max_len)
    gpu = torch.cuda.is_available()
    specs = resolve_tasks(
        args.tasks.split(","), load_tasks_file(REPO / "configs" / "eval" / "tasks.yaml"), "tasks.yaml"
    )
    names = write_task_dir([(s, read_records(s.path)[0]) for s in specs], tmp / "lm-eval-tasks")

    dtype = args.dtype if args.dtype != "auto" else ("bf16" if gpu else "fp32")
    ours_model = models.load(model_dir, device="cuda" if gpu else "cpu", dtype=dtype)
    ours, ours_s = {}, {}
    for s in specs:
        evaluate_task(ours_model, s, limit=2, batch_tokens=args.batch_tokens)  # warm-up (kernels, allocator)
        if gpu:
            torch.cuda.synchronize()
        t = time.perf_counter()
        ours[s.name] = evaluate_task(ours_model, s, limit=args.limit, batch_tokens=args.batch_tokens)
        if gpu:
            torch.cuda.synchronize()
        ours_s[s.name] = time.perf_counter() - t
    del ours_model
    if gpu:
        torch.cuda.empty_cache()
    for s in specs:
        summary = ours[s.name][0]
        rate = summary["items"] / ours_s[s.name]
        print(f"ours {s.name}: {summary['items']} items, {rate:,.1f} items/s, acc {summary['acc']:.4f}")
    sys.stdout.flush()

    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(
        pretrained=str(model_dir),
        dtype={"bf16": "bfloat16", "fp32": "float32"}[dtype],
        softmax_dtype=args.softmax_dtype,
        device="cuda" if gpu else "cpu",
        batch_size=args.batch_size,
    )
    manager = TaskManager(include_path=str(tmp / "lm-eval-tasks"))
    theirs, theirs_s = {}, {}
    for s, n in zip(specs, names):
        t = time.perf_counter()
        res = lm_eval.simple_evaluate(
            model=lm, tasks=[n], task_manager=manager, limit=args.limit, log_samples=True, fewshot_random_seed=s.seed
        )
        theirs_s[s.name] = time.perf_counter() - t
        theirs[s.name] = sorted(res["samples"][n], key=lambda x: x["doc_id"])

    device = torch.cuda.get_device_name() if gpu else "CPU"
    print(f"model {model_dir} ({dtype}, lm-eval softmax {args.softmax_dtype}, {device}), limit {args.limit}")
    print("| task | items | ours items/s | lm-eval items/s | ratio | same prediction | acc ours | acc lm-eval |")
    print("|---|---|---|---|---|---|---|---|")
    tot_items = tot_ours = tot_theirs = 0.0
    disagreements, margins = [], []
    for s in specs:
        summary, rows = ours[s.name]
        by = {x["doc_id"]: x for x in theirs[s.name]}
        same = sum(1 for r in rows if by[r["index"]]["acc"] == r["scores"]["acc"])
        for r in rows:
            if r["layout"] != "lm":
                top = sorted(r["lls"])[-2:]
                margins.append((top[1] - top[0], by[r["index"]]["acc"] != r["scores"]["acc"]))
            if by[r["index"]]["acc"] != r["scores"]["acc"]:
                lls = [float(x[0]) for x in by[r["index"]]["filtered_resps"]]
                disagreements.append({"task": s.name, "item": r["index"], "ours": r["lls"], "lm_eval": lls})
        n = len(rows)
        acc_t = sum(by[r["index"]]["acc"] for r in rows) / n
        a, b = n / ours_s[s.name], len(theirs[s.name]) / theirs_s[s.name]
        tot_items += n
        tot_ours += ours_s[s.name]
        tot_theirs += theirs_s[s.name]
        print(
            f"| {s.name} | {n} | {a:,.1f} | {b:,.1f} | {a / b:.2f}x | {same}/{n} ({100 * same / n:.1f}%) |"
            f" {summary['acc']:.4f} | {acc_t:.4f} |"
        )
    print(f"all tasks: ours {tot_items / tot_ours:,.1f} items/s, lm-eval {tot_items / tot_theirs:,.1f} items/s")
    print(f"ratio ours/lm-eval (items/s): {tot_theirs / tot_ours:.2f}")
    print(f"items whose prediction differs: {len(disagreements)}")
    if margins:
        import numpy as np

        m = np.array([x for x, _ in margins])
        d = np.array([x for x, bad in margins if bad])
        print(f"ours' margin between the two best choices (nats): median {np.median(m):.3f} over all items", end="")
        print(f", {np.median(d):.3f} over the differing ones (max {d.max():.3f})" if d.size else "")
    for d in disagreements[:20]:
        print(json.dumps(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
