"""Compare a JSON document with the example of it in a doc (same keys, recursively)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


def doc_example(doc: Path, heading: str) -> Any:
    """The first ```json block after ``heading`` in ``doc``."""
    text = doc.read_text()
    start = text.index(heading)
    block = re.search(r"```json\n(.*?)\n```", text[start:], re.S)
    assert block is not None, heading
    return json.loads(block.group(1))


def same_shape(doc: Any, actual: Any, where: str = "", free: frozenset[str] = frozenset()) -> None:
    """Every object in ``actual`` has exactly the keys of the documented example (recursively;
    lists compare their first elements; null on either side compares with anything; objects
    named in ``free`` have data keys and are not compared)."""
    if doc is None or actual is None:
        return
    if isinstance(doc, dict):
        assert isinstance(actual, dict), where
        if where in free:
            return
        assert set(actual) == set(doc), (where, sorted(set(actual) ^ set(doc)))
        for k in doc:
            same_shape(doc[k], actual[k], f"{where}.{k}" if where else k, free)
    elif isinstance(doc, list):
        assert isinstance(actual, list), where
        if doc and actual:
            same_shape(doc[0], actual[0], f"{where}[]", free)
    else:
        assert type(actual) is type(doc) or {type(actual), type(doc)} <= {int, float}, where
