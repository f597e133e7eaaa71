"""Neural sequence classifiers from a local Hugging Face model directory: validated, loaded and
run for the `classifier` step (filters/classifier.py) and `pipeline train-classifier`.

Two kinds of directory are read:

- a `*ForSequenceClassification` model as `save_pretrained` writes it (FineWeb-Edu's classifier,
  NeMo Curator's): `config.json`, `model.safetensors`, the fast tokenizer (`tokenizer.json`),
  loaded with `AutoModelForSequenceClassification`;
- an encoder (`AutoModel`: all-MiniLM-L6-v2, say) plus a head of ours, `head.json` and
  `head.safetensors`, written by `pipeline train-classifier`: the encoder's tokens pooled (mean
  over the attention mask, as sentence-transformers pools, or the first token), optionally L2
  normalised, then a linear layer or a small MLP computed in fp32.

The head's output is the score: one output is a regression (FineWeb-Edu's 0-5 scale; its class
is the score rounded and clamped to `class_range`, as FineWeb-Edu's `int_score`), several are
classes (the score is the probability of `label`, softmax; the class is the arg max).

Validation runs in the planning process, before any document is read (`check_classifier`): the
files and every safetensors header against its file (a truncated file is named), then the model
and tokenizer loaded on CPU: every weight of the model present and of its shape (a head of the
wrong shape, an encoder given where a classifier is expected), the tokenizer fast and its ids
within the embedding table, and a probe text scored to a finite number. A task loads the
directory again only if its files are unchanged since that check.

Throughput is the tokenizer's as much as the model's: a whole web page can be 100x the text
`max_tokens` tokens cover, so each text is cut at a space before it is tokenized (`cut_text`,
`max_tokens` x `CHARS_PER_TOKEN` characters) and tokenized whole again in the rare case the cut
left fewer tokens than truncation keeps (the ids are then exactly those of the whole text's
truncation). Texts are sorted by length inside a window and batched by a token budget (little
padding); on GPU the next window is tokenized in a thread while the GPU runs the current one
(`prefetch`), and the model runs in bf16 (its head in fp32).
"""

from __future__ import annotations

import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gristmill.filters.model_check import ModelError

HEAD_CONFIG = "head.json"
HEAD_WEIGHTS = "head.safetensors"
HEAD_FORMAT = "gristmill-classifier-head"
HEAD_VERSION = 1
#: characters of text kept per token of `max_tokens` before tokenizing (measured on the sample's
#: English pages: 512 WordPiece tokens cover 1,700-2,900 characters; whitespace runs of WET text
#: and long words push a few pages over, and those are tokenized whole again)
CHARS_PER_TOKEN = 8
#: tokens of padded input per forward pass, by device (`batch_tokens` overrides)
BATCH_TOKENS = {"cpu": 8192, "cuda": 65536}
#: the step's throughput measured on one H200 (benchmarks/classifier_throughput.py, bf16,
#: batch_tokens 131,072): all-MiniLM-L6-v2 under a regression head at 512 tokens, documents of
#: the sample (docs/benchmarks.md); `pipeline plan`'s GPU-hours scale it by parameters x tokens
MEASURED_GPU_DOCS_S = 7092.0
MEASURED_GPU_PARAMS = 22.7e6  # the encoder (22.7M) and a one-output head
MEASURED_GPU_TOKENS = 512
#: documents per forward pass at most, however short
MAX_BATCH_DOCS = 1024
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


@dataclass(frozen=True)
class ModelInfo:
    """A classifier directory that passed validation (`check_classifier`), as it was then."""

    path: str
    #: (file name, size, mtime_ns) of every file the model is loaded from
    files: tuple[tuple[str, int, int], ...]
    kind: str  # "sequence_classification" | "head"
    task: str  # "regression" | "classification" | "multi_label"
    labels: tuple[str, ...]
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int
    vocab: int
    params: int
    head: dict = field(default_factory=dict, compare=False)

    @property
    def outputs(self) -> int:
        return max(len(self.labels), 1)


def _model_files(path: Path) -> list[str]:
    names = ["config.json"]
    if (path / "model.safetensors").is_file():
        names.append("model.safetensors")
    elif (path / "model.safetensors.index.json").is_file():
        names.append("model.safetensors.index.json")
        index = json.loads((path / "model.safetensors.index.json").read_text())
        names.extend(sorted(set(index.get("weight_map", {}).values())))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (path / name).is_file():
            names.append(name)
    if (path / HEAD_CONFIG).exists():
        names += [HEAD_CONFIG, HEAD_WEIGHTS]
    return names


def _stats(path: Path, names: list[str]) -> tuple[tuple[str, int, int], ...]:
    out = []
    for name in names:
        try:
            st = (path / name).stat()
        except OSError:
            raise ModelError(f"{path}: {name} missing (the model directory is incomplete)") from None
        out.append((name, st.st_size, st.st_mtime_ns))
    return tuple(out)


def safetensors_header(path: Path) -> dict:
    """The tensors of a safetensors file ({name: {dtype, shape, data_offsets}}), each checked
    to lie inside the file, the file ending where its last tensor does."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelError(f"{path}: truncated safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 100 << 20):
            raise ModelError(f"{path}: not a safetensors file (header of {n:,} bytes in a file of {size:,})")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ModelError(f"{path}: corrupt safetensors header ({e})") from None
    data = size - 8 - n
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    end = 0
    for name, t in tensors.items():
        try:
            a, b = t["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise ModelError(f"{path}: corrupt safetensors header (tensor {name!r})") from None
        end = max(end, b)
        if b > data:
            raise ModelError(
                f"{path}: truncated safetensors file: tensor {name!r} ends at byte {b:,} of its data, "
                f"the file holds {data:,}"
            )
    if end != data:
        raise ModelError(f"{path}: corrupt safetensors file: {data - end:,} bytes after its last tensor")
    return tensors


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: not readable JSON ({e})") from None


def quiet_transformers():
    """transformers, its progress bars and per-load reports off (the step reports itself)."""
    try:
        import transformers
    except ImportError:
        raise ModelError(
            "the classifier step needs transformers and safetensors: pip install -e '.[classifier]'"
        ) from None

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


_verdicts: dict[tuple, ModelInfo | ModelError] = {}


def check_classifier(path: str | Path) -> ModelInfo:
    """Validate a classifier directory (the module doc says what is checked); returns what the
    step needs to know of it. Once per directory and file stats in a process."""
    path = Path(path)
    if not path.is_dir():
        raise ModelError(
            f"classifier model directory not found: {path}"
            + ("" if not path.is_file() else " (a file; expected a directory as save_pretrained writes it)")
        )
    if not (path / "config.json").is_file():
        raise ModelError(f"{path}: no config.json; expected a Hugging Face model directory (save_pretrained)")
    if not any((path / w).is_file() for w in WEIGHT_FILES):
        other = [p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
        raise ModelError(
            f"{path}: no model.safetensors"
            + (
                f" (found {', '.join(other)}: only safetensors are loaded, pickled weights can run code)"
                if other
                else ""
            )
        )
    if not (path / "tokenizer.json").is_file():
        raise ModelError(f"{path}: no tokenizer.json; the classifier needs the model's fast tokenizer")
    names = _model_files(path)
    stats = _stats(path, names)
    key = (str(path.resolve()), stats)
    verdict = _verdicts.get(key)
    if verdict is None:
        try:
            verdict = _check(path, stats)
        except ModelError as e:
            verdict = e
        _verdicts[key] = verdict
    if isinstance(verdict, ModelError):
        raise ModelError(str(verdict))
    return verdict


def _check(path: Path, stats) -> ModelInfo:
    config = _read_json(path / "config.json")
    weights = [path / n for n, _, _ in stats if n.endswith(".safetensors") and n != HEAD_WEIGHTS]
    tensors: dict = {}
    for w in weights:
        tensors.update(safetensors_header(w))
    head: dict = {}
    if (path / HEAD_CONFIG).is_file():
        head = _read_json(path / HEAD_CONFIG)
        if head.get("format") != HEAD_FORMAT:
            raise ModelError(f"{path / HEAD_CONFIG}: not a classifier head (format {head.get('format')!r})")
        if not (path / HEAD_WEIGHTS).is_file():
            raise ModelError(f"{path}: {HEAD_CONFIG} without {HEAD_WEIGHTS}")
        _check_head_shapes(path, head, safetensors_header(path / HEAD_WEIGHTS), config)
        kind = "head"
        task = head["task"]
        labels = tuple(head.get("labels") or ())
    else:
        archs = config.get("architectures") or []
        if not any(a.endswith("ForSequenceClassification") for a in archs):
            raise ModelError(
                f"{path}: not a sequence classifier (config.json's architectures: {archs}) and no {HEAD_CONFIG}; "
                "give a *ForSequenceClassification model or train a head on this encoder with "
                "`pipeline train-classifier`"
            )
        kind = "sequence_classification"
        id2label = config.get("id2label") or {}
        n = len(id2label) or int(config.get("num_labels", 2))
        labels = tuple(str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(n))
        problem = config.get("problem_type")
        task = (
            "regression"
            if problem == "regression" or (problem is None and n == 1)
            else "multi_label"
            if problem == "multi_label_classification"
            else "classification"
        )
        if task == "regression":
            labels = ()
    tok, model = load(path, kind, head, "cpu")  # the trial load: every weight, the tokenizer's ids
    import torch

    encoder = model.encoder if kind == "head" else model
    emb = encoder.get_input_embeddings().num_embeddings
    if len(tok) > emb:
        raise ModelError(
            f"{path}: the tokenizer does not match the model: it has {len(tok):,} tokens, the model's "
            f"embedding table {emb:,} rows (a tokenizer.json of another model?)"
        )
    probe = "A short probe sentence to check that the classifier scores."
    enc = tok(probe, truncation=True, max_length=64, return_tensors="pt")  # one text: no tokenizer threads
    with torch.inference_mode():
        out = forward(model, kind, head, enc["input_ids"], enc["attention_mask"])
    outputs = head.get("layers", [0, 1])[-1] if kind == "head" else model.config.num_labels
    if tuple(out.shape) != (1, outputs):
        raise ModelError(f"{path}: the model's output has shape {tuple(out.shape)}, expected (1, {outputs})")
    if not bool(torch.isfinite(out).all()):
        raise ModelError(f"{path}: the model scores a probe text as {out.tolist()} (NaN/Inf weights?)")
    ec = encoder.config
    return ModelInfo(
        path=str(path),
        files=stats,
        kind=kind,
        task=task,
        labels=labels,
        hidden=int(ec.hidden_size),
        layers=int(getattr(ec, "num_hidden_layers", 1)),
        heads=int(getattr(ec, "num_attention_heads", 1)),
        intermediate=int(getattr(ec, "intermediate_size", 4 * ec.hidden_size)),
        max_positions=int(getattr(ec, "max_position_embeddings", 512) or 512),
        vocab=emb,
        params=sum(p.numel() for p in model.parameters()),
        head=head,
    )


def _check_head_shapes(path: Path, head: dict, tensors: dict, config: dict) -> None:
    layers = head.get("layers")
    if head.get("task") not in ("regression", "classification") or not isinstance(layers, list) or len(layers) < 2:
        raise ModelError(f"{path / HEAD_CONFIG}: needs task (regression|classification) and layers [in, ..., out]")
    if head.get("pooling") not in ("mean", "cls"):
        raise ModelError(f"{path / HEAD_CONFIG}: pooling must be mean or cls, not {head.get('pooling')!r}")
    hidden = config.get("hidden_size")
    if hidden is not None and layers[0] != hidden:
        raise ModelError(
            f"{path}: the head has the wrong shape: it takes {layers[0]} inputs, the encoder gives {hidden}"
        )
    n_out = layers[-1]
    if (
        head["task"] == "regression"
        and n_out != 1
        or head["task"] == "classification"
        and n_out != len(head.get("labels") or ())
    ):
        raise ModelError(
            f"{path / HEAD_CONFIG}: {n_out} outputs for a {head['task']} head of labels {head.get('labels')}"
        )
    for i, (a, b) in enumerate(zip(layers, layers[1:])):
        for name, shape in ((f"{2 * i}.weight", [b, a]), (f"{2 * i}.bias", [b])):
            got = tensors.get(name, {}).get("shape")
            if got != shape:
                raise ModelError(
                    f"{path / HEAD_WEIGHTS}: the head has the wrong shape: {name} is {got}, {HEAD_CONFIG} needs {shape}"
                )
    extra = set(tensors) - {f"{2 * i}.{w}" for i in range(len(layers) - 1) for w in ("weight", "bias")}
    if extra:
        raise ModelError(f"{path / HEAD_WEIGHTS}: tensors {sorted(extra)} are not in the head {layers}")


def build_head(layers: list[int]):
    """The head as a module: Linear layers with GELU between them (keys `0.weight`, `2.weight`...)."""
    import torch

    mods: list = []
    for i, (a, b) in enumerate(zip(layers, layers[1:])):
        if i:
            mods.append(torch.nn.GELU())
        mods.append(torch.nn.Linear(a, b))
    return torch.nn.Sequential(*mods)


class EncoderWithHead:
    """An encoder (AutoModel) and a head of ours: what `forward` runs for a `head` directory."""

    def __init__(self, encoder, head_module, head: dict):
        self.encoder, self.head_module, self.head = encoder, head_module, head

    def parameters(self):
        yield from self.encoder.parameters()
        yield from self.head_module.parameters()

    def to(self, *args, **kwargs):
        self.encoder.to(*args, **kwargs)
        return self


def load(path: Path, kind: str, head: dict, device: str, dtype=None):
    """(fast tokenizer, model) of a directory, on `device`, the encoder in `dtype` (default fp32)."""
    transformers = quiet_transformers()
    import torch
    from safetensors.torch import load_file

    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - any failure of the tokenizer files is one message
        raise ModelError(f"{path}: the tokenizer does not load ({type(e).__name__}: {e})") from None
    if not tok.is_fast:
        raise ModelError(f"{path}: the tokenizer is not a fast (Rust) tokenizer; the classifier needs tokenizer.json")
    auto = transformers.AutoModel if kind == "head" else transformers.AutoModelForSequenceClassification
    try:
        model, info = auto.from_pretrained(str(path), output_loading_info=True, dtype=torch.float32)
    except RuntimeError as e:
        if "mismatched" not in str(e):
            raise ModelError(f"{path}: the model does not load ({e})") from None
        _, info = auto.from_pretrained(str(path), output_loading_info=True, ignore_mismatched_sizes=True)
        shapes = "; ".join(f"{k}: {v}" for k, v in sorted(_mismatches(info)))
        raise ModelError(f"{path}: the head has the wrong shape for config.json ({shapes})") from None
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: the model does not load ({e})") from None
    missing = sorted(k for k in info["missing_keys"] if not (kind == "head" and k.startswith("pooler.")))
    if missing:
        raise ModelError(
            f"{path}: model.safetensors lacks {len(missing)} of the model's weights ({', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''}): an encoder saved without its classification head?"
        )
    model.eval()
    if kind == "head":
        head_module = build_head(head["layers"])
        head_module.load_state_dict(load_file(str(path / HEAD_WEIGHTS)))
        head_module.eval().to(device)
        model = EncoderWithHead(model, head_module, head)
    model.to(device, dtype=dtype or torch.float32)
    return tok, model


def _mismatches(info) -> list[tuple[str, str]]:
    out = []
    for item in info.get("mismatched_keys", []):
        if isinstance(item, tuple) and len(item) == 3:
            out.append((item[0], f"{tuple(item[1])} in the file, {tuple(item[2])} by the config"))
        else:
            out.append((str(item), "mismatched"))
    return out


def forward(model, kind: str, head: dict, input_ids, attention_mask):
    """The head's outputs (fp32) for a batch: logits of a sequence classifier, or the pooled
    encoder states through our head."""
    import torch

    if kind != "head":
        return model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
    states = model.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.float()
    if head["pooling"] == "mean":  # sentence-transformers' mean pooling
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    else:
        pooled = states[:, 0]
    if head.get("normalize"):
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
    return model.head_module(pooled)


def embed(model, head: dict, input_ids, attention_mask):
    """The pooled (and normalised) encoder output a head reads: `pipeline train-classifier`'s features."""
    import torch

    states = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.float()
    if head["pooling"] == "mean":
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    else:
        pooled = states[:, 0]
    return torch.nn.functional.normalize(pooled, p=2, dim=1) if head.get("normalize") else pooled


def cut_text(text: str, limit: int) -> tuple[str, bool]:
    """`text`, or for a longer one its start up to the last space or newline before `limit`
    characters (True: it was cut). A text with no space in the second half of that start is
    left whole: a cut inside a word could change the word's tokens."""
    if len(text) <= limit:
        return text, False
    i = max(text.rfind(" ", limit // 2, limit), text.rfind("\n", limit // 2, limit))
    if i < 0:
        return text, False
    return text[:i], True


def token_ids(tok, texts: list[str], max_tokens: int, max_chars: int, on_event=None) -> list[list[int]]:
    """Each text's ids, truncated to `max_tokens`: exactly the whole text's, tokenized from its
    cut start (`cut_text`), or whole where the cut left fewer than `max_tokens`."""
    cuts = [cut_text(t, max_chars) for t in texts]
    ids = tok([c for c, _ in cuts], truncation=True, max_length=max_tokens)["input_ids"]
    redo = [i for i, ((_, was_cut), x) in enumerate(zip(cuts, ids)) if was_cut and len(x) < max_tokens]
    if redo:
        if on_event:
            on_event("tokenized_whole", len(redo))
        again = tok([texts[i] for i in redo], truncation=True, max_length=max_tokens)["input_ids"]
        for i, x in zip(redo, again):
            ids[i] = x
    return ids


def padded(rows: list[list[int]], pad_id: int, multiple: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(ids, attention mask) of `rows`, padded on the right to the longest (a multiple of `multiple`)."""
    longest = max(len(r) for r in rows)
    width = -(-longest // multiple) * multiple
    ids = np.full((len(rows), width), pad_id, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for j, r in enumerate(rows):
        ids[j, : len(r)] = r
        mask[j, : len(r)] = 1
    return ids, mask


def _is_oom(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and "can't allocate memory" in str(e)  # CPU allocator
    )


class Scorer:
    """Scores texts with a validated classifier directory: tokens cut, sorted, batched by a
    token budget; scores (and classes) returned in input order."""

    def __init__(
        self,
        info: ModelInfo,
        device: str,
        max_tokens: int,
        batch_tokens: int | None = None,
        label: int | None = None,
        class_range: tuple[int, int] = (0, 5),
        max_chars: int | None = None,
        on_event=None,
    ):
        import torch

        self.info, self.device = info, device
        self.dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        self.tok, self.model = load(Path(info.path), info.kind, info.head, device, self.dtype)
        self.max_tokens = min(max_tokens, info.max_positions)
        self.batch_tokens = batch_tokens or BATCH_TOKENS["cuda" if device.startswith("cuda") else "cpu"]
        self.max_chars = max_chars or self.max_tokens * CHARS_PER_TOKEN
        self.label = label
        self.class_range = class_range
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        self.on_event = on_event or (lambda name, n=1: None)
        self.multiple = 8 if device.startswith("cuda") else 1  # tensor-core friendly lengths on GPU
        # on GPU the next window is tokenized while the GPU works (`prefetch`); on CPU both would
        # share the cores
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tokenize") if device.startswith("cuda") else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return token_ids(self.tok, texts, self.max_tokens, self.max_chars, self.on_event)

    def prefetch(self, texts: list[str]):
        """The ids of `texts` (`tokenize`), made in the tokenizer's thread: a Future."""
        return self._pool.submit(self.tokenize, texts)

    def score(self, texts: list[str], ids: list[list[int]] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(scores float32, classes int32) of `texts`, in their order (`ids`: their tokens, made
        ahead by `prefetch`)."""
        import torch

        n = len(texts)
        scores = np.empty(n, np.float32)
        classes = np.empty(n, np.int32)
        if not n:
            return scores, classes
        if ids is None:
            ids = self.tokenize(texts)
        rows = sorted(range(n), key=lambda r: -len(ids[r]))  # longest first: little padding
        outs: list = []
        start = 0
        while start < n:
            longest = self._round(len(ids[rows[start]]))
            size = max(1, min(self.batch_tokens // longest, MAX_BATCH_DOCS, n - start))
            part = rows[start : start + size]
            outs.append((part, self._run([ids[r] for r in part])))
            start += size
        index = np.fromiter((i for part, _ in outs for i in part), np.int64, n)
        with torch.inference_mode():
            logits = torch.cat([o for _, o in outs]).float().cpu()
        s, k = self._scores(logits)
        scores[index], classes[index] = s, k
        if not np.isfinite(scores).all():
            bad = int((~np.isfinite(scores)).sum())
            raise ModelError(
                f"{self.info.path}: the classifier scored {bad} of {n} documents NaN or Inf "
                f"(on {self.device}{', bf16' if self.dtype != torch.float32 else ''}); its weights or inputs overflow"
            )
        return scores, classes

    def _round(self, length: int) -> int:
        m = self.multiple
        return min(-(-length // m) * m, max(self.max_tokens, length))

    def _tensors(self, rows: list[list[int]]):
        import torch

        width = self._round(max(len(r) for r in rows))
        ids = np.full((len(rows), width), self.pad_id, np.int64)
        mask = np.zeros((len(rows), width), np.int64)
        for j, r in enumerate(rows):
            ids[j, : len(r)] = r
            mask[j, : len(r)] = 1
        return (
            torch.from_numpy(ids).to(self.device, non_blocking=True),
            torch.from_numpy(mask).to(self.device, non_blocking=True),
        )

    def _run(self, rows: list[list[int]]):
        """The head's outputs of one batch; out of memory, it is run in halves (and the budget
        halved for what follows), then one line if one document alone does not fit."""
        import torch

        try:
            ids, mask = self._tensors(rows)
            with torch.inference_mode():
                return forward(self.model, self.info.kind, self.info.head, ids, mask)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not _is_oom(e):
                raise
        ids = mask = None
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()
        longest = max(len(r) for r in rows)
        if len(rows) == 1:
            raise ModelError(
                f"{self.info.path}: out of memory on {self.device} scoring one document of {longest} tokens "
                "alone; lower max_tokens or give the task more memory"
            )
        self.on_event("oom_retries")
        self.batch_tokens = max(longest, min(self.batch_tokens, len(rows) * longest) // 2)
        half = len(rows) // 2
        return torch.cat([self._run(rows[:half]), self._run(rows[half:])])

    def _scores(self, logits) -> tuple[np.ndarray, np.ndarray]:
        import torch

        if self.info.task == "regression":
            s = logits[:, 0]
            lo, hi = self.class_range
            k = torch.round(s.clamp(lo, hi)).to(torch.int32)  # FineWeb-Edu's int_score
            return s.numpy(), k.numpy()
        probs = torch.sigmoid(logits) if self.info.task == "multi_label" else torch.softmax(logits, dim=1)
        k = logits.argmax(1).to(torch.int32)
        label = self.info.outputs - 1 if self.label is None else self.label
        return probs[:, label].numpy(), k.numpy()


def weight_bytes(info: ModelInfo, dtype_bytes: int = 4) -> int:
    return info.params * dtype_bytes


def activation_bytes(info: ModelInfo, batch_tokens: int, max_tokens: int, dtype_bytes: int = 4) -> int:
    """Peak of one forward pass over `batch_tokens` padded tokens: a layer's hidden states and
    its MLP's intermediate (a few live at once), and attention's scores and probabilities per
    head (the math kernel materialises them on CPU)."""
    states = batch_tokens * (4 * info.hidden + info.intermediate) * dtype_bytes
    attention = 2 * batch_tokens * info.heads * max_tokens * dtype_bytes
    return states + attention


def resolve_device(device: str, what: str) -> str:
    """`cpu`, `cuda` or `auto` as the task will use it; `cuda` without a GPU is refused here."""
    import torch

    if device == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise ModelError(
            f"{what}: device: cuda, but no CUDA GPU is visible here "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); set device: auto or cpu"
        )
    return "cpu"
