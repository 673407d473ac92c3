import os
import sys

# One BLAS thread: the server's only BLAS call is the norm of the mean, and
# idle OpenBLAS threads spin on the cores the transport needs.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from dblp.cli.commands import main  # noqa: E402

sys.exit(main())
