"""The CTR app (``-m paramshard.apps.ctr``) with every step paced (PSTEST_STEP_DELAY seconds), so
that a test can kill a rank at a chosen point of the run. Nothing else differs."""
import os
import sys
import time

import paramshard as ps
from paramshard.apps import ctr

DELAY = float(os.environ.get("PSTEST_STEP_DELAY", "0"))
_step = ps.Trainer.step


def paced_step(self, loss=None):
    _step(self, loss)
    time.sleep(DELAY)


ps.Trainer.step = paced_step

if __name__ == "__main__":
    sys.exit(ctr.run())
