"""benchmarks/elastic_sync.py and its job's pure parts: the oracle of the accumulators, the
comparison with the servers' rows, the stop step, the summary of the moves (no processes)."""
import numpy as np
import pytest

from tests.unit.benchmark_scripts import import_script

S = import_script("elastic_sync")
J = import_script("elastic_sync_job")


def test_batches_are_the_same_in_every_process_and_distinct():
    picks, grads = J.batch(5, 1, 7, 1000, 64, 4)
    again, grads_again = J.batch(5, 1, 7, 1000, 64, 4)
    assert np.array_equal(picks, again) and np.array_equal(grads, grads_again)
    assert len(np.unique(picks)) == 64 and grads.dtype == np.float32 and np.abs(grads).max() <= J.GRAD
    assert np.array_equal(grads, np.round(grads))
    assert not np.array_equal(picks, J.batch(5, 0, 7, 1000, 64, 4)[0])      # trainers differ


def test_the_oracle_is_a_sync_adagrad_step_by_step():
    """Each step adds the square of the trainers' summed gradient over T (ids both touched included)."""
    seed, trainers, steps, hot, size, dim = 3, 2, 6, 40, 25, 3       # 25 of 40: the trainers overlap
    want = np.zeros((hot, dim))
    for k in range(steps):
        g = np.zeros((hot, dim))
        for t in range(trainers):
            picks, grads = J.batch(seed, t, k, hot, size, dim)
            g[picks] += grads
        want += (g / trainers) ** 2
    got = J.expected_accumulators(seed, trainers, steps, hot, size, dim)
    assert np.array_equal(got, want) and got.max() > 0


def test_compare_counts_each_kind_of_wrong_row():
    rows, dim = 20, 2
    hot = np.array([3, 7, 11])
    want = np.array([[0.25, 1.0], [2.25, 0.0], [4.0, 0.5]])
    ids = np.arange(rows)
    acc = np.zeros((rows, dim), np.float32)
    acc[hot] = want
    clean = J.compare(ids[::-1].copy(), acc[::-1].copy(), hot, want, rows)       # any order
    assert clean == {"rows_held": 20, "ids_held_twice": 0, "ids_missing": 0, "ids_foreign": 0, "hot_rows_wrong": 0,
                     "cold_rows_touched": 0, "hot_rows": 3}
    acc[7, 1] = 0.25            # an update too many on a hot row
    acc[5, 0] = 1.0             # a row no batch touched
    ids2 = np.concatenate([np.delete(ids, 11), [4, 99]])      # hot id 11 gone, 4 held twice, a stranger
    acc2 = np.concatenate([np.delete(acc, 11, axis=0), np.zeros((2, dim), np.float32)])
    bad = J.compare(ids2, acc2, hot, want, rows)
    assert bad == {"rows_held": 21, "ids_held_twice": 1, "ids_missing": 1, "ids_foreign": 1, "hot_rows_wrong": 2,
                   "cold_rows_touched": 1, "hot_rows": 3}
    assert S.check_problems(clean, 20) == [] and len(S.check_problems(bad, 20)) == 6


def test_stop_step_leaves_time_for_both_trainers_to_read_it():
    records = [{"kind": "trainer", "trainer": t, "t": 100.0 + s / 10, "step": 10 * s} for s in range(50)
               for t in range(2)]
    assert S.stop_at(records, 5.0) == 490 + 500          # 100 steps a second, 5 s of them
    assert S.stop_at(records[:2], 5.0) == 0 + 200         # no rate yet: the least margin
    with pytest.raises(RuntimeError, match="not training"):
        S.stop_at([{"event": "scale_end", "t": 1.0}], 5.0)


def test_moves_are_summarized_by_direction_max_and_median():
    moves = [{"move": "2->3", "seconds": 4.0, "longest_step": 0.5}, {"move": "3->2", "seconds": 1.0, "longest_step": None},
             {"move": "2->3", "seconds": 6.0, "longest_step": 1.5}, {"move": "3->2", "seconds": 2.0, "longest_step": 0.2},
             {"move": "2->3", "seconds": 11.0, "longest_step": 0.1}]
    assert S.summarize(moves) == [("2->3", 11.0, 6.0, 1.5, 0.5), ("3->2", 2.0, 1.5, 0.2, 0.2),
                                  ("all", 11.0, 4.0, 1.5, 0.35)]
    events = [{"event": "scale_start", "t": 1.0}, {"event": "scale_end", "t": 5.0, "seconds": 2.0,
                                                   "servers_before": [0, 1], "servers_after": [0, 1, 2]},
              {"event": "scale_end", "t": 6.0}]          # no seconds: elastic_view.moves skips it too
    assert [S.direction(e) for e in S.move_events(events)] == ["2->3"]
    windows = [(0, 1.0, 2.0, 0.3), (1, 1.5, 4.0, 0.9), (0, 2.0, 3.0, 0.2)]
    assert S.baseline_step(windows, 1.0, 3.0) == 0.3 and S.baseline_step(windows, 5.0, 6.0) is None


def test_a_wrong_row_is_shown_with_the_steps_that_touched_it():
    seed, steps, hot_n, size, dim, first = 0, 5, 100, 20, 4, 10
    hot = J.hot_ids(1000, hot_n, seed)
    want = J.expected_accumulators(seed, 2, steps, hot_n, size, dim)
    acc = want.astype(np.float32)
    acc[3, 1] += 0.25
    (shown,) = J.wrong_examples(hot.copy(), acc, hot, want, seed, 2, steps, size, first)
    touched = [first + k for k in range(steps) if any(3 in J.batch(seed, t, k, hot_n, size, dim)[0] for t in range(2))]
    assert shown == {"id": int(hot[3]), "got_minus_want": [0.0, 0.25, 0.0, 0.0], "steps": touched}
