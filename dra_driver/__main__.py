"""`python -m dra_driver ...`: same as `vcuda dra-driver`."""

import sys

from dra_driver.cli import main

sys.exit(main())
