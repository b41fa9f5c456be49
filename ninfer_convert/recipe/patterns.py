"""Tensor-name patterns and derive templates of the recipe language.

Contract:

* A *pattern* is one of three kinds, told apart by its spelling alone:
  ``re:<regex>`` is a Python regular expression that must match the **whole** name
  (``re.fullmatch``); a string containing ``*``, ``?`` or ``[`` is a case-sensitive glob
  (``fnmatch`` rules: ``*`` matches any run of characters, dots included); anything else is an
  exact tensor name.
* A *template* (used by ``derive`` rules) is literal text with ``{var}`` placeholders; each
  placeholder matches one or more characters other than ``.`` (one name component, such as a
  layer index).  Literal text is matched exactly (no glob or regex meaning).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["NamePattern", "NameTemplate", "compile_pattern", "compile_template"]

PatternKind = Literal["exact", "glob", "regex"]


@dataclass(frozen=True)
class NamePattern:
    text: str
    kind: PatternKind
    regex: re.Pattern[str]

    def matches(self, name: str) -> bool:
        return self.regex.fullmatch(name) is not None


def compile_pattern(text: str) -> NamePattern:
    """Compile a rule pattern; raise ValueError with a readable reason when it is invalid."""
    if not text:
        raise ValueError("the pattern is empty")
    if text.startswith("re:"):
        body = text[3:]
        if not body:
            raise ValueError("the regular expression after 're:' is empty")
        try:
            return NamePattern(text, "regex", re.compile(body))
        except re.error as exc:
            raise ValueError(f"invalid regular expression {body!r}: {exc}") from exc
    if any(c in text for c in "*?["):
        return NamePattern(text, "glob", re.compile(fnmatch.translate(text)))
    return NamePattern(text, "exact", re.compile(re.escape(text)))


_VAR = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class NameTemplate:
    text: str
    variables: frozenset[str]
    regex: re.Pattern[str]

    def match(self, name: str) -> dict[str, str] | None:
        m = self.regex.fullmatch(name)
        return None if m is None else dict(m.groupdict())

    def format(self, binding: dict[str, str]) -> str:
        return _VAR.sub(lambda m: binding[m.group(1)], self.text)


def compile_template(text: str) -> NameTemplate:
    """Compile a derive template; raise ValueError when it is malformed."""
    if not text:
        raise ValueError("the template is empty")
    parts: list[str] = []
    names: list[str] = []
    pos = 0
    for m in _VAR.finditer(text):
        literal = text[pos : m.start()]
        if "{" in literal or "}" in literal:
            raise ValueError(f"malformed placeholder in {text!r}; use {{name}}")
        parts.append(re.escape(literal))
        var = m.group(1)
        if var in names:
            parts.append(f"(?P={var})")
        else:
            names.append(var)
            parts.append(f"(?P<{var}>[^.]+)")
        pos = m.end()
    tail = text[pos:]
    if "{" in tail or "}" in tail:
        raise ValueError(f"malformed placeholder in {text!r}; use {{name}}")
    parts.append(re.escape(tail))
    return NameTemplate(text, frozenset(names), re.compile("".join(parts)))
