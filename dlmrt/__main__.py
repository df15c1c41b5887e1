import sys

from dlmrt.cli import main

sys.exit(main())
