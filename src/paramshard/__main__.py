import sys

from paramshard.cli.main import main

sys.exit(main())
