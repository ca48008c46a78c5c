"""The rule that ends a server nothing reaches (server/idle_watch.py), on a fake clock."""
from paramshard.server.idle_watch import MIN_DEFAULT_LIMIT, IdleWatch, default_limit


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_expires_once_the_limit_passed_since_start_with_nothing_arriving():
    clock = Clock()
    watch = IdleWatch(5.0, clock)
    clock.now += 4.9
    assert not watch.expired()
    clock.now += 0.1
    assert watch.expired()


def test_monitoring_does_not_keep_a_server_alive():
    clock = Clock()
    watch = IdleWatch(5.0, clock)
    for _ in range(10):
        clock.now += 1.0
        watch.note("stats", None)
        watch.note("routing_get", None)
    assert watch.expired() and watch.requests == 0


def test_a_job_request_restarts_the_count_and_a_trainer_ends_the_watch():
    clock = Clock()
    watch = IdleWatch(5.0, clock)
    clock.now += 4.0
    watch.note("migrate_expect", None)      # a launcher moving partitions to a server a scale added
    clock.now += 4.0
    assert not watch.expired()
    clock.now += 1.0
    assert watch.expired()
    watch.note("register_dense", 0)         # a trainer of the job arrived: its rules take over
    clock.now += 1e6
    assert not watch.expired()


def test_a_trainer_refused_for_now_still_counts_as_reached():
    # A restarted server refuses a trainer's push until the chief restores it: the request
    # is noted before the hooks refuse it, so the waiting server is not killed.
    clock = Clock()
    watch = IdleWatch(5.0, clock)
    watch.note("push_dense", 1)
    clock.now += 60.0
    assert not watch.expired()


def test_no_limit_never_expires():
    clock = Clock()
    watch = IdleWatch(None, clock)
    clock.now += 1e9
    assert not watch.expired()


def test_default_limit():
    assert default_limit(None, 300.0) == 300.0
    assert default_limit(None, 5.0) == MIN_DEFAULT_LIMIT      # a start under load is not a wait
    assert default_limit(2.5, 300.0) == 2.5
    assert default_limit(0.0, 300.0) is None                  # 0: wait for ever
