"""The rule that ends a server nothing reaches (server/core/idle_watch.py), on a fake clock."""
from paramshard.server.core.idle_watch import MIN_DEFAULT_LIMIT, IdleWatch, default_limit


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
        watch.note("stats")
        watch.note("routing_get")
    assert watch.expired() and watch.probes == 0


def test_a_hello_starts_the_count_again():
    clock = Clock()
    watch = IdleWatch(5.0, clock)
    clock.now += 4.0
    watch.note("hello")                 # a launcher checking the server is up, its trainers still starting
    clock.now += 4.0
    assert not watch.expired()
    clock.now += 1.0
    assert watch.expired() and watch.probes == 1


def test_a_request_of_the_job_ends_the_watch():
    # A trainer's (even one refused for now, a restarted server waiting for its restore), a
    # launcher moving partitions to a server a scale added, a replica keeper's read.
    for op in ("register_dense", "push_dense", "migrate_expect", "restore_sparse", "replica_delta"):
        clock = Clock()
        watch = IdleWatch(5.0, clock)
        clock.now += 4.0
        watch.note(op)
        clock.now += 1e6
        assert not watch.expired(), op


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
