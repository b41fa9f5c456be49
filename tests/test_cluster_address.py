"""An unreachable ``--ray HOST:PORT`` fails fast with exit 2, instead of waiting out Ray's own
connection retries (over two minutes for a refused port)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster_fixtures import EXAMPLE, QWEN_RECIPE

from ninfer_convert.cluster.driver import probe_address, tcp_endpoint
from ninfer_convert.errors import UsageError


@pytest.mark.parametrize(
    ("address", "endpoint"),
    [
        ("10.0.0.5:6379", ("10.0.0.5", 6379)),
        ("ray://head.example:10001", ("head.example", 10001)),
        ("[::1]:6379", ("::1", 6379)),
        ("auto", None),
        ("local", None),
        (None, None),
        ("head-without-port", None),
        ("host:notaport", None),
    ],
)
def test_tcp_endpoint_is_only_taken_from_host_port_addresses(
    address: str | None, endpoint: tuple[str, int] | None
) -> None:
    # Anything that is not HOST:PORT is left to ray.init to interpret (and refuse).
    assert tcp_endpoint(address) == endpoint


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: nothing listens


def test_probe_of_a_port_nobody_listens_on_is_a_usage_error_naming_it() -> None:
    port = _closed_port()
    with pytest.raises(UsageError) as info:
        probe_address(f"127.0.0.1:{port}", timeout_s=2.0)
    assert f"127.0.0.1:{port}" in str(info.value) and info.value.exit_code == 2


def test_probe_of_a_listening_port_passes() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        probe_address(f"127.0.0.1:{s.getsockname()[1]}", timeout_s=2.0)


@pytest.mark.ray
def test_cli_convert_with_an_unreachable_ray_address_exits_2_within_seconds(
    tmp_path: Path,
) -> None:
    pytest.importorskip("ray")
    out = tmp_path / "o"
    args = [sys.executable, "-m", "ninfer_convert", "convert", str(EXAMPLE), "--recipe",
            str(QWEN_RECIPE), "--output", str(out), "--max-shard-size", "1MB",
            f"--ray=127.0.0.1:{_closed_port()}"]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - t0 < 60
    assert "127.0.0.1" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()
