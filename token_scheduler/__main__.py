"""`python -m token_scheduler --gpu 0 --dir DIR`: same as `vcuda scheduler`."""

import sys

from .cli import main

sys.exit(main())
