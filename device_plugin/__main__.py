"""`python -m device_plugin --mode vgpu ...`: same as `vcuda device-plugin`."""

import sys

from device_plugin.cli import main

sys.exit(main())
