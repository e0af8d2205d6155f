"""Which devices of which nodes running tasks hold now: the controller's device ledger.

Every device is :data:`UNITS` units (1/8 of a GPU each, as in the solver's
packing), so shares add up exactly. A placement that names its devices
(``Placement.devices``) holds those units on those devices; one that does
not (whole GPUs on a plan without devices) holds ``per_node`` whole GPUs
somewhere on each node: *anonymous* GPUs. The rule, the same as the plan
validator's (:func:`ray_saturn.devices.check_devices`): per node, no device
over :data:`UNITS`, and the devices in use plus the anonymous GPUs never more
than the node's GPUs.

:meth:`Occupancy.fit` chooses devices for a placement to launch now: its
planned devices when they have room, else the fullest devices that have
(best fit: shares fill devices already shared, whole devices stay free for
whole-GPU tasks).

Example:
    >>> from ray_saturn.control.state import Placement
    >>> occ = Occupancy({"node-0": 2})
    >>> a = occ.fit(Placement("single", 0.5, ("node-0",), devices={"node-0": [(1, 0.5)]}))
    >>> occ.take(a)
    >>> occ.fit(Placement("single", 0.5, ("node-0",), devices={"node-0": [(0, 0.5)]})).device_map()
    {'node-0': ((0, 0.5),)}
    >>> occ.take(occ.fit(Placement("ddp", 1, ("node-0",))))
    >>> occ.fit(Placement("single", 0.5, ("node-0",), devices={"node-0": [(0, 0.5)]})).device_map()
    {'node-0': ((1, 0.5),)}
    >>> occ.free_gpus()
    {'node-0': 0}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from ray_saturn.control.state import Placement
from ray_saturn.errors import SaturnError

__all__ = ["UNITS", "Occupancy", "units_of"]

#: Units of one device: shares 1/2, 1/4, 1/8 are 4, 2, 1 of them.
UNITS = 8


def units_of(placement: Placement) -> int:
    """Units ``placement`` takes on each device it holds (8/k for a 1/k share, 8 for a whole GPU)."""
    return round(UNITS * placement.gpus) if placement.gpus < 1 else UNITS


class Occupancy:
    """Per node, the used units of each device and the anonymous whole GPUs.

    ``nodes`` maps each node to its GPUs; ``running`` the placements held now
    (nodes not in ``nodes`` are ignored: they are gone).
    """

    def __init__(self, nodes: Mapping[str, int], running: Iterable[Placement] = ()) -> None:
        # Sparse: a node's device list exists once something holds one of its devices, so a
        # ledger of 100,000 idle nodes costs a dict, not a list per node.
        self.gpus: dict[str, int] = {n: int(g) for n, g in nodes.items()}
        self._used: dict[str, list[int]] = {}
        self._zero: dict[str, int] = {}  # devices with no unit held, per node with a device list
        self.anonymous: dict[str, int] = {}
        for p in running:
            self.take(p, check=False)

    def _devices(self, n: str) -> list[int]:
        if n not in self._used:
            self._used[n] = [0] * self.gpus[n]
            self._zero[n] = self.gpus[n]
        return self._used[n]

    def _free(self, n: str) -> int:
        return self._zero.get(n, self.gpus[n]) - self.anonymous.get(n, 0)

    def free_gpus(self) -> dict[str, int]:
        """Whole GPUs free per node: devices nothing holds, less the anonymous GPUs."""
        return {n: self._free(n) for n in self.gpus}

    def has_room(self, n: str) -> bool:
        """True when node ``n`` could take some share now (a device with a free unit)."""
        return n in self.gpus and (self._free(n) > 0 or any(0 < u < UNITS for u in self._used.get(n, ())))

    def fit(self, p: Placement) -> Placement | None:
        """``p`` with the devices it would hold if launched now, or ``None`` if it does not fit."""
        if any(n not in self.gpus for n in p.nodes):
            return None
        if p.devices is None and not p.is_share:
            return p if all(self._free(n) >= p.per_node for n in p.nodes) else None
        q = units_of(p)
        m = 1 if p.is_share else int(p.per_node)
        share = float(p.gpus) if p.is_share else 1.0
        planned = p.device_map() or {}
        chosen: dict[str, list[tuple[int, float]]] = {}
        for n in p.nodes:
            used = self._used.get(n) or [0] * self.gpus[n]
            spare_zero = self._free(n)  # fresh devices a task may still take
            want = [d for d, _ in planned.get(n, ())]
            # Planned devices first, then the fullest that have room, then by index.
            order = sorted(range(len(used)), key=lambda d: (d not in want, -used[d], d))
            picks: list[int] = []
            for d in order:
                if len(picks) == m:
                    break
                if used[d] + q > UNITS:
                    continue
                if used[d] == 0:
                    if spare_zero <= 0:
                        continue
                    spare_zero -= 1
                picks.append(d)
            if len(picks) < m:
                return None
            chosen[n] = [(d, share) for d in sorted(picks)]
        return replace(p, devices=chosen)

    def take(self, p: Placement, *, check: bool = True) -> None:
        """Hold ``p`` (as returned by :meth:`fit`, or running already when ``check`` is false)."""
        if p.devices is None:
            if p.is_share:
                raise SaturnError(f"a {p.gpus} share of one GPU on {list(p.nodes)} names no device")
            for n in p.nodes:
                if n in self.gpus:
                    self.anonymous[n] = self.anonymous.get(n, 0) + int(p.per_node)
            return
        q = units_of(p)
        for n, ds in p.devices:
            if n not in self.gpus:
                continue
            used = self._devices(n)
            for d, _ in ds:
                if not 0 <= d < len(used):
                    raise SaturnError(f"device {d} is not on node {n!r}, which has {len(used)} GPUs")
                if used[d] == 0:
                    self._zero[n] -= 1
                used[d] += q
                if check and used[d] > UNITS:
                    raise SaturnError(f"device {d} of node {n!r} would hold more than one GPU")
