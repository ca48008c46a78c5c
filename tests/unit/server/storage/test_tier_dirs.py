"""The disk tier's directories are private (server/storage/tier_dirs.py), and a tier that cannot get disk
for new rows refuses them with a named error before writing any (server/storage/tier_space.py)."""
import errno
import os
import stat

import numpy as np
import pytest

from paramshard.budgets import MIN_BUDGET
from paramshard.optim import Adagrad
from paramshard.server.storage import tier_space
from paramshard.server.storage.tier_dirs import TierDirError, TierRoot, check_private
from paramshard.server.storage.tier_space import TierFull
from paramshard.server.storage.tiered_row_store import TieredRowStore
from paramshard.update_rules import make_rule


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_every_tier_directory_is_made_private(tmp_path):
    root = TierRoot(tmp_path / "run", 2)
    table = root.table_dir("emb")
    assert table == tmp_path / "run" / "tier" / "server-2" / "emb"
    for path in (table, table.parent, table.parent.parent):
        assert mode(path) == 0o700 and os.lstat(path).st_uid == os.getuid(), path
    root.remove()
    temp = TierRoot(None, 0)
    made = temp.table_dir("emb")
    assert mode(made.parent) == 0o700 and made.parent.name.startswith(f"paramshard-tier-{os.getpid()}-")
    temp.remove()
    assert not made.parent.exists()


def test_an_existing_private_tier_directory_is_used(tmp_path):
    (tmp_path / "tier").mkdir(mode=0o700)
    assert TierRoot(tmp_path, 0).table_dir("emb").is_dir()


@pytest.mark.parametrize("bits", [0o020, 0o002, 0o777])
def test_a_tier_directory_others_may_write_into_is_refused(tmp_path, bits):
    tier = tmp_path / "tier"
    tier.mkdir()
    os.chmod(tier, 0o700 | bits)
    (tier / "server-0").mkdir()                         # what a stale server left, or someone planted
    root = TierRoot(tmp_path, 0)
    root.remove_stale()
    assert (tier / "server-0").exists()                 # nothing is removed from a directory not ours
    with pytest.raises(TierDirError, match=rf"{tier} is writable by its group or by others .*chmod go-w"):
        root.table_dir("emb")
    assert os.listdir(tier) == ["server-0"]


def test_a_symlinked_tier_directory_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tier").symlink_to(elsewhere)
    with pytest.raises(TierDirError, match="is a symbolic link"):
        TierRoot(tmp_path / "run", 0).table_dir("emb")
    assert os.listdir(elsewhere) == []


def test_a_tier_directory_of_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("making a directory owned by another user needs root (chown)")
    tier = tmp_path / "tier"
    tier.mkdir(mode=0o700)
    os.chown(tier, 65534, 65534)
    with pytest.raises(TierDirError, match=rf"belongs to uid 65534, not to this user \(uid 0\)"):
        TierRoot(tmp_path, 0).table_dir("emb")
    with pytest.raises(TierDirError, match="not a directory"):
        (tmp_path / "file").write_bytes(b"")
        check_private(tmp_path / "file")


def full_disk(monkeypatch, free_rows_bytes):
    """posix_fallocate as on a file system with ``free_rows_bytes`` left: ENOSPC past them."""
    left = [free_rows_bytes]
    real = os.posix_fallocate

    def fallocate(fd, offset, length):
        if length > left[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        left[0] -= length
        real(fd, offset, length)
    monkeypatch.setattr(tier_space.os, "posix_fallocate", fallocate)


def test_a_full_disk_refuses_new_rows_by_name_and_keeps_serving_the_rows_it_has(tmp_path, monkeypatch):
    store = TieredRowStore(64, make_rule(Adagrad(lr=0.1)), False, False, max_rows=1 << 18,
                           memory_budget=MIN_BUDGET, tier_dir=tmp_path / "t", table_name="emb")
    row_bytes = store.values.strides[0] + store.slots[0].strides[0]
    full_disk(monkeypatch, 8 * store.region_rows * row_bytes)     # 2048 rows
    first = store.lookup_or_create(np.arange(1000, dtype=np.uint64), 0, 1, 0.1)
    before = store.gather(first).copy()
    with pytest.raises(TierFull) as refused:
        store.lookup_or_create(np.arange(10_000, dtype=np.uint64), 0, 1, 0.1)
    message = str(refused.value)
    assert message.startswith(f"table 'emb': disk tier full: {tmp_path / 't'} needs ")
    assert ") free; the table keeps the rows it has and takes no new ones" in message
    assert refused.value.wire_code == "disk_full" and isinstance(refused.value, MemoryError)
    assert store.num_rows == 1000                       # refused before any row was made
    again = store.lookup_or_create(np.arange(1000, dtype=np.uint64)[::-1], 0, 1, 0.1)   # held rows: served
    np.testing.assert_array_equal(again, first[::-1])
    np.testing.assert_array_equal(store.gather(first), before)
    with pytest.raises(TierFull):
        store.create(np.arange(50_000, 60_000, dtype=np.uint64), np.zeros((10_000, 64), np.float32), 0)
    assert store.num_rows == 1000
    store.close()


def test_space_is_taken_before_rows_are_written_and_given_back_when_they_go(tmp_path):
    store = TieredRowStore(64, make_rule(Adagrad(lr=0.1)), True, False, max_rows=1 << 18,
                           memory_budget=MIN_BUDGET, tier_dir=tmp_path / "t", table_name="emb")
    values = tmp_path / "t" / "values.rows"
    assert os.stat(values).st_blocks == 0               # sparse: nothing taken yet
    store.lookup_or_create(np.arange(5000, dtype=np.uint64), 3, 1, 0.1)
    reserved = store._space.reserved
    assert 5000 <= reserved and os.stat(values).st_blocks * 512 >= reserved * store.values.strides[0]
    assert store.evict_unseen(4) == 5000 and store._space.reserved == 0
    store.close()
