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
        )
    ]
)
