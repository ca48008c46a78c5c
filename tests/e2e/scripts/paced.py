"""Run a training script (``paced.py SCRIPT ARGS``) or module (``paced.py -m MODULE ARGS``) with every
``Trainer.step`` paced by PSTEST_STEP_DELAY seconds, so that a test can kill a rank at a chosen
point of the run. Nothing else differs."""
import os
import runpy
import sys
import time

import paramshard as ps

DELAY = float(os.environ.get("PSTEST_STEP_DELAY", "0"))
_step = ps.Trainer.step


def paced_step(self, loss=None):
    _step(self, loss)
    time.sleep(DELAY)


ps.Trainer.step = paced_step

if __name__ == "__main__":
    if sys.argv[1] == "-m":
        sys.argv = [sys.argv[2], *sys.argv[3:]]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[1:]
        runpy.run_path(sys.argv[0], run_name="__main__")
