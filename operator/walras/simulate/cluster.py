"""The virtual cluster a simulation runs on: pools of identical GPU nodes, and its typed planner view.

A cluster is written ``k80=8x4,p100=8x4,v100=8x4``: per accelerator type (one ResourcePool each), nodes x GPUs per
node. Node ``k`` of pool ``p`` is named ``{p}-{k:04d}`` and labelled ``walras.dev/sim-pool: p``; it offers ``GPUS`` (one
unit per accelerator) and a pod slot per accelerator (every simulated pod holds one accelerator). The typed
:class:`walras.planner.cluster.Node` / :class:`~walras.planner.cluster.Pool` objects are built once per cluster and
shared by every plan (the planner reads them as values).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from walras.planner.cluster import PODS, Node, Pool
from walras.planner.spec import PoolSpec

#: The priced resource of every simulated pool: one unit per accelerator.
GPUS = "nvidia.com/gpu"
#: The node label that selects a simulated pool's nodes.
POOL_LABEL = "walras.dev/sim-pool"

_ITEM = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)=(\d+)x(\d+)$")


@dataclass(frozen=True)
class PoolShape:
    """``nodes`` nodes of ``gpus`` accelerators of type ``name``."""

    name: str
    nodes: int
    gpus: int


@dataclass(frozen=True)
class VirtualCluster:
    """The pools in the order written; node ``k`` (global index) belongs to pool ``node_pool[k]``."""

    pools: tuple[PoolShape, ...]

    @property
    def types(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.pools)

    @cached_property
    def node_pool(self) -> np.ndarray:
        """(K,) pool index of each node (nodes of pool 0 first, then pool 1, ...)."""
        return np.repeat(np.arange(len(self.pools)), [p.nodes for p in self.pools]).astype(np.int64)

    @cached_property
    def node_gpus(self) -> np.ndarray:
        """(K,) accelerators on each node."""
        return np.repeat([p.gpus for p in self.pools], [p.nodes for p in self.pools]).astype(np.int64)

    @cached_property
    def node_names(self) -> tuple[str, ...]:
        return tuple(f"{p.name}-{k:04d}" for p in self.pools for k in range(p.nodes))

    @property
    def capacity(self) -> np.ndarray:
        """(m,) accelerators of each type."""
        return np.array([p.nodes * p.gpus for p in self.pools], dtype=np.int64)

    @cached_property
    def typed_nodes(self) -> tuple[Node, ...]:
        """The planner's nodes, in name order (as :class:`walras.planner.cluster.Cluster` wants them)."""
        nodes = [Node(name=name, labels={POOL_LABEL: self.pools[int(j)].name},
                      allocatable={GPUS: float(g), PODS: float(g)})
                 for name, j, g in zip(self.node_names, self.node_pool.tolist(), self.node_gpus.tolist(), strict=True)]
        return tuple(sorted(nodes, key=lambda n: n.name))

    def typed_pools(self, policy: str = "utility") -> tuple[Pool, ...]:
        """One ResourcePool per accelerator type selecting its nodes, priced in :data:`GPUS`, placing with
        ``policy`` (a :mod:`walras.planner.policies` name; ``utility``, assign-and-allocate, by default: every pod
        asks one accelerator, so the policies place alike here, and it needs no JIT compilation, which costs the
        degree-limited ``throughput`` policy about 7 s in the first plan of a process)."""
        return tuple(sorted((Pool(name=p.name, generation=1,
                                  spec=PoolSpec(name=p.name, node_selector={POOL_LABEL: p.name}, resource=GPUS,
                                                policy=policy))
                             for p in self.pools), key=lambda p: p.name))


def parse_cluster(text: str) -> VirtualCluster:
    """Parse ``type=NODESxGPUS[,type=NODESxGPUS...]`` (``ValueError`` with what is wrong)."""
    pools: list[PoolShape] = []
    for item in (s.strip() for s in text.split(",")):
        match = _ITEM.match(item)
        if match is None:
            raise ValueError(f"cluster item {item!r} is not TYPE=NODESxGPUS (e.g. v100=8x4)")
        name, nodes, gpus = match.group(1), int(match.group(3)), int(match.group(4))
        if nodes < 1 or gpus < 1:
            raise ValueError(f"cluster item {item!r}: nodes and GPUs per node must be >= 1")
        if any(p.name == name for p in pools):
            raise ValueError(f"cluster names pool {name!r} twice")
        pools.append(PoolShape(name, nodes, gpus))
    return VirtualCluster(tuple(pools))
