import pytest

from paramshard.data.shards.shard import shard, shard_indices
from paramshard.errors import ConfigError


def test_batches_dealt_round_robin_in_complete_rounds():
    assert shard_indices(10, 0, 2, batch_size=2) == [0, 1, 4, 5]
    assert shard_indices(10, 1, 2, batch_size=2) == [2, 3, 6, 7]   # 8, 9: incomplete round, dropped


def test_union_of_shards_is_each_step_of_the_big_batch():
    T, b, n = 3, 4, 100
    shards = [shard_indices(n, t, T, b) for t in range(T)]
    for k in range(len(shards[0]) // b):
        big = sorted(i for s in shards for i in s[k * b:(k + 1) * b])
        assert big == list(range(k * T * b, (k + 1) * T * b))


def test_iterables_are_dealt_item_by_item():
    assert list(shard(iter(range(7)), trainer_id=1, num_trainers=3)) == [1, 4]


def test_sequences_give_only_this_trainers_items():
    assert shard(list("abcdef"), trainer_id=1, num_trainers=2) == ["b", "d", "f"]


def test_bad_trainer_index():
    with pytest.raises(ConfigError):
        shard_indices(10, 2, 2)
