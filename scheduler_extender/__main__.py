"""`python -m scheduler_extender --listen :8888` (same flags as `vcuda extender`)."""

import sys

from .cli import main

sys.exit(main())
