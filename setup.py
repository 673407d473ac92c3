"""Only the optional C helper lives here; everything else is in pyproject.toml.

``optional=True``: without a C compiler the install still succeeds and
dblp/wire.py uses the crc32c package instead (same CRC values, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("dblp._fastpath", ["dblp/_fastpath.c"], optional=True,
                  extra_compile_args=["-O3", "-pthread"], extra_link_args=["-pthread"]),
    ]
)
