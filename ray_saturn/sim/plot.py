"""Charts of simulated runs: GPU utilisation over time and a Gantt chart per policy.

matplotlib (a core dependency) is imported lazily, only when a plot is asked for.

Example:
    >>> plot_results(results, "sim.png")  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ray_saturn.errors import SaturnError
from ray_saturn.sim.simulator import SimResult
from ray_saturn.spec import ClusterSpec

__all__ = ["check_plot_path", "plot_results"]


def _matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SaturnError("--plot needs matplotlib; pip install matplotlib") from None
    return plt


def check_plot_path(path: str | os.PathLike[str]) -> str:
    """``path`` if a chart can be written there (a format matplotlib writes, a place that takes a file),
    else a one-line :class:`SaturnError`; checked before anything is simulated.

    Example:
        >>> check_plot_path("/no/such/folder/sim.png")
        Traceback (most recent call last):
        ...
        ray_saturn.errors.SaturnError: --plot /no/such/folder/sim.png: cannot write there (No such file or directory)
    """
    from matplotlib.backend_bases import FigureCanvasBase

    text = os.fspath(path)
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = os.path.splitext(text)[1].lower().lstrip(".")
    if suffix and suffix not in formats:
        raise SaturnError(f"--plot {text}: matplotlib cannot write .{suffix} files; end the name in one of "
                          f"{', '.join('.' + f for f in sorted(formats))} (e.g. sim.png)")
    existed = os.path.exists(text)
    try:
        with open(text, "ab"):  # neither truncates a file that is there nor leaves one that was not
            pass
        if not existed:
            os.unlink(text)
    except OSError as exc:
        raise SaturnError(f"--plot {text}: cannot write there ({exc.strerror or exc})") from None
    return text


def time_unit(horizon_s: float) -> tuple[float, str]:
    """(seconds per unit, unit name) for a time axis ending at ``horizon_s``: seconds for runs under
    2 minutes, minutes under 2 hours, else hours."""
    if horizon_s < 120:
        return 1.0, "s"
    if horizon_s < 7200:
        return 60.0, "min"
    return 3600.0, "h"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def plot_results(
    results: Mapping[str, SimResult],
    path: str | os.PathLike[str],
    *,
    cluster: ClusterSpec | None = None,
    max_gantt_rows: int = 400,
) -> str:
    """Write one PNG: utilisation of all policies on top, then a Gantt chart per policy.

    Gantt rows are GPU slots (node, GPU); a task on several GPUs fills several
    rows; restart set-up is hatched. Clusters with more than ``max_gantt_rows``
    GPUs are drawn one row per node instead.
    """
    plt = _matplotlib()
    names = list(results)
    if not names:
        raise SaturnError("nothing to plot: no policy was simulated")
    fig, axes = plt.subplots(
        len(names) + 1,
        1,
        figsize=(12, 2.6 + 2.4 * len(names)),
        squeeze=False,
        gridspec_kw={"height_ratios": [1.2] + [2] * len(names)},
    )
    ax = axes[0][0]
    horizon_s = max(r.makespan_s for r in results.values())
    per, unit = time_unit(horizon_s)
    for name in names:
        r = results[name]
        cap = _step_lookup(r.capacity)
        xs, ys = [], []
        for (t, busy), (t2, _) in zip(r.usage, [*r.usage[1:], (r.makespan_s, 0)], strict=True):
            c = cap(t) or 1
            xs += [t / per, max(t, t2) / per]
            ys += [busy / c, busy / c]
        ax.plot(xs, ys, label=f"{name} ({r.makespan_s / per:.2f} {unit})", lw=1)
    ax.set_ylabel("GPU utilisation")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7, ncol=3, loc="lower left")
    ax.set_title("GPU utilisation over time")
    horizon = horizon_s / per
    for i, name in enumerate(names, start=1):
        _gantt(axes[i][0], results[name], cluster, max_gantt_rows, per, unit)
        axes[i][0].set_xlim(0, horizon * 1.01)
    axes[-1][0].set_xlabel({"s": "seconds", "min": "minutes", "h": "hours"}[unit])
    ax.set_xlim(0, horizon * 1.01)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SaturnError(f"--plot {os.fspath(path)}: cannot write the chart ({first})") from None
    finally:
        plt.close(fig)
    return str(path)


def _step_lookup(steps):
    def at(t: float) -> int:
        v = steps[0][1]
        for s, val in steps:
            if s > t:
                break
            v = val
        return v

    return at


def _gantt(ax, r: SimResult, cluster: ClusterSpec | None, max_rows: int, per: float, unit: str) -> None:
    nodes: dict[str, int] = {}
    if cluster is not None:
        nodes = {n.name: n.gpus for n in cluster.nodes}
    else:
        for rec in r.tasks:
            for s in rec.segments:
                for n in s.nodes:
                    nodes[n] = max(nodes.get(n, 0), max(1, int(s.gpus) // len(s.nodes)))
    per_gpu = sum(nodes.values()) <= max_rows
    base, y = {}, 0
    for n, g in nodes.items():
        base[n] = y
        y += g if per_gpu else 1
    # Segments sorted by start; each takes the lowest free GPU rows of its nodes.
    segs = sorted(((s, rec.task) for rec in r.tasks for s in rec.segments), key=lambda x: x[0].start_s)
    busy_until: dict[tuple[str, int], float] = {}
    cmap = _colours(len(r.tasks))
    colour = {rec.task: cmap[i % len(cmap)] for i, rec in enumerate(r.tasks)}
    for s, task in segs:
        start, end = s.start_s / per, (s.end_s or s.start_s) / per
        q = max(1, int(s.gpus) // len(s.nodes))
        devices = s.placement.device_map() or {}
        for n in s.nodes:
            if not per_gpu:
                bands = [(base[n], 0.9)]
            elif n in devices:  # the devices it held; a share of one draws as its part of the row
                bands = [_band(busy_until, n, base[n], d, share, start, end) for d, share in devices[n]]
            else:
                bands = [(row, 0.9) for row in _take(busy_until, n, base[n], nodes[n], q, start, end)]
            for row, height in bands:
                ax.broken_barh([(start, end - start)], (row, height), color=colour[task], lw=0)
                if s.setup_s:
                    ax.broken_barh(
                        [(start, s.setup_s / per)], (row, 0.9), facecolor="none", edgecolor="k", hatch="///", lw=0
                    )
    ax.set_ylim(0, max(y, 1))
    ax.set_ylabel("GPU" if per_gpu else "node")
    ax.set_title(f"{r.policy}: makespan {r.makespan_s / per:.2f} {unit}, {_plural(r.moves, 'move')}, "
                 f"{_plural(r.replans, 'plan')}", fontsize=9)
    ax.set_yticks([])


def _take(busy_until, node, base, gpus, q, start, end) -> list[int]:
    free = [i for i in range(gpus) if busy_until.get((node, i), -1.0) <= start + 1e-9]
    rows = free[:q] if len(free) >= q else list(range(q))
    for i in rows:
        busy_until[(node, i)] = end
    return [base + i for i in rows]


def _band(busy_until, node, base, device, share, start, end) -> tuple[float, float]:
    """The row part (offset, height) a ``share`` of ``device`` takes: its first free eighths."""
    k = max(1, round(8 * min(1.0, share)))
    free = [i for i in range(8) if busy_until.get((node, device, i), -1.0) <= start + 1e-9]
    slots = free[:k] if len(free) >= k else list(range(k))
    for i in slots:
        busy_until[(node, device, i)] = end
    busy_until[(node, device)] = max(busy_until.get((node, device), -1.0), end)
    return base + device + 0.9 * min(slots) / 8, 0.9 * k / 8


def _colours(n: int) -> list:
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return [cmap(i % 20) for i in range(max(1, min(n, 20)))]
