"""A `ray job submit` entry point: plan (and, with the runtime, train) a model-selection sweep on the cluster.

Runs unchanged against a cluster started with ``ray start --head --num-gpus=N``::

    export RAY_AUTH_MODE=token     # token authentication, for the head node and the job client
    ray start --head --num-gpus=4 --dashboard-host=127.0.0.1
    ray job submit --working-dir . -- python examples/job_submit.py --plan-only
    ray job submit --working-dir . -- python examples/job_submit.py --storage /tmp/runs/sweep

``--plan-only`` reads the cluster's GPUs and plans the shipped 24-job profile
(measured Pollux traces) with ``saturn`` and the ``fifo-whole-node``
baseline, printing both plans. Without it, the demo's workload (tiny GPT and
CNN models) is profiled, planned and trained with ``ray_saturn.run``.
"""

from __future__ import annotations

import json

import ray_saturn
from ray_saturn import ClusterSpec, ProfileTable
from ray_saturn.cli.args import OneLineParser, seconds


def main() -> None:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan-only", action="store_true", help="plan the shipped example profile, do not train")
    parser.add_argument("--storage", default="/tmp/ray-saturn-runs/job", help="run folder (train mode)")
    parser.add_argument("--time-limit", type=seconds("--time-limit"), default=10.0, help="solver time limit (s)")
    args = parser.parse_args()
    ray_saturn.init_ray()  # inside `ray job submit`: joins the job's cluster (elsewhere: a private local Ray)
    cluster = ClusterSpec.from_ray()
    print("ray_saturn cluster:", json.dumps(cluster.to_dict()))
    if args.plan_only:
        from importlib.resources import files

        profile = ProfileTable.read(str(files("ray_saturn") / "examples_data" / "model_selection_profile.csv"))
        plan = ray_saturn.plan(profile, cluster, "saturn", time_limit_s=args.time_limit)
        baseline = ray_saturn.plan(profile, cluster, "fifo-whole-node", time_limit_s=args.time_limit)
        print("ray_saturn plan:", plan.to_json())
        print(f"ray_saturn summary: makespan {plan.makespan_s:.0f}s, lower bound {plan.lower_bound_s:.0f}s, "
              f"fifo-whole-node {baseline.makespan_s:.0f}s")
        return
    from ray_saturn.demo import demo_tasks

    run = getattr(ray_saturn, "run", None)
    if run is None:
        raise SystemExit("this ray_saturn build has no ray_saturn.run yet (runtime branch); use --plan-only")
    result = run(demo_tasks(steps=120), cluster, storage=args.storage, name="job-sweep")
    print("ray_saturn result:", json.dumps(result.to_dict()))


if __name__ == "__main__":
    main()
