"""benchmarks/modes_shaped.py's time-to-AUC parts (no processes, no namespaces)."""
import math
from types import SimpleNamespace

import pytest

from tests.unit.benchmark_scripts import import_script

S = import_script("modes_shaped")


def curve(*points):
    return [{"seconds": s, "auc": a} for s, a in points]


def test_time_to_a_target_is_interpolated_between_the_points_around_the_first_crossing():
    c = curve((1.0, 0.70), (2.0, 0.74), (3.0, 0.76), (4.0, 0.75), (5.0, 0.78))
    assert S.time_to(c, 0.75) == pytest.approx(2.5)          # 0.74 at 2 s, 0.76 at 3 s
    assert S.time_to(c, 0.76) == pytest.approx(3.0)          # reached exactly at a point
    assert S.time_to(c, 0.70) == pytest.approx(1.0)          # the first point: its own time
    assert S.time_to(c, 0.79) == math.inf                    # never reached
    assert S.time_to([], 0.5) == math.inf


def test_the_target_is_syncs_median_last_held_out_auc_less_the_margin_unless_given():
    runs = {"100mbit": {"sync": [{"curve": curve((1, 0.70), (2, 0.770))}, {"curve": curve((2, 0.772))},
                                 {"error": "failed"}, {"curve": curve((2, 0.771))}],
                        "async": [{"curve": curve((2, 0.9))}]}}
    args = SimpleNamespace(target_auc=None, target_margin=0.002)
    assert S.target_of(args, runs, "100mbit") == pytest.approx(0.771 - 0.002)
    assert S.target_of(SimpleNamespace(target_auc=0.75, target_margin=0.002), runs, "100mbit") == 0.75
    assert S.target_of(args, {"1gbit": {"async": [{"curve": curve((1, 0.7))}]}}, "1gbit") is None


def test_the_median_time_counts_a_run_that_never_reached_the_target_as_infinite():
    ok = [{"curve": curve((1, 0.70), (2, 0.76))}, {"curve": curve((1, 0.70), (4, 0.76))},
          {"curve": curve((1, 0.70), (2, 0.71))}]
    assert S.reach(ok, 0.76) == "4.0 (2.0-inf), 2/3 runs"
    assert S.reach(ok[2:] + ok[2:] + ok[:1], 0.76) == "not reached (1/3 runs did)"
    assert S.reach(ok[:2], None) == "-"


def test_a_mode_spec_becomes_the_launch_flags_with_the_geo_send_third():
    assert S.mode_flags("sync") == ["--mode", "sync"]
    assert S.mode_flags("geo:auto") == ["--mode", "geo", "--geo-k", "auto"]
    assert S.mode_flags("geo:64:blocking") == ["--mode", "geo", "--geo-k", "64", "--geo-send", "blocking"]
