"""Real-run benchmark: the same real workload trained end to end under saturn and the baselines.

Every run trains the same 8 tasks for real with ``ray_saturn.run``
(TorchTrainer segments, strategies, DCP checkpoints) on the same local Ray
(one logical GPU per core on a machine without a GPU,
:mod:`ray_saturn.runtime.local`), from the same profile, under one policy:
``saturn-replan``, ``fifo-max-gpus`` (every task on the most GPUs it can
use, first come first served), ``fifo-whole-node`` (literally one whole
node per task), ``fifo-min-gpus`` (every task on its fewest GPUs, as a
fixed per-trial resource in Tune; often the strongest baseline here) and
``optimus-greedy`` (GPUs added where they shorten the estimated makespan most).
GPT-style models and CNNs of different sizes and lengths (each trains for
30-70 s here: on one logical GPU, the wide GPT on two), one of them a wide
GPT whose model and Adam state exceed the memory budget per GPU, so it must
be sharded (``fsdp``).

One policy per invocation (saturn-replan about 7-8 minutes on 2 cores, each baseline about 10), then a
table; every step writes JSON under ``--out``:

    PYTHONPATH=. python release/real_run_benchmark.py profile --out /tmp/rrb
    PYTHONPATH=. python release/real_run_benchmark.py run --policy saturn-replan --out /tmp/rrb
    PYTHONPATH=. python release/real_run_benchmark.py run --policy fifo-max-gpus --out /tmp/rrb
    PYTHONPATH=. python release/real_run_benchmark.py run --policy fifo-whole-node --out /tmp/rrb
    PYTHONPATH=. python release/real_run_benchmark.py run --policy fifo-min-gpus --out /tmp/rrb
    PYTHONPATH=. python release/real_run_benchmark.py run --policy optimus-greedy --out /tmp/rrb
    PYTHONPATH=. python release/real_run_benchmark.py table --out /tmp/rrb

``profile`` measures the workload (step times, memory, start-up and
checkpoint costs; ``profile.parquet``) and plans it under every policy
(``plans.json``: planned makespans). ``run`` trains it for real
(``run-<policy>.json``: realised and planned makespan, re-plans, moves, per
task its segments). ``table`` prints the markdown table of realised
makespans, realised / planned, and saturn's realised makespan over the
better realised baseline, plus what the model (simulator) predicts on a GPU
node (``--gpu-node``: real jobs' step times from the Pollux traces, with the
start-up measured here; see :func:`gpu_node_profile`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ray_saturn import ClusterSpec, DriverConfig, ProfileTable
from ray_saturn.runtime.local import local_gpus, local_ray
from ray_saturn.spec import Task
from ray_saturn.workloads.text import gpt_task
from ray_saturn.workloads.vision import cnn_task

STRATEGIES = ("single", "ddp", "fsdp")
#: Memory budget per (logical) GPU, GB: the wide GPT exceeds it unsharded.
MEMORY_GB = 0.04
POLICIES = ("saturn-replan", "fifo-max-gpus", "fifo-whole-node", "fifo-min-gpus", "optimus-greedy")
PLANNED_ONLY = ("saturn", "optimus-greedy")  # a row each unless it was run


def workload(scale: float = 1.0) -> list[Task]:
    """8 tasks, each 60-70 s of training on one logical GPU of a 2-core machine: a wide GPT
    whose model and Adam state exceed the memory budget unsharded, three smaller GPTs and four CNNs."""

    def n(steps: int) -> int:
        return max(1, round(steps * scale))

    tasks = [
        gpt_task(width=256, depth=4, heads=4, context=32, batch_size=8, lr=1e-3, max_steps=n(430),
                 strategies=STRATEGIES, name="wide-gpt-lr0.001"),
    ]
    tasks += [
        gpt_task(width=w, depth=2, heads=4, context=64, batch_size=16, lr=lr, max_steps=n(s),
                 strategies=STRATEGIES, name=f"gpt-w{w}-lr{lr:g}")
        for w, lr, s in ((64, 1e-3, 1900), (64, 3e-3, 2000), (128, 1e-3, 1000))
    ]
    tasks += [
        cnn_task(channels=c, lr=lr, size=size, batch_size=b, max_steps=n(s), strategies=STRATEGIES,
                 name=f"cnn-c{c}-lr{lr:g}")
        for c, size, b, lr, s in ((8, 24, 32, 3e-3, 4600), (8, 24, 32, 1e-2, 4900),
                                  (32, 32, 64, 3e-3, 930), (32, 32, 64, 1e-2, 980))
    ]
    return tasks


def _tasks(args) -> list[Task]:
    return workload(args.scale)


def cmd_profile(args) -> int:
    from ray_saturn.profiler import Profiler
    from ray_saturn.solver import solve

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lg = local_gpus(args.gpus)
    print(lg.describe(), flush=True)
    t0 = time.time()
    with local_ray(lg):
        cluster = ClusterSpec.from_ray()
        result = Profiler(cluster, store=str(out / "store.parquet"), memory_limit_gb=MEMORY_GB, warmup=1,
                          steps=3).run(_tasks(args))
    table = result.table
    table.write(out / "profile.parquet")
    plans = {p: solve(table, cluster, p, time_limit_s=10).to_dict()
             for p in ("saturn", "fifo-max-gpus", "fifo-whole-node", "fifo-min-gpus", "optimus-greedy")}
    (out / "plans.json").write_text(json.dumps({"cluster": cluster.to_dict(), "gpus": lg.describe(),
                                                "profile_wall_s": round(time.time() - t0, 1),
                                                "plans": plans}, indent=1))
    print(result.summary())
    for c in table:
        print(f"  {c.task:<18} {c.strategy:<6} x{c.gpus}  "
              + (f"{1000 * c.step_time_s:7.1f} ms/step  startup {c.startup_s:5.1f} s  train {c.train_s:6.1f} s"
                 if c.feasible else f"infeasible: {(c.reason or '')[:70]}"))
    for p, d in plans.items():
        print(f"planned {p:<16} {d['makespan_s']:8.1f} s  (lower bound {d['lower_bound_s']:.1f} s)")
    return 0


def cmd_run(args) -> int:
    import ray_saturn
    from ray_saturn.runtime.journal import Journal
    from ray_saturn.runtime.storage import RunStorage

    out = Path(args.out)
    profile = ProfileTable.read(out / "profile.parquet")
    run_dir = out / f"run-{args.policy}"
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    lg = local_gpus(args.gpus)
    print(lg.describe(), flush=True)
    cfg = DriverConfig(policy=args.policy, checkpoint_interval_s=args.checkpoint_interval, solver_time_limit_s=5.0)
    t0 = time.time()
    with local_ray(lg):
        result = ray_saturn.run(_tasks(args), storage=str(run_dir), profile=profile, config=cfg,
                                name=f"rrb-{args.policy}")
    wall = time.time() - t0
    d = result.to_dict()
    events = Journal(RunStorage(run_dir, create=False)).events()
    d.update(policy=args.policy, wall_s=round(wall, 1), gpus=lg.describe(),
             off_estimate=sum(e.get("kind") == "task_off_estimate" for e in events))
    (out / f"run-{args.policy}.json").write_text(json.dumps(d, indent=1))
    ratio = result.realised_makespan_s / result.planned_makespan_s if result.planned_makespan_s else float("nan")
    print(f"{args.policy}: {result.state}, planned {result.planned_makespan_s:.1f} s, realised "
          f"{result.realised_makespan_s:.1f} s ({ratio:.3f}x), {result.replans} re-plans, {result.moves} moves, "
          f"wall {wall:.0f} s")
    return 0 if result.state == "finished" and not result.failed_tasks else 1


def gpu_node_profile(profile: ProfileTable, *, tasks: int = 12, gpus: int = 8) -> ProfileTable:
    """The model's GPU-node workload: ``tasks`` real jobs from the Pollux traces (step times
    measured on real 4-GPU nodes, ``release/pollux.py``) on one node of ``gpus`` GPUs, each
    segment paying the start-up this benchmark measured (the profile's largest ``startup_s`` for
    the GPU count, else its 2-GPU figure) and its checkpoint costs. A model, not a measurement."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import pollux

    rows, _ = pollux.build_rows(tasks, 1, gpus)
    startup = {}
    for c in profile:
        if c.feasible:
            startup[c.gpus] = max(startup.get(c.gpus, 0.0), c.startup_s)
    save = max((c.checkpoint_save_s for c in profile), default=0.0)
    load = max((c.checkpoint_load_s for c in profile), default=0.0)
    fallback = startup.get(2, max(startup.values(), default=0.0))
    for r in rows:
        r.update(startup_s=startup.get(r["gpus"], fallback), checkpoint_save_s=save, checkpoint_load_s=load)
    return ProfileTable.from_rows(rows, source=f"pollux-{tasks} on 1x{gpus} GPUs")


def cmd_table(args) -> int:
    from ray_saturn.sim.simulator import SimConfig, compare

    out = Path(args.out)
    plans = json.loads((out / "plans.json").read_text())
    runs = {p: json.loads((out / f"run-{p}.json").read_text()) for p in POLICIES if (out / f"run-{p}.json").exists()}
    print(f"{plans['gpus']}\n")
    print("| policy | planned makespan (s) | realised makespan (s) | realised / planned | re-plans | moves | "
          "off-estimate events | wall (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for p, r in runs.items():
        ratio = r["realised_makespan_s"] / r["planned_makespan_s"]
        print(f"| {p} | {r['planned_makespan_s']:.1f} | {r['realised_makespan_s']:.1f} | {ratio:.3f} | "
              f"{r['replans']} | {r['moves']} | {r['off_estimate']} | {r['wall_s']:.0f} |")
    for p in PLANNED_ONLY:
        if p in plans["plans"] and p not in runs:
            print(f"| {p} (planned only) | {plans['plans'][p]['makespan_s']:.1f} | - | - | - | - | - | - |")
    base = {p: r["realised_makespan_s"] for p, r in runs.items() if p != "saturn-replan"}
    if "saturn-replan" in runs and base:
        best = min(base, key=base.get)
        print(f"\nsaturn-replan realised / better realised baseline ({best}): "
              f"{runs['saturn-replan']['realised_makespan_s'] / base[best]:.3f}")
    if args.gpu_node:
        profile = ProfileTable.read(out / "profile.parquet")
        model = gpu_node_profile(profile, gpus=args.gpu_node)
        cluster = ClusterSpec.uniform(1, args.gpu_node)
        sims = compare(model, cluster, list(POLICIES), SimConfig(noise=0.1, seed=0, solver_time_limit_s=5.0))
        m = {p: r.makespan_s for p, r in sims.items()}
        best = min(v for p, v in m.items() if p != "saturn-replan")
        print(f"\nmodel: {model.source} (Pollux traces, start-up as measured here; simulated, 10% noise): "
              + ", ".join(f"{p} {v / 3600:.2f} h" for p, v in m.items())
              + f"; saturn-replan / better baseline {m['saturn-replan'] / best:.3f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("profile", "run", "table"):
        p = sub.add_parser(name)
        p.add_argument("--out", required=True, metavar="DIR")
        p.add_argument("--scale", type=float, default=1.0, help="multiply every task's steps (1)")
        p.add_argument("--gpus", type=int, help="logical GPUs (default: one per core, at most 4)")
        if name == "run":
            p.add_argument("--policy", required=True, choices=POLICIES)
            p.add_argument("--checkpoint-interval", type=float, default=30.0, metavar="S")
        if name == "table":
            p.add_argument("--gpu-node", type=int, default=8, metavar="G",
                           help="also the model's figure for one G-GPU node of Pollux jobs (0: none)")
    args = ap.parse_args()
    return {"profile": cmd_profile, "run": cmd_run, "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
