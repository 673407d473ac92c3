import sys

from dblp.sim.cli import main

sys.exit(main())
