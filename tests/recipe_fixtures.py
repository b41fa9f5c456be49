"""Shared by the recipe tests: the smallest valid recipe head that rule bodies are appended to."""

from __future__ import annotations

RECIPE_HEAD = """\
ninfer_recipe: 1
name: t
version: "1"
source:
  model_type: llama
evidence:
  - id: e1
    citation: somebody
    summary: something
rules:
"""
RECIPE_HEAD_LINES = RECIPE_HEAD.count("\n")
"""The first rule of a body appended to :data:`RECIPE_HEAD` starts on this line + 1."""
