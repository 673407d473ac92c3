"""Only the optional C helper lives here; everything else is in pyproject.toml.

One extension module, ``dblp._fastpath``, built from the purpose-named files
in dblp/_fastpath_c/ (their list: dblp/_fastpath_c/common.h); its typed
surface is dblp/_fastpath.pyi. The folder is not named ``_fastpath``: a
folder of that name would import as an empty namespace package wherever the
extension is not built, and ``import dblp._fastpath`` would then succeed.

``optional=True``: without a C compiler the install still succeeds and
dblp/protocol/wire.py, dblp/transport/udp.py and dblp/protocol/reduce.py run their numpy / crc32c paths
(same bytes, slower). With a compiler a failed build is a failed test:
tests/test_fastpath.py::test_helper_builds_where_a_compiler_is.
"""

from pathlib import Path

from setuptools import Extension, setup

SRC = Path("dblp/_fastpath_c")


def _ipsec_mb() -> bool:
    """Intel's ipsec-mb (``libipsec-mb-dev``) installed: mac.c then computes the datagram tags with it
    (4x faster than OpenSSL 3.0's GCM on AVX-512 CPUs); without it, OpenSSL's GCM (same bytes)."""
    return any(Path(d, "intel-ipsec-mb.h").exists() for d in ("/usr/include", "/usr/local/include"))


IPSEC_MB = _ipsec_mb()

setup(
    ext_modules=[
        Extension(
            "dblp._fastpath",
            sorted(str(p) for p in SRC.glob("*.c")),
            depends=sorted(str(p) for p in SRC.glob("*.h")),
            optional=True,
            extra_compile_args=["-O3", "-pthread", "-ffp-contract=off"],  # fluid.c: numpy's doubles, no fused multiply-add
            extra_link_args=["-pthread"],
            # GMAC of the authenticated datagram (mac.c): OpenSSL's GCM, and ipsec-mb's where installed
            libraries=["crypto"] + (["IPSec_MB"] if IPSEC_MB else []),
            define_macros=[("DBLP_IPSEC_MB", "1")] if IPSEC_MB else [],
        ),
    ]
)
