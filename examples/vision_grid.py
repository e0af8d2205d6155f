"""Vision grid: CNNs of 3 widths x 3 learning rates on generated shape images, planned and trained together.

    python examples/vision_grid.py --local --plan-only   # profile + plan
    python examples/vision_grid.py --local               # and train with ray_saturn.run, then report
"""

from __future__ import annotations

import ray_saturn
from ray_saturn import ClusterSpec
from ray_saturn.cli.args import OneLineParser, count
from ray_saturn.limits import MAX_GPUS_PER_NODE, MAX_STEPS
from ray_saturn.report import RunReport, gantt_png, render
from ray_saturn.workloads.vision import cnn_task


def main() -> None:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", action="store_true", help="start a local Ray with logical GPUs")
    parser.add_argument("--gpus", type=count("--gpus", high=MAX_GPUS_PER_NODE), default=4,
                        help="logical GPUs of the local Ray (--local; 4)")
    parser.add_argument("--steps", type=count("--steps", high=MAX_STEPS), default=300, help="steps per task (300)")
    parser.add_argument("--plan-only", action="store_true")
    parser.add_argument("--storage", default="/tmp/ray-saturn-runs/vision-grid")
    args = parser.parse_args()
    # Joins RAY_ADDRESS / a running cluster (unless --local); else a local Ray private to this process.
    ray_saturn.init_ray(args.gpus, fresh=args.local)
    cluster = ClusterSpec.from_ray()
    grid = [cnn_task(channels=c, lr=lr, max_steps=args.steps, strategies=("single", "ddp", "ddp-compressed"))
            for c in (8, 16, 32) for lr in (1e-3, 3e-3, 1e-2)]
    profile = ray_saturn.profile(grid, cluster)
    plan = ray_saturn.plan(profile, cluster, "saturn", time_limit_s=10)
    baseline = ray_saturn.plan(profile, cluster, "fifo-whole-node", time_limit_s=10)
    print(f"makespan {plan.makespan_s:.1f}s, lower bound {plan.lower_bound_s:.1f}s, "
          f"fifo-whole-node {baseline.makespan_s:.1f}s")
    if args.plan_only:
        print(plan.to_json(indent=1))
        return
    run = getattr(ray_saturn, "run", None)
    if run is None:
        raise SystemExit("this ray_saturn build has no ray_saturn.run yet (runtime branch); use --plan-only")
    run(grid, cluster, storage=args.storage, profile=profile, name="vision-grid")
    report = RunReport.from_run_dir(args.storage, planned=plan, baseline=baseline)
    render(report)
    print("Gantt chart:", gantt_png(report, f"{args.storage}/gantt.png"))


if __name__ == "__main__":
    main()
