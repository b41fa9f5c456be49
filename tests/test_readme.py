"""The README's first screen is what a new user pastes: it must be right for a CPU machine."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_first_code_block_installs_cpu_torch_before_the_package() -> None:
    block = re.search(r"```bash\n(.*?)```", README.read_text(), re.S)
    assert block is not None
    lines = [line.strip() for line in block.group(1).splitlines()]
    torch = lines.index("pip install torch==2.13.0")
    assert lines.index('pip install -e ".[test]"') > torch
    assert lines[torch - 1].startswith("#") and "CPU" in " ".join(lines[:torch])
