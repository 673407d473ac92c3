"""``python -m emulation.hosts``."""

import sys

from .cli import main

sys.exit(main())
