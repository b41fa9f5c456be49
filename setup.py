"""Build the optional C host kernel (everything else is configured in pyproject.toml).

The kernel is an accelerator, not a requirement: without a C compiler the build skips it
(``optional=True``) and the converter uses the numpy encoder, which is bit-identical.
``-ffp-contract=off`` and the absence of ``-ffast-math`` keep every float operation a single
IEEE round-to-nearest-even operation (see ninfer_convert/_hostkernel.c).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ninfer_convert._hostkernel",
            ["ninfer_convert/_hostkernel.c"],
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-fast-math", "-std=c99"],
            optional=True,
        ),
        # Statistics only (never a code, a scale or a check): fast-math lets the sums vectorise.
        Extension(
            "ninfer_convert._hoststats",
            ["ninfer_convert/_hoststats.c"],
            extra_compile_args=["-O3", "-ffast-math", "-std=c99"],
            optional=True,
        ),
    ]
)
