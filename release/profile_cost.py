"""Profiler cost against the workload it profiles: a 16-task model-selection sweep.

Starts a local Ray with logical GPUs (CPU machine: gloo; a GPU machine: the
real GPUs), profiles a sweep of ``--tasks`` tasks (two model sizes x a
learning-rate/seed grid, so two performance signatures) with every
registered strategy, and prints the profiler's GPU-seconds next to the
workload's estimated GPU-seconds (each task's cheapest feasible
configuration x its steps).

    python release/profile_cost.py [--tasks 16] [--steps 20000] [--num-gpus 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--steps", type=int, default=20000, help="optimizer steps per task")
    p.add_argument("--num-gpus", type=int, default=2, help="logical GPUs of the local Ray")
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    import ray

    from ray_saturn import ClusterSpec
    from ray_saturn.profiler import Profiler
    from ray_saturn.toy import mlp_task

    tasks = []
    for i in range(args.tasks):
        width = args.width if i % 2 == 0 else args.width * 2
        tasks.append(
            mlp_task(
                f"w{width}-lr{i}",
                lr=0.001 * (1 + i // 2),
                seed=i,
                width=width,
                features=64,
                depth=8,
                batch_size=64,
                max_steps=args.steps,
            )
        )
    ray.init(address="local", num_gpus=args.num_gpus, num_cpus=2, include_dashboard=False)
    try:
        result = Profiler(ClusterSpec.uniform(1, args.num_gpus)).run(tasks)
    finally:
        ray.shutdown()
    out = {
        "tasks": args.tasks,
        "steps_per_task": args.steps,
        "trials_run": result.trials_run,
        "profile_gpu_s": round(result.cost_gpu_s, 1),
        "profile_wall_s": round(result.wall_s, 1),
        "workload_gpu_s": round(result.workload_gpu_s, 1),
        "cost_ratio": round(result.cost_ratio, 4),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(result.summary())
        for c in result.table:
            if c.task in (tasks[0].name, tasks[1].name):
                st = f"{c.step_time_s * 1e3:.1f} ms" if c.feasible else f"infeasible: {c.reason}"
                print(f"  {c.task:<14} {c.strategy:<15} {c.gpus} GPU  {st}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
