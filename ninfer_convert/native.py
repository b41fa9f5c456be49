"""The optional C modules (``_hostkernel``, ``_msekernel``, ``_gptqkernel``, ``_rowsplit``): the
module when the build compiled it, else ``None`` and the caller uses its numpy path, which
produces the same bytes.

Contract: :func:`optional_module` imports ``ninfer_convert.<name>``; a module that was not built
gives ``None``, unless ``NINFER_REQUIRE_NATIVE=1`` is set (CI sets it), where it is an
:class:`ImportError`, so that a failed build cannot pass the tests on the numpy fallback.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

__all__ = ["optional_module"]


def optional_module(name: str) -> Any:
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except ImportError as exc:  # pragma: no cover - depends on the build
        if os.environ.get("NINFER_REQUIRE_NATIVE") == "1":
            raise ImportError(
                f"NINFER_REQUIRE_NATIVE=1 but the C module {name} was not built"
            ) from exc
        return None
