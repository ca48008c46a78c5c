"""observe/run_records/counter_carry.py: a server restarted in place counts from 0 again; its records
keep job totals (oracle: the totals equal the sum of what each process counted)."""
from paramshard.observe.run_records.counter_carry import CounterCarry, carry_series


def _record(requests, uptime, staleness=None):
    return {"kind": "server", "server": 1, "requests": requests, "bytes_in": 10 * requests,
            "bytes_out": 20 * requests, "uptime_s": uptime, "staleness": staleness or {}}


def test_a_counter_that_goes_down_is_a_restart_and_the_totals_go_on_from_there():
    # process 1 served 100 then 250 requests; process 2 (restarted) 30 then 90
    carried = carry_series([_record(100, 5, {"0": 4}), _record(250, 7, {"0": 9, "1": 1}),
                            _record(30, 1, {"0": 2}), _record(90, 3, {"0": 5})])
    assert [r["requests"] for r in carried] == [100, 250, 250 + 30, 250 + 90]
    assert [r["bytes_in"] for r in carried] == [1000, 2500, 2800, 3400]
    assert [r["restarts"] for r in carried] == [0, 0, 1, 1]
    assert carried[-1]["staleness"] == {"0": 9 + 5, "1": 1}
    totals = [r["requests"] for r in carried]
    assert totals == sorted(totals)                 # job totals never go down


def test_a_new_process_that_already_served_more_is_caught_by_its_uptime():
    carry = CounterCarry()
    carry.carry(_record(10, 60))
    record, restarted = carry.carry(_record(40, 2))      # more requests, but up 2 s: a new process
    assert restarted and record["requests"] == 50 and record["restarts"] == 1


def test_two_readers_seeing_one_process_a_moment_apart_are_no_restart():
    """The launcher's live read and the server's own last record (from its cached snapshot) at
    the same moment: uptime 5.561 then 5.538, more requests. Seen in a fresh clone's run, where
    it counted a second restart."""
    carry = CounterCarry()
    carry.carry({**_record(135, 5.561), "t": 100.0})
    record, restarted = carry.carry({**_record(230, 5.538), "t": 100.004})
    assert not restarted and record["requests"] == 230 and record["restarts"] == 0
    # a process that did start after the previous record is one, even with more requests
    record, restarted = carry.carry({**_record(400, 2.0), "t": 103.0})
    assert restarted and record["requests"] == 230 + 400 and record["restarts"] == 1


def test_the_process_start_tells_a_new_process_that_counters_and_uptime_miss():
    """Seen in CI (stop 40): the old server's first record was taken 1 s after its start (3
    requests); killed, restarted in place, its first record came 2.5 s after the new start with 41
    requests. More requests and a longer uptime: the old rules saw one process."""
    carry = CounterCarry()
    carry.carry({**_record(3, 1.0), "t": 101.0, "started_at": 100.0})
    record, restarted = carry.carry({**_record(41, 2.5), "t": 106.5, "started_at": 104.0})
    assert restarted and record["requests"] == 44 and record["restarts"] == 1
    # the same process read by two readers with uptimes out of order: no restart
    record, restarted = carry.carry({**_record(50, 3.1), "t": 107.1, "started_at": 104.0})
    record, restarted = carry.carry({**_record(52, 3.0), "t": 107.2, "started_at": 104.0})
    assert not restarted and record["requests"] == 3 + 52 and record["restarts"] == 1


def test_carried_records_are_left_as_they_are():
    once = carry_series([_record(100, 5), _record(30, 1)])
    assert carry_series(once) == once               # the report's pass after the launcher's


def test_the_imbalance_is_from_totals_that_survive_the_reset():
    # two servers that served the same: server 1 restarted halfway through
    steady = carry_series([_record(500, 10), _record(1000, 20)])
    restarted = carry_series([_record(500, 10), _record(300, 6)])
    # the old code compared 1000 with 300: a false max/mean of 1000 / 650 = 1.54
    loads = [steady[-1]["requests"], restarted[-1]["requests"]]
    assert max(loads) / (sum(loads) / 2) < 1.13       # 1000 vs 800: the real imbalance
