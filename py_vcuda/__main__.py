import sys

from py_vcuda.cli import main

sys.exit(main())
