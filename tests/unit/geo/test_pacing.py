"""The pacer of an overlapped GEO round's pieces (geo/pacing.py): a piece back within half a step
doubles the next, one that took over a step halves it, and a round is never cut in more pieces
than half its next k."""
import math

from paramshard.geo.pacing import MAX_ROWS, MIN_ROWS, START_ROWS, Pacer


def stepped(pacer: Pacer, seconds: float, steps: int = 3) -> Pacer:
    now = 0.0
    for _ in range(steps):
        pacer.boundary(now)
        now += seconds
    return pacer


def test_a_fast_piece_doubles_the_next_and_a_slow_one_halves_it():
    pacer = stepped(Pacer(), 0.04)
    assert math.isclose(pacer.step_seconds, 0.04)
    pacer.answered(0.015)
    assert pacer.rows == 2 * START_ROWS
    pacer.answered(0.03)                 # between half a step and a step: kept
    assert pacer.rows == 2 * START_ROWS
    pacer.answered(0.05)
    assert pacer.rows == START_ROWS


def test_nothing_is_learned_before_a_step_was_timed_and_the_rows_stay_in_their_limits():
    pacer = Pacer()
    pacer.answered(0.001)
    assert pacer.rows == START_ROWS      # no step measured yet
    pacer = stepped(Pacer(rows=MIN_ROWS), 0.04)
    pacer.answered(10.0)
    assert pacer.rows == MIN_ROWS
    pacer = stepped(Pacer(rows=MAX_ROWS), 0.04)
    pacer.answered(0.0)
    assert pacer.rows == MAX_ROWS
    pacer.answered(math.nan)
    assert pacer.rows == MAX_ROWS


def test_a_pause_is_no_step():
    pacer = Pacer()
    pacer.boundary(0.0)
    pacer.paused(100.0)
    pacer.boundary(100.04)
    assert math.isclose(pacer.step_seconds, 0.04)


def test_a_round_goes_in_at_most_half_its_next_k_pieces():
    pacer = Pacer(rows=10)
    assert pacer.piece_rows(100_000, 64) == 3125          # 32 pieces: its merge lands half a round later
    assert pacer.piece_rows(100, 64) == 10               # the pacer's rows when they cut it finer
    assert pacer.piece_rows(100, 1) == 100               # k = 1: the whole round in one piece
    assert pacer.piece_rows(0, 8) == 10
