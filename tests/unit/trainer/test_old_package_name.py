"""``paramshard.torch`` (the Trainer's package before issue 31) still imports for one release,
as the same module objects as ``paramshard.trainer``, and says it is going."""
import importlib
import sys

import pytest


def test_the_old_package_name_is_the_new_package_with_a_warning():
    for name in [m for m in sys.modules if m == "paramshard.torch" or m.startswith("paramshard.torch.")]:
        del sys.modules[name]
    with pytest.warns(DeprecationWarning, match="paramshard.trainer"):
        old = importlib.import_module("paramshard.torch")
    from paramshard.trainer.trainer import Trainer
    from paramshard.trainer.backends.base import TrainerBackend
    assert old.Trainer is Trainer
    assert importlib.import_module("paramshard.torch.trainer").Trainer is Trainer
    assert importlib.import_module("paramshard.torch.backends.base").TrainerBackend is TrainerBackend
