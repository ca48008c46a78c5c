"""The xdist group of each item where the running pytest reads it (tests/conftest.py registers it)."""
import pytest


class XdistGroups:
    """`--dist loadgroup` schedules by node id: pytest-xdist 3.8 names an item's group by a suffix
    (``nodeid@group``) it writes to ``item._nodeid``; pytest 9 keeps the node id in ``item._id``,
    so the suffix was lost and every group spread over both workers as under plain `load` (the
    engine tests on both at once, each module fixture made by both). Set it where this pytest
    reads it, after xdist's own hook, when that hook's did not take."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        if not getattr(config.option, "loadgroup", False):      # an xdist worker under loadgroup
            return
        for item in items:
            names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                            for m in item.iter_markers("xdist_group")})
            if not names or "@" in item.nodeid.rsplit("]", 1)[-1]:
                continue
            nodeid = f"{item.nodeid}@{'_'.join(names)}"
            if hasattr(item, "_id"):
                item._id = type(item._id).parse(nodeid)
            else:
                item._nodeid = nodeid
