"""The type checker holds an implementation to its contract (pyproject.toml [tool.mypy];
`make typecheck`): a class declared as a RowStore, Service or Engine with a wrong signature
or a missing member fails the check, the real ones pass."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api", reason="mypy is in the `test` extra (pip install -e '.[test]')")

ROOT = Path(__file__).parents[2]

SNIPPET = textwrap.dedent('''\
    from __future__ import annotations

    from typing import TYPE_CHECKING

    import numpy as np

    from paramshard.launch.engines.processes import Child
    from paramshard.server.storage.numpy_row_store import NumpyRowStore


    class LookupByList(NumpyRowStore):
        def lookup(self, ids: list[int]) -> list[int]:      # the contract takes and gives arrays
            return ids


    class NoOps:
        def hooks(self) -> list:
            return []


    class StopsOne:
        def start(self, rank) -> Child:
            raise NotImplementedError

        def stop(self, process: Child, grace: float) -> None:      # one process, no hurry
            pass


    if TYPE_CHECKING:
        from paramshard.launch.engines.process import Engine
        from paramshard.server.core.api import Service
        from paramshard.server.storage.row_store import RowStore
        _good: type[RowStore] = NumpyRowStore
        _row_store: type[RowStore] = LookupByList           # line 34
        _service: type[Service] = NoOps                     # line 35
        _engine: type[Engine[Child]] = StopsOne             # line 36
''')


# Under a second on the cache `make typecheck` leaves; about 15 s cold (it reads numpy's and torch's stubs).
@pytest.mark.slow
def test_the_checker_finds_a_broken_implementation(tmp_path):
    snippet = tmp_path / "broken_contracts.py"
    snippet.write_text(SNIPPET)
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"),
                                "--cache-dir", str(ROOT / ".mypy_cache"), str(snippet)])
    assert status == 1, out + err
    lines = {int(m.group(1)) for m in re.finditer(r"broken_contracts\.py:(\d+): error:", out)}
    # 12: the override itself; 34-36: each class against its contract (the real store passes, 33)
    assert lines == {12, 34, 35, 36}, out
    for cls, contract in (("LookupByList", "RowStore"), ("NoOps", "Service"), ("StopsOne", "Engine[Child]")):
        assert f'"type[{cls}]", variable has type "type[{contract}]"' in out, out
