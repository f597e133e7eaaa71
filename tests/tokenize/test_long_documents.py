"""Pages of megabytes through tokenization: encoded alone into arrays, trained on in pieces,
sampled as UTF-8 in row groups bounded by bytes; the ids, the tokenizer and the sample are
those of the whole texts. Thresholds are forced small here, so that real pages take those paths."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datatrove.data import Document

from gristmill.input.wet import WetReader
from gristmill.tokenize import encode, stages, tokenizer
from gristmill.tokenize.shards import tokens_array


@pytest.fixture(scope="module")
def docs(wet_files) -> list[Document]:
    return list(WetReader([str(p) for p in wet_files]).run())


def test_long_texts_encode_to_the_same_ids(tokenizer_files, docs, monkeypatch):
    enc = encode.Encoder(tokenizer.load(tokenizer_files / "gpt2"), "tiktoken")
    texts = [d.text for d in docs[:200]] + ["a page that writes <|endoftext|> in its text " * 50]
    lists = enc.encode_batch(texts)
    assert all(isinstance(t, list) for t in lists)
    monkeypatch.setattr(encode, "LONG_CHARS", 1000)
    mixed = enc.encode_batch(texts)
    assert 60 < sum(isinstance(t, np.ndarray) for t in mixed) < len(texts)  # both paths, in one batch
    assert [list(map(int, t)) for t in mixed] == lists
    assert 50256 not in mixed[-1].tolist()  # ordinary text: no EOS from inside a page
    # and the tokens column made of them is the same
    dtype = pa.uint16()
    assert tokens_array(mixed, 50256, dtype).equals(tokens_array(lists, 50256, dtype))


def test_training_on_pieces_of_long_texts_gives_the_same_tokenizer(docs):
    texts = [d.text for d in docs[:120]]
    long = ["\n".join(texts[i : i + 40]) for i in range(0, 120, 40)]  # three pages of ~200 KB
    whole = tokenizer.train(iter(long), 600, 2).to_str()
    pieces = [p for t in long for p in stages.training_pieces(t, 5000)]
    assert len(pieces) > 60
    assert tokenizer.train(iter(pieces), 600, 2).to_str() == whole
    assert "".join(stages.training_pieces(long[0], 5000)) == long[0]


def test_training_pieces_are_cut_where_the_pre_tokenizer_splits(docs):
    from tokenizers import pre_tokenizers

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    others = [
        "中文字符。下一句话，还有123数字！日本語のテキスト、です。" * 40,
        "it's a dog's life, isn't it?'s 2024-05-17 " * 40,
    ]
    cut = 0
    for text in [d.text for d in docs] + others:
        pieces = list(stages.training_pieces(text, 1000))
        assert "".join(pieces) == text
        cut += len(pieces) - 1
        assert [w for p in pieces for w, _ in pre.pre_tokenize_str(p)] == [w for w, _ in pre.pre_tokenize_str(text)]
    assert cut > 300
    # a stretch with no such place (one 3,000-letter word) is cut where it reaches the size
    assert [len(p) for p in stages.training_pieces("a" * 3000 + " b", 1000)] == [1000, 1000, 1000, 2]


def test_sample_row_groups_are_bounded_by_bytes(docs, tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "SAMPLE_ROW_GROUP_BYTES", 20_000)
    step = stages.TokenizerSampleStep(10**9)
    step.stage_folder = tmp_path
    list(step.run(iter(docs), 0, 1))
    pf = pq.ParquetFile(tmp_path / "output" / "sample_00000.parquet")
    sizes = [
        sum(len(t.encode()) for t in pf.read_row_group(g, columns=["text"]).column("text").to_pylist())
        for g in range(pf.num_row_groups)
    ]
    rows = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
    assert sum(rows) == len(docs) and max(rows) <= stages.SAMPLE_ROW_GROUP
    # a group holds at most the bound, or one longer document alone
    assert all(s <= 20_000 or r == 1 for s, r in zip(sizes, rows)) and any(r == 1 for r in rows)
    read = list(stages.read_samples(tmp_path / "output", 10**9))
    assert stages.hash_sample(read, 10**9) == stages.hash_sample(docs, 10**9)
    encoded = stages.hash_sample_entries(docs, 300_000, encoded=True)
    assert [(i, t.decode()) for i, t in encoded] == stages.hash_sample_entries(docs, 300_000)


def test_engine_check_reads_the_first_bytes_of_long_texts(tokenizer_files):
    hf = tokenizer.load(tokenizer_files / "gpt2")
    fast = encode.tiktoken_from_hf(hf)
    long = ("word " * 300_000).encode()
    heads = stages._Heads([long, b"short text"], 1000)
    assert len(heads) == 2 and heads[0] == ("word " * 200) and heads[1] == "short text"
    assert encode.compare(hf, fast.encoding, heads, max_bytes=500) == (2, None)
    assert stages._Heads(["é".encode() * 3000], 1001)[0] == "é" * 500  # the character cut is left out
