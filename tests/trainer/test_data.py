"""The token-shard loader: zero-copy stream, windows, permutation, rank slices, resume state."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from gristmill.trainer.data import TokenStream, TrainLoader, WindowSampler, val_batches
from tests.trainer.conftest import EOS, write_token_dir


@pytest.fixture(scope="module")
def small_dir(tmp_path_factory):
    docs = {"train": [[i % 250 + 2] * (5 + i % 17) for i in range(120)], "val": [[7, 8, 9]] * 20}
    return write_token_dir(tmp_path_factory.mktemp("small") / "tokens", docs=docs, shard_docs=25), docs


def test_stream_is_all_shards_in_order_zero_copy(small_dir):
    root, docs = small_dir
    s = TokenStream(root, "train")
    expected = np.concatenate([np.asarray(d + [EOS]) for d in docs["train"]])
    assert len(s.parts) == 5 and s.total == len(expected)
    assert np.array_equal(s.window(0, s.total), expected)
    # a window across a shard boundary
    b = int(s.starts[1])
    assert np.array_equal(s.window(b - 3, 7), expected[b - 3 : b + 4])
    # the shard arrays are views of the memory-mapped files, not copies
    assert all(not p.flags.owndata for p in s.parts)
    # document ids restart at each document boundary
    ids = s.doc_ids(0, 40)
    lengths = [len(d) + 1 for d in docs["train"]]
    assert ids[lengths[0] - 1] == 0 and ids[lengths[0]] == 1 and ids[lengths[0] + lengths[1]] == 2


def test_uint32_tokens(tmp_path):
    root = write_token_dir(tmp_path / "t", vocab=70000, docs={"train": [[69999, 5, 6]] * 10}, dtype=pa.uint32())
    s = TokenStream(root, "train")
    assert s.parts[0].dtype == np.uint32 and s.window(0, 4).tolist() == [69999, 5, 6, EOS]


def test_permutation_is_a_pure_function_of_manifest_seed_epoch(small_dir):
    root, _ = small_dir
    s = TokenStream(root, "train")
    a, b = WindowSampler(50, 3, s.fingerprint), WindowSampler(50, 3, s.fingerprint)
    epoch0 = [a(k) for k in range(50)]
    assert sorted(epoch0) == list(range(50))  # each window once per epoch
    assert [b(k) for k in range(100)][:50] == epoch0  # same inputs, same order
    assert [a(k) for k in range(50, 100)] != epoch0  # next epoch reshuffled
    assert [WindowSampler(50, 4, s.fingerprint)(k) for k in range(50)] != epoch0  # seed matters


def test_ranks_split_each_global_batch_and_resume_on_other_world_size(small_dir):
    root, _ = small_dir
    s = TokenStream(root, "train")
    cpu = torch.device("cpu")

    def global_batches(world, micro, start_state=None, n=3):
        loaders = [
            TrainLoader(s, seq_len=16, global_batch=8, micro_batch=micro, rank=r, world=world, seed=0, device=cpu)
            for r in range(world)
        ]
        if start_state:
            for ld in loaders:
                ld.load_state_dict(start_state)
        out = []
        for _ in range(n):
            rows = [torch.cat([b.inputs for b in ld.next_global_batch()]) for ld in loaders]
            out.append(torch.cat(rows))
        return out, loaders[0].state_dict()

    one, _ = global_batches(1, 2, n=4)  # 4 accumulation steps of 2
    two, _ = global_batches(2, 4, n=4)
    assert all(torch.equal(x, y) for x, y in zip(one, two))
    # targets are inputs shifted by one
    ld = TrainLoader(s, seq_len=16, global_batch=8, micro_batch=8, rank=0, world=1, seed=0, device=cpu)
    b = ld.next_global_batch()[0]
    assert torch.equal(b.inputs[:, 1:], b.targets[:, :-1])
    # resume after 2 global batches on 4 ranks continues exactly where 1 rank would be
    _, state = global_batches(1, 8, n=2)
    rest, _ = global_batches(4, 2, start_state=state, n=2)
    assert all(torch.equal(x, y) for x, y in zip(one[2:], rest))


def test_val_batches_equal_count_per_rank(small_dir):
    root, _ = small_dir
    s = TokenStream(root, "train")
    cpu = torch.device("cpu")
    counts = [
        len(list(val_batches(s, seq_len=16, micro_batch=3, batches=4, rank=r, world=3, device=cpu))) for r in range(3)
    ]
    assert len(set(counts)) == 1 and counts[0] > 0


def test_bad_batch_shape_is_a_clear_error(small_dir):
    s = TokenStream(small_dir[0], "train")
    with pytest.raises(ValueError, match="global_batch 10 is not a multiple"):
        TrainLoader(s, seq_len=16, global_batch=10, micro_batch=4, rank=0, world=1, seed=0, device=torch.device("cpu"))
