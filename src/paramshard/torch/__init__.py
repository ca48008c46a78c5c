"""The old name of paramshard.trainer (the Trainer and SparseEmbedding), kept for one release.

``paramshard.torch`` held paramshard's Trainer, not PyTorch; the package is now
``paramshard.trainer``. ``import paramshard.torch`` and ``from paramshard.torch.trainer import
Trainer`` still work (the same module objects) and warn once.
"""
import importlib
import pkgutil
import sys
import warnings

import paramshard.trainer as _trainer

warnings.warn("paramshard.torch is now paramshard.trainer; the old name goes in the next release",
              DeprecationWarning, stacklevel=2)

# The same module objects under both names, so isinstance and monkeypatching agree.
for _info in pkgutil.walk_packages(_trainer.__path__, "paramshard.trainer."):
    _module = importlib.import_module(_info.name)
    sys.modules["paramshard.torch." + _info.name[len("paramshard.trainer."):]] = _module

from paramshard.trainer import *  # noqa: E402,F401,F403
