"""The package version: the one place it is written.

pyproject.toml reads it from here (``[tool.setuptools.dynamic]``); ``ninfer_convert.__version__``,
the CLI's ``--version``, the producer field of every header and the model card import it from
here, so no module depends on the order of statements in ``__init__.py``.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
