"""PARAMSHARD_ROW_STORE (server/storage/row_stores.py): which store a server's tables use."""
import pytest

from paramshard.errors import ConfigError
from paramshard.optim import SGD
from paramshard.server.core.barrier import Membership
from paramshard.server.storage.compiled_row_store import CompiledRowStore
from paramshard.server.storage.numpy_row_store import NumpyRowStore
from paramshard.server.storage.row_stores import configured_store
from paramshard.server.services.sparse_service import SparseService
from paramshard.update_rules import make_rule


@pytest.mark.parametrize("value, kind", [(None, CompiledRowStore), ("compiled", CompiledRowStore),
                                         ("numpy", NumpyRowStore), (" NumPy ", NumpyRowStore)])
def test_the_variable_names_the_store(value, kind):
    environ = {} if value is None else {"PARAMSHARD_ROW_STORE": value}
    store = configured_store(environ)(4, make_rule(SGD()), keep_last_seen=False, count_admissions=False,
                                      max_rows=1000, capacity=16)
    assert type(store) is kind


def test_an_unknown_store_is_refused_naming_the_variable_and_the_choices():
    with pytest.raises(ConfigError, match="PARAMSHARD_ROW_STORE='fast'.*compiled, numpy"):
        configured_store({"PARAMSHARD_ROW_STORE": "fast"})


def test_a_server_refuses_it_when_it_starts_not_at_the_first_table(monkeypatch):
    monkeypatch.setenv("PARAMSHARD_ROW_STORE", "fast")
    with pytest.raises(ConfigError, match="PARAMSHARD_ROW_STORE"):
        SparseService("async", Membership(1, grace=5.0))


def test_the_launcher_passes_its_own_value_on_and_has_a_flag(monkeypatch):
    """A contract setting: `PARAMSHARD_ROW_STORE=numpy paramshard launch ...` and `launch
    --row-store numpy` both reach the servers (a process variable would be dropped by the
    launcher, which passes no PARAMSHARD_* of its own environment but the contract's)."""
    from paramshard.env import ClusterEnv
    from paramshard.settings.contract import CONTRACT
    setting = next(s for s in CONTRACT if s.env == "PARAMSHARD_ROW_STORE")
    assert setting.inherit and setting.flag_for("launch").name == "--row-store"
    env = ClusterEnv.from_environ({"PARAMSHARD_ROLE": "server", "PARAMSHARD_SERVERS": "127.0.0.1:1",
                                   "PARAMSHARD_SERVER_ID": "0", "PARAMSHARD_ROW_STORE": "numpy"})
    assert env.row_store == "numpy" and env.to_environ()["PARAMSHARD_ROW_STORE"] == "numpy"
    with pytest.raises(ConfigError, match="PARAMSHARD_ROW_STORE='fast'"):
        ClusterEnv.from_environ({"PARAMSHARD_ROLE": "server", "PARAMSHARD_SERVERS": "127.0.0.1:1",
                                 "PARAMSHARD_SERVER_ID": "0", "PARAMSHARD_ROW_STORE": "fast"})
