"""Row arrays sized to what a table holds (server/storage/kernels/arena.py): growth keeps every row and
every handle, an array held across a growth never dangles, and the address-space limit
(RLIMIT_AS) refuses a growth by name before anything changes."""
import ctypes
import gc
import re

import numpy as np
import pytest

from paramshard.errors import ConfigError, OutOfAddressSpace
from paramshard.optim import SGD, Adagrad
from paramshard.server.storage.compiled_row_store import CompiledRowStore
from paramshard.server.storage.kernels import arena
from paramshard.update_rules import make_rule

MAP_FIXED_NOREPLACE = 0x100000


def _block_after(array: np.ndarray) -> int | None:
    """Map a page right after ``array``'s mapping, so it cannot grow in place; its address (None:
    something is mapped there already, as mappings made top-down usually find)."""
    span = arena._span(array)
    end = span[0] + span[1]
    if _mapped(end):
        return None
    got = arena._libc.mmap(end, arena.PAGE, 0, arena._ANON | MAP_FIXED_NOREPLACE, -1, 0)
    assert got == end, "could not map the page after the array"
    return end


def _unblock(blocker: int | None) -> None:
    if blocker is not None:
        arena._libc.munmap(blocker, arena.PAGE)


def _mapped(address: int) -> bool:
    with open("/proc/self/maps") as f:
        for line in f:
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if start <= address < end:
                return True
    return False


def _store(dim=8, rule=SGD(lr=1.0), max_rows=1 << 30, capacity=16, admissions=False) -> CompiledRowStore:
    store = CompiledRowStore(dim, make_rule(rule), keep_last_seen=True, count_admissions=admissions,
                             max_rows=max_rows, capacity=capacity)
    store.label = "table 'emb'"
    return store


def test_rows_written_before_a_growth_read_back_the_same_after_it():
    a = arena.reserve(1000, (16,), np.float32)
    a[:] = np.arange(16000, dtype=np.float32).reshape(1000, 16)
    b = arena.grow(a, 5000, 1000)
    assert b.shape == (5000, 16)
    np.testing.assert_array_equal(b[:1000], np.arange(16000, dtype=np.float32).reshape(1000, 16))
    assert not b[1000:].any()


def test_a_mapping_that_cannot_grow_in_place_moves_its_pages_and_an_array_held_across_reads_zeros():
    a = arena.reserve(1 << 16, (4,), np.float32)        # 1 MiB
    a[:] = 7.0
    old = a.ctypes.data
    blocker = _block_after(a)
    try:
        b = arena.grow(a, 1 << 18, 1 << 16)
        assert b.ctypes.data != old
        assert (b[:1 << 16] == 7.0).all() and not b[1 << 16:].any()
        # The old range stays mapped while an array over it lives: it reads zeros, never segfaults.
        assert _mapped(old) and not a.any()
        del a
        gc.collect()
        assert not _mapped(old), "the old range outlived the last array over it"
        assert (b[:1 << 16] == 7.0).all()
    finally:
        _unblock(blocker)


def test_without_dontunmap_the_rows_are_copied_and_a_held_array_keeps_its_own(monkeypatch):
    monkeypatch.setattr(arena, "_dontunmap", [False])
    a = arena.reserve(1 << 16, (4,), np.float32)
    a[:] = 3.0
    blocker = _block_after(a)
    try:
        b = arena.grow(a, 1 << 17, 1 << 16)
        assert (b[:1 << 16] == 3.0).all() and (a == 3.0).all()
    finally:
        _unblock(blocker)


def test_handles_and_rows_stay_the_same_through_many_growths():
    store = _store(dim=8)
    rng = np.random.default_rng(1)
    first = np.unique(rng.integers(1, 2**63, 500, dtype=np.uint64))
    handles = store.lookup_or_create(first, 0, seed=3, init_scale=0.1)
    store.update(handles, rng.standard_normal((len(first), 8)).astype(np.float32), 1.0)
    rows = store.gather(handles)
    starts = set()
    for _ in range(12):           # 16 rows of room to start with: grown about 13 times
        starts.add(store.values.ctypes.data)
        store.lookup_or_create(np.unique(rng.integers(1, 2**63, 4000, dtype=np.uint64)), 0, seed=3, init_scale=0.1)
    assert store.num_rows > 40_000 and len(store.values) < 4 * store.num_rows
    np.testing.assert_array_equal(store.lookup(first), handles)
    np.testing.assert_array_equal(store.gather(handles), rows)
    np.testing.assert_array_equal(store.ids(0, len(first)), first[np.argsort(handles)])


def test_a_table_maps_what_it_holds_not_its_row_limit():
    """The original store mapped its whole row limit: 545 GB for a dim-64 Adagrad table."""
    before = arena.mapped_bytes()
    stores = [_store(dim=64, rule=Adagrad(lr=0.1), admissions=True) for _ in range(20)]
    # Six arrays of one huge page each (2 MiB: arena._pages) and a small index, a table.
    assert arena.mapped_bytes() - before < 20 * (16 << 20), [len(s.values) for s in stores]


def test_admission_counters_grow_and_keep_their_counts():
    store = _store(admissions=True)
    ids = np.arange(1, 5001, dtype=np.uint64)
    store.count(ids)
    assert (store.count(ids[:100]) == 2).all() and (store.count(ids[100:]) == 2).all()
    assert len(store.count_keys) >= 5000


def test_a_reserve_past_the_address_space_limit_is_refused_naming_the_table_and_changes_nothing(monkeypatch):
    store = _store(dim=64)
    handles = store.lookup_or_create(np.arange(1, 101, dtype=np.uint64), 0, seed=3, init_scale=0.1)
    rows, room = store.gather(handles), len(store.values)
    monkeypatch.setattr(arena, "address_space_limit", lambda: arena.mapped_bytes() + arena.HEADROOM + (64 << 20))
    with pytest.raises(OutOfAddressSpace) as refused:
        store.reserve(10_000_000)            # 10M x (8 + 256 + 4) bytes: 2.5 GiB
    message = str(refused.value)
    assert isinstance(refused.value, ConfigError) and isinstance(refused.value, MemoryError)
    assert re.match(r"table 'emb': 10000000 rows need 2\.\d GiB more address space", message), message
    assert "limit" in message and "RLIMIT_AS" in message, message
    assert len(store.values) == room and store.num_rows == 100
    np.testing.assert_array_equal(store.gather(handles), rows)
    store.reserve(10_000)                    # 2.6 MiB: fits
    assert len(store.values) >= 10_000


def test_a_growth_past_the_limit_refuses_the_request_whole_and_the_store_goes_on(monkeypatch):
    store = _store(dim=64)
    made = store.lookup_or_create(np.arange(1, 1001, dtype=np.uint64), 0, seed=3, init_scale=0.1)
    rows = store.gather(made)
    monkeypatch.setattr(arena, "address_space_limit", lambda: arena.mapped_bytes() + arena.HEADROOM + (1 << 20))
    new = np.arange(10_001, 30_001, dtype=np.uint64)      # 20,000 rows of 268 bytes: 5 MiB
    with pytest.raises(OutOfAddressSpace, match="table 'emb': .* rows need"):
        store.lookup_or_create(new, 0, seed=3, init_scale=0.1)
    assert store.num_rows == 1000 and (store.lookup(new) == -1).all()
    np.testing.assert_array_equal(store.gather(store.lookup(np.arange(1, 1001, dtype=np.uint64))), rows)
    monkeypatch.undo()
    store.lookup_or_create(new, 0, seed=3, init_scale=0.1)
    assert store.num_rows == 21_000


def test_an_address_space_error_reads_whole_without_a_limit():
    exc = OutOfAddressSpace("table 't'", 5, 1 << 30, None, 1 << 30, arena.HEADROOM, "Cannot allocate memory")
    assert "no limit" in str(exc) and "Cannot allocate memory" in str(exc)


def test_regions_are_huge_page_aligned_when_large():
    a = arena.reserve(1 << 18, (4,), np.float32)      # 4 MiB
    assert a.ctypes.data % arena.HUGE == 0
    assert ctypes.sizeof(arena._holder(a)) == 4 << 20


def test_paging_ahead_the_next_buckets_past_the_limit_does_not_fail_the_rows_already_made(monkeypatch):
    """``prepare`` runs after a request's rows were made: it skips paging ahead instead of raising."""
    store = _store(dim=4)
    store.reserve(300_000)          # rows and 524,288 buckets: no growth below
    store.lookup_or_create(np.arange(1, 260_001, dtype=np.uint64), 0, seed=3, init_scale=0.1)
    assert store.index.spare is None
    monkeypatch.setattr(arena, "address_space_limit", lambda: arena.mapped_bytes() + arena.HEADROOM + (1 << 20))
    # Past load 0.5 (262,144 ids) the next growth's buckets (8 MiB) would be paged in now.
    made = store.lookup_or_create(np.arange(260_001, 270_001, dtype=np.uint64), 0, seed=3, init_scale=0.1)
    assert store.num_rows == 270_000 and (made >= 260_000).all() and store.index.spare is None
