"""settings/argtypes.trainers and cli/launch's split of MIN:MAX into the two settings."""
import argparse

import pytest

from paramshard.cli.jobs.launch import _split_trainer_range
from paramshard.errors import ConfigError
from paramshard.settings.argtypes import trainers


def test_a_count_or_a_range():
    assert trainers("4") == 4 and trainers("2:4") == (2, 4) and trainers("3:3") == (3, 3)
    for bad, why in (("x", "not a whole number"), ("2:x", "not a whole number"), ("3:2", "1 <= MIN <= MAX"),
                     ("0:2", "1 <= MIN <= MAX")):
        with pytest.raises(argparse.ArgumentError, match=why):
            trainers(bad)


def test_the_range_becomes_max_trainers_and_their_minimum():
    fields = {"trainers": (2, 4)}
    _split_trainer_range(fields)
    assert fields == {"trainers": 4, "min_trainers": 2}
    plain = {"trainers": 3, "min_trainers": 2}
    _split_trainer_range(plain)
    assert plain == {"trainers": 3, "min_trainers": 2}
    with pytest.raises(ConfigError, match="give the minimum once"):
        _split_trainer_range({"trainers": (2, 4), "min_trainers": 3})
