"""The Pollux simulator's job model, re-implemented from its description, for fair comparisons.

The Pollux artifact (petuum/adaptdl, branch ``osdi21-artifact``, folder
``simulator/``; its traces are in ``../shared/benchmarks/pollux``) simulates a
job of application A at a fixed global batch B as follows, and this module
computes the same quantities (it shares no code with it):

- micro-batching on g GPUs: local batch ``ceil(B / g)``; gradient accumulation
  ``a = ceil(local / max_local) - 1`` steps (at least 1 on one GPU when B is
  above the smallest validated batch); atomic batch ``ceil(local / (a + 1))``,
  capped at ``max_batch / (g (a + 1))``; the batch actually trained is
  ``B' = g x atomic x (a + 1)``;
- step time on a placement P (GPUs per node, e.g. (4, 4)): P's rotation that is
  smallest as a digit string; if ``placements.csv`` has P, linear
  interpolation over the local batch of (step time, sync time); otherwise
  linear interpolation over (nodes, replicas, local batch) of the per-shape
  means of ``placements.csv`` and the rows of ``scalability.csv``. With
  accumulation a step takes ``step + a x (step - sync)``;
- work: the job ends after the app's epoch budget E; epoch e needs
  ``progress(e + 1) - progress(e)`` units of statistical progress
  (``progress(e)`` = the smallest ``progress`` of epoch e over all validation
  files) and one step at B' makes ``gain = (var + sqr) / (var / s + sqr)``
  units, with ``s = B' / B0`` (B0 the smallest validated batch) and the
  gradient statistics ``sqr, var`` of epoch e interpolated linearly between
  the validated batch sizes around B'. Steps = sum over epochs of progress /
  gain; runtime = steps x step time.

The Pollux simulator also charges 30 s of set-up at every (re)allocation,
the first included, and rounds each epoch's end to a whole second; the first
is a property of the cluster (:data:`RESTART_S`), the second is ignored here
(half a second per epoch at most).
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_ROOT = Path(os.environ.get("POLLUX_DIR", HERE.parent.parent / "shared" / "benchmarks" / "pollux"))
#: Epoch budgets of the Pollux simulator.
EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
#: Per-GPU batch caps that differ from the largest one measured.
MAX_LOCAL = {"yolov3": 8}
#: Set-up the Pollux simulator charges at every (re)allocation.
RESTART_S = 30.0
#: GPUs per node of the Pollux traces' cluster.
GPUS_PER_NODE = 4


def _read(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@dataclass
class App:
    name: str
    placements: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # id -> (local_bsz, step, sync), sorted
    shape_points: np.ndarray  # (n, 3): nodes, replicas, local_bsz
    shape_values: np.ndarray  # (n, 2): step, sync
    validation: dict[int, dict[str, np.ndarray]]  # batch -> progress, iteration, grad_sqr, grad_var
    init_batch: int
    max_batch: int
    min_local: float
    max_local: float
    epochs: int

    # ------------------------------------------------------------ throughput
    def micro(self, batch: int, g: int) -> tuple[int, int]:
        """(atomic batch per GPU, accumulation steps) for global ``batch`` on ``g`` GPUs."""
        local = math.ceil(batch / g - 1e-8)
        accum = math.ceil(local / self.max_local - 1e-8) - 1
        if g == 1 and batch > self.init_batch:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, int(self.max_batch / (g * (accum + 1))))
        return atomic, accum

    def raw_step(self, placement: tuple[int, ...], local: float) -> tuple[float, float] | None:
        """(step, sync) seconds of one micro-step at per-GPU batch ``local``; None outside the data."""
        p = tuple(x for x in placement if x)
        p = min(p[i:] + p[:i] for i in range(len(p)))
        pid = "".join(map(str, p))
        if pid in self.placements:
            xs, step, sync = self.placements[pid]
            if not xs[0] - 1e-9 <= local <= xs[-1] + 1e-9:
                return None
            return float(np.interp(local, xs, step)), float(np.interp(local, xs, sync))
        point = np.array([[min(len(p), 16), sum(p), local]], dtype=float)
        value = _nd_interpolator(self.name)(point)[0]
        if not np.all(np.isfinite(value)):
            return None
        return float(value[0]), float(value[1])

    def step_time(self, batch: int, placement: tuple[int, ...]) -> float | None:
        """Seconds per optimizer step (accumulation included) at ``batch`` on ``placement``."""
        g = sum(placement)
        atomic, accum = self.micro(batch, g)
        if atomic < 1:
            return None
        st = self.raw_step(placement, atomic)
        if st is None:
            return None
        step, sync = st
        return step + accum * (step - sync)

    def trained_batch(self, batch: int, g: int) -> int:
        atomic, accum = self.micro(batch, g)
        return g * atomic * (accum + 1)

    # ------------------------------------------------------------ work
    def progress(self, epoch: int) -> float:
        if epoch == 0:
            return 0.0
        return min(float(v["progress"][epoch - 1]) for v in self.validation.values())

    def _grad(self, batch: float, epoch: int) -> tuple[float, float]:
        sizes = sorted(self.validation)
        lo = max(b for b in sizes if b <= batch)
        hi = min(b for b in sizes if b >= batch)
        a, b = self.validation[lo], self.validation[hi]
        if lo == hi:
            return float(a["grad_sqr"][epoch]), float(a["grad_var"][epoch])
        w = (batch - lo) / (hi - lo)
        sqr = (1 - w) * a["grad_sqr"][epoch] + w * b["grad_sqr"][epoch]
        var = (1 - w) * a["grad_var"][epoch] + w * b["grad_var"][epoch]
        return float(sqr), float(var)

    def steps(self, trained_batch: int) -> float:
        """Optimizer steps to finish the epoch budget at ``trained_batch`` (fractional)."""
        if not self.init_batch <= trained_batch <= self.max_batch:
            raise ValueError(f"{self.name}: batch {trained_batch} outside the validated range")
        scale = trained_batch / self.init_batch
        total = 0.0
        for e in range(self.epochs):
            sqr, var = self._grad(trained_batch, e)
            gain = (var + sqr) / (var / scale + sqr)
            total += (self.progress(e + 1) - self.progress(e)) / gain
        return total

    def runtime(self, batch: int, placement: tuple[int, ...]) -> float | None:
        """Seconds to train the job at ``batch`` on ``placement`` (no set-up); None if it cannot run."""
        st = self.step_time(batch, placement)
        if st is None:
            return None
        return self.steps(self.trained_batch(batch, sum(placement))) * st


@cache
def load_app(name: str, root: Path = DEFAULT_ROOT) -> App:
    d = root / "traces" / name
    if not d.is_dir():
        raise SystemExit(f"{d}: Pollux traces not found; set POLLUX_DIR to the shared/benchmarks/pollux folder")
    by_pid: dict[str, dict[float, list[tuple[float, float]]]] = {}
    for r in _read(d / "placements.csv"):
        by_pid.setdefault(r["placement"], {}).setdefault(float(r["local_bsz"]), []).append(
            (float(r["step_time"]), float(r["sync_time"]))
        )
    placements = {}
    shape: dict[tuple[int, int, float], list[tuple[float, float]]] = {}
    for pid, rows in by_pid.items():
        xs = sorted(rows)
        step = np.array([np.mean([v[0] for v in rows[x]]) for x in xs])
        sync = np.array([np.mean([v[1] for v in rows[x]]) for x in xs])
        placements[pid] = (np.array(xs), step, sync)
        key_nodes, key_reps = len(pid), sum(int(c) for c in pid)
        for x in xs:
            shape.setdefault((key_nodes, key_reps, x), []).extend(rows[x])
    points = [list(k) for k in shape]
    values = [[np.mean([v[0] for v in vs]), np.mean([v[1] for v in vs])] for vs in shape.values()]
    for r in _read(d / "scalability.csv"):
        points.append([float(r["num_nodes"]), float(r["num_replicas"]), float(r["local_bsz"])])
        values.append([float(r["step_time"]), float(r["sync_time"])])
    validation = {}
    for f in d.glob("validation-*.csv"):
        rows = _read(f)
        validation[int(f.stem.split("-")[1])] = {
            k: np.array([float(r[k]) for r in rows]) for k in ("progress", "iteration", "grad_sqr", "grad_var")
        }
    min_local = min(float(x) for xs, _, _ in placements.values() for x in xs)
    max_local = MAX_LOCAL.get(name, max(float(xs[-1]) for xs, _, _ in placements.values()))
    epochs = min(EPOCHS[name], min(len(v["progress"]) for v in validation.values()))
    return App(
        name,
        placements,
        np.array(points, dtype=float),
        np.array(values, dtype=float),
        validation,
        min(validation),
        max(validation),
        min_local,
        max_local,
        epochs,
    )


@cache
def _nd_interpolator(name: str):
    from scipy.interpolate import LinearNDInterpolator

    app = load_app(name)
    return LinearNDInterpolator(app.shape_points, app.shape_values)


def even_placements(max_gpus: int, gpus_per_node: int = GPUS_PER_NODE, nodes: int = 16) -> list[tuple[int, ...]]:
    """Placements with equal GPUs per node that the profile contract can express:
    1..G GPUs on one node, and every multiple of G on that many whole nodes, plus
    G+2 as two nodes of G/2+1 when that splits evenly (6 = 3+3 on 4-GPU nodes)."""
    out: list[tuple[int, ...]] = [(g,) for g in range(1, min(gpus_per_node, max_gpus) + 1)]
    half = gpus_per_node // 2 + 1
    if 2 * half <= max_gpus and gpus_per_node % 2 == 0 and half <= gpus_per_node:
        out.append((half, half))
    k = 2
    while k * gpus_per_node <= max_gpus and k <= nodes:
        out.append((gpus_per_node,) * k)
        k += 1
    return out
