"""The one place the package imports Ray (tests/test_cluster_imports.py checks that)."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError

RAY_EXTRA = "ray"
"""The optional extra that installs Ray (pyproject.toml)."""


def load_ray() -> Any:
    """The ``ray`` module, or a UsageError naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise UsageError(
            "--ray needs the Ray package, which is not installed",
            hint=f'install the extra on the driver and every node: pip install "ninfer-convert'
            f'[{RAY_EXTRA}]"',
        ) from None
    return ray


def remote(ray: Any, fn: Any, **options: Any) -> Any:
    """``fn`` as a Ray remote function with ``options`` (num_cpus, max_retries, ...)."""
    return ray.remote(**options)(fn)


def node_strategy(node_id: str) -> Any:
    """A scheduling strategy that runs a task on node ``node_id`` and nowhere else."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
