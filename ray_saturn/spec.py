"""What the user describes: training tasks and the cluster they run on.

Both are validated on construction, with errors that say how to fix them.

Example:
    >>> from ray_saturn import ClusterSpec
    >>> cluster = ClusterSpec.uniform(num_nodes=2, gpus_per_node=4)
    >>> cluster.total_gpus
    8
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray_saturn.errors import SpecError
from ray_saturn.limits import MAX_GPUS_PER_NODE, MAX_NODES, MAX_STEPS, whole

logger = logging.getLogger(__name__)

__all__ = [
    "ClusterSpec",
    "NodeSpec",
    "Task",
    "canonical_strategy",
    "check_gpu_type",
    "check_name",
    "ray_node_gpu_type",
]

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=@,-]*")  # fullmatch: "$" would let a trailing newline in
_MAX_NAME = 128
_TYPE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: The keys a node of a cluster JSON file may carry (``ClusterSpec.to_dict`` writes these).
_NODE_KEYS = ("name", "gpus", "gpu_type", "node_id")
#: Ray's resource-name prefix and node label for a node's accelerator type.
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"
ACCELERATOR_LABEL = "ray.io/accelerator-type"


def check_name(name: object, what: str = "task name") -> str:
    """Return ``name`` if it is safe to use as one path component, else raise.

    Task names become folder names under the run folder, so anything that
    could escape it (``..``, ``/``, ``\\``, NUL, a leading dot or dash) is
    rejected.

    Example:
        >>> check_name("bert-lr0.001")
        'bert-lr0.001'
    """
    if not isinstance(name, str) or not name:
        raise SpecError(f"{what} {name!r} must be a non-empty string")
    if len(name) > _MAX_NAME:
        raise SpecError(f"{what} {name[:20]!r}... is {len(name)} characters; use at most {_MAX_NAME}")
    if not _NAME_RE.fullmatch(name) or name in (".", ".."):
        raise SpecError(
            f"{what} {name!r} is not allowed: use ASCII letters, digits and . _ + = @ , - "
            "only, starting with a letter or digit (no '/', '..', spaces or NUL)"
        )
    return name


def canonical_strategy(name: object) -> object:
    """A strategy name as the registry keys it: names are matched case-insensitively (``DDP`` is
    ``ddp``), as registered names are lower case. Anything not a string is left for the registry to refuse.

    Example:
        >>> canonical_strategy(" DDP-Compressed ")
        'ddp-compressed'
    """
    return name.strip().lower() if isinstance(name, str) else name


def check_gpu_type(value: object, what: str = "gpu_type") -> str | None:
    """A GPU type name (``None`` or empty: no type), else a one-line error.

    Example:
        >>> check_gpu_type(" A100 "), check_gpu_type("")
        ('A100', None)
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise SpecError(f"{what} is {value!r}; give the GPU type as a name such as A100")
    value = value.strip()
    if not value:
        return None
    if not _TYPE_RE.fullmatch(value):
        raise SpecError(f"{what} is {value!r}; use letters, digits and . _ - only (e.g. A100, H100-80GB)")
    return value


def _positive_int(value: object, what: str, high: int | None = None) -> int:
    return whole(value, what, high=high)


@dataclass(frozen=True)
class NodeSpec:
    """One node: a name (unique in its cluster) and its GPU count.

    ``node_id`` is the Ray node id when the spec was read from a live cluster.
    ``gpu_type`` names the node's GPU model (e.g. ``A100``); ``None`` when
    unknown. Profile rows measured on a type run only on nodes of that type.
    """

    name: str
    gpus: int
    node_id: str | None = None
    gpu_type: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_name(self.name, "node name")
        object.__setattr__(self, "gpus", _positive_int(self.gpus, f"node {self.name!r} gpus", MAX_GPUS_PER_NODE))
        object.__setattr__(self, "gpu_type", check_gpu_type(self.gpu_type, f"node {self.name!r} gpu_type"))


@dataclass(frozen=True)
class ClusterSpec:
    """The GPUs a plan may use, per node. Node sizes may differ.

    Example:
        >>> ClusterSpec.from_dict({"nodes": [{"name": "a", "gpus": 8}, {"name": "b", "gpus": 4}]})
        ClusterSpec(nodes=(NodeSpec(name='a', gpus=8, node_id=None), NodeSpec(name='b', gpus=4, node_id=None)))
    """

    nodes: tuple[NodeSpec, ...]

    def __post_init__(self) -> None:
        if isinstance(self.nodes, (str, bytes, Mapping)) or not isinstance(self.nodes, Iterable):
            raise SpecError(f"the cluster's nodes are a {type(self.nodes).__name__}; give a tuple of NodeSpec "
                            "(or use ClusterSpec.uniform(nodes, gpus_per_node) or ClusterSpec.from_dict)")
        nodes = tuple(self.nodes)
        object.__setattr__(self, "nodes", nodes)
        if not nodes:
            raise SpecError("the cluster has no nodes; give at least one node with GPUs")
        if len(nodes) > MAX_NODES:
            raise SpecError(f"the cluster has {len(nodes)} nodes; give at most {MAX_NODES}")
        seen: set[str] = set()
        for node in nodes:
            if not isinstance(node, NodeSpec):
                raise SpecError(f"cluster node {node!r} is not a NodeSpec")
            if node.name in seen:
                raise SpecError(f"node name {node.name!r} appears twice; node names must be unique")
            seen.add(node.name)

    @classmethod
    def uniform(cls, num_nodes: int, gpus_per_node: int, prefix: str = "node-") -> ClusterSpec:
        """``num_nodes`` identical nodes named ``node-0``, ``node-1``, ..."""
        n = _positive_int(num_nodes, "number of nodes", MAX_NODES)
        g = _positive_int(gpus_per_node, "GPUs per node", MAX_GPUS_PER_NODE)
        return cls(tuple(NodeSpec(f"{prefix}{i}", g) for i in range(n)))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClusterSpec:
        if not isinstance(data, Mapping) or not isinstance(data.get("nodes"), list):
            raise SpecError('a cluster must be a JSON object {"nodes": [{"name": ..., "gpus": ...}]}')
        nodes = []
        for i, entry in enumerate(data["nodes"]):
            if not isinstance(entry, Mapping) or "name" not in entry or "gpus" not in entry:
                raise SpecError(f'cluster node #{i} must be an object with "name" and "gpus"')
            unknown = [str(k) for k in entry if k not in _NODE_KEYS]
            if unknown:  # a misspelt "gpu_type" would silently leave the node untyped
                raise SpecError(f"cluster node #{i} ({entry['name']!r}) has unknown key(s) {', '.join(unknown)}; "
                                f"a node takes {', '.join(_NODE_KEYS)}")
            nodes.append(NodeSpec(entry["name"], entry["gpus"], entry.get("node_id"), entry.get("gpu_type")))
        return cls(tuple(nodes))

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> ClusterSpec:
        if not isinstance(path, (str, os.PathLike)):
            raise SpecError(f"cluster file is {path!r}; give the path of a JSON cluster file")
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise SpecError(f"{path}: no such cluster file") from None
        except RecursionError:
            raise SpecError(f'{path}: the JSON is nested too deeply; a cluster file is {{"nodes": [{{"name": ..., '
                            '"gpus": ...}, ...]}') from None
        except (OSError, ValueError) as exc:
            raise SpecError(f"{path}: not a readable JSON cluster file ({exc})") from None
        try:
            spec = cls.from_dict(data)
        except SpecError as exc:
            raise SpecError(f"{path}: {exc}") from None
        ignored = [str(k) for k in data if k != "nodes"]
        if ignored:  # kept (a name or a comment is fine), but a misspelt setting must not pass unseen
            logger.warning("%s: key(s) %s ignored; a cluster file is read for its \"nodes\" only", path,
                           ", ".join(repr(k) for k in ignored))
        return spec

    @classmethod
    def from_ray(cls) -> ClusterSpec:
        """Read the alive nodes with GPUs of the connected Ray cluster.

        Nodes are named ``node-<first 8 hex digits of the node id>``; the full
        id is kept in ``node_id`` for placement, the GPU type (Ray's
        ``accelerator_type:<T>`` resource or ``ray.io/accelerator-type``
        label) in ``gpu_type``.
        """
        import ray

        if not ray.is_initialized():
            raise SpecError("Ray is not initialised; call ray.init() (or pass an explicit ClusterSpec)")
        nodes = []
        for info in ray.nodes():
            gpus = info.get("Resources", {}).get("GPU", 0)
            if not info.get("Alive") or gpus < 1:
                continue
            node_id = info["NodeID"]
            nodes.append(NodeSpec(f"node-{node_id[:8]}", math.floor(gpus), node_id, ray_node_gpu_type(info)))
        if not nodes:
            raise SpecError(
                "the Ray cluster has no node with a GPU; start Ray with GPUs (`ray start --head --num-gpus 4`, "
                "ray.init(num_gpus=4) for logical GPUs on a CPU machine, or the CLI's --num-gpus 4 for a local one)"
            )
        nodes.sort(key=lambda n: n.name)
        return cls(tuple(nodes))

    def to_dict(self) -> dict[str, Any]:
        out = []
        for n in self.nodes:
            entry: dict[str, Any] = {"name": n.name, "gpus": n.gpus}
            if n.node_id:
                entry["node_id"] = n.node_id
            if n.gpu_type:
                entry["gpu_type"] = n.gpu_type
            out.append(entry)
        return {"nodes": out}

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def gpu_types(self) -> tuple[str | None, ...]:
        """Each node's GPU type (``None``: untyped), in node order."""
        return tuple(n.gpu_type for n in self.nodes)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise SpecError(f"node {name!r} is not in the cluster (nodes: {', '.join(self.names)})")


def ray_node_gpu_type(info: Mapping[str, Any]) -> str | None:
    """The GPU type of one ``ray.nodes()`` entry: its ``ray.io/accelerator-type`` label, else the
    ``accelerator_type:<T>`` resource Ray sets for detected GPUs; ``None`` if it has neither.

    Example:
        >>> ray_node_gpu_type({"Resources": {"GPU": 4.0, "accelerator_type:A100": 1.0}})
        'A100'
    """
    label = (info.get("Labels") or {}).get(ACCELERATOR_LABEL)
    if label:
        return check_gpu_type(str(label), "the node's accelerator-type label")
    types = sorted(k[len(ACCELERATOR_RESOURCE_PREFIX):] for k in (info.get("Resources") or {})
                   if k.startswith(ACCELERATOR_RESOURCE_PREFIX))
    return check_gpu_type(types[0], "the node's accelerator_type resource") if types else None


@dataclass
class Task:
    """One training job of a model-selection workload.

    Only the description lives here; strategies run it. ``model`` builds the
    ``torch.nn.Module``; ``data`` returns an iterable of batches (it is given
    the task's ``hparams``); ``loss`` maps ``(output, batch)`` to a scalar
    tensor; ``optimizer`` maps ``(parameters, hparams)`` to an optimizer.
    Give exactly one of ``epochs`` (with ``steps_per_epoch``) or
    ``max_steps``.

    Example:
        >>> import torch
        >>> task = Task(
        ...     name="mlp-lr0.1",
        ...     model=lambda hp: torch.nn.Linear(4, 1),
        ...     data=lambda hp: [(torch.randn(8, 4), torch.randn(8, 1))],
        ...     loss=lambda out, batch: torch.nn.functional.mse_loss(out, batch[1]),
        ...     optimizer=lambda params, hp: torch.optim.SGD(params, lr=hp["lr"]),
        ...     hparams={"lr": 0.1},
        ...     max_steps=100,
        ... )
        >>> task.total_steps
        100
    """

    name: str
    model: Callable[[Mapping[str, Any]], Any]
    data: Callable[[Mapping[str, Any]], Iterable[Any]]
    loss: Callable[[Any, Any], Any]
    optimizer: Callable[[Iterable[Any], Mapping[str, Any]], Any]
    hparams: Mapping[str, Any] = field(default_factory=dict)
    epochs: int | None = None
    steps_per_epoch: int | None = None
    max_steps: int | None = None
    batch_size: int | None = None
    strategies: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        for attr in ("model", "data", "loss", "optimizer"):
            if not callable(getattr(self, attr)):
                raise SpecError(f"task {self.name!r}: {attr} must be callable (a factory function)")
        if not isinstance(self.hparams, Mapping):
            raise SpecError(f"task {self.name!r}: hparams must be a mapping, got {type(self.hparams).__name__}")
        self.hparams = dict(self.hparams)
        if (self.epochs is None) == (self.max_steps is None):
            raise SpecError(f"task {self.name!r}: give exactly one of epochs= or max_steps=")
        if self.max_steps is not None:
            self.max_steps = _positive_int(self.max_steps, f"task {self.name!r} max_steps", MAX_STEPS)
        else:
            self.epochs = _positive_int(self.epochs, f"task {self.name!r} epochs")
            if self.steps_per_epoch is None:
                raise SpecError(
                    f"task {self.name!r}: epochs={self.epochs} needs steps_per_epoch= "
                    "(optimizer steps in one pass over the data)"
                )
            self.steps_per_epoch = _positive_int(self.steps_per_epoch, f"task {self.name!r} steps_per_epoch")
        if self.batch_size is not None:
            self.batch_size = _positive_int(self.batch_size, f"task {self.name!r} batch_size")
        if self.strategies is not None:
            if isinstance(self.strategies, str):
                self.strategies = (self.strategies,)
            self.strategies = tuple(canonical_strategy(s) for s in self.strategies)
            if not self.strategies:
                raise SpecError(f"task {self.name!r}: strategies=() allows nothing; leave it None for all")

    @property
    def total_steps(self) -> int:
        """Optimizer steps the task needs from scratch."""
        if self.max_steps is not None:
            return self.max_steps
        assert self.epochs is not None and self.steps_per_epoch is not None
        return self.epochs * self.steps_per_epoch


def check_unique_names(tasks: Iterable[Task]) -> list[Task]:
    if isinstance(tasks, (str, bytes, Mapping, Task)) or not isinstance(tasks, Iterable):
        raise SpecError(f"tasks is a {type(tasks).__name__}; give a list of ray_saturn.Task")
    tasks = list(tasks)
    seen: set[str] = set()
    for t in tasks:
        if not isinstance(t, Task):
            raise SpecError(f"expected Task objects, got {type(t).__name__}")
        if t.name in seen:
            raise SpecError(f"task name {t.name!r} appears twice; task names must be unique")
        seen.add(t.name)
    if not tasks:
        raise SpecError("no tasks given; a workload needs at least one Task")
    return tasks
