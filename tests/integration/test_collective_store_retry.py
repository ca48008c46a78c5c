"""collective/group.py's wait for trainer 0's store: it waits out a deadline (wall time, not
CPU), so it is not a unit item; in process, no second process."""
import datetime
import time
import types

import pytest

from paramshard.collective.group import CollectiveError, _store
from paramshard.launch.engines.ports import free_ports


def test_a_store_not_reachable_yet_is_retried_until_the_timeout():
    """On Kubernetes trainer 1 may start before trainer 0's store (or its DNS record) exists: it
    retries up to PARAMSHARD_TIMEOUT instead of dying of the first failed connection, then names
    the store. Nothing listens on the port here (no DNS lookup: the tests send nothing off loopback)."""
    addr = f"127.0.0.1:{free_ports(1)[0]}"
    started = time.monotonic()
    with pytest.raises(CollectiveError) as caught:
        _store(types.SimpleNamespace(trainer_id=1, num_trainers=2), addr, datetime.timedelta(seconds=0.2))
    assert time.monotonic() - started >= 0.2                       # retried, not failed at once
    message = str(caught.value)
    assert f"trainer 1 could not reach the trainers' store at {addr} (hosted by trainer 0) within 0.2 s" in message
    assert "did trainer 0 start?" in message
