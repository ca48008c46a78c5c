import sys

from paramshard.apps.ctr import run

sys.exit(run())
