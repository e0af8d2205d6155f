"""A Ray Tune search where ray_saturn decides each trial's strategy, GPU count and start order.

The Tuner, its search space and ASHA stay as they are; the two additions are
``saturn_trainable`` (builds and trains a Task from the trial's config) and
``SaturnScheduler`` wrapped around ASHA. Works as a plain script (starts a
local Ray with logical GPUs when none is running) and unchanged as a job::

    export RAY_AUTH_MODE=token     # token authentication, for the head node and the job client
    ray start --head --num-gpus=4 --dashboard-host=127.0.0.1
    ray job submit --working-dir . -- python examples/tune_search.py --quick

Step times come from a short measurement of each model width in this
process; multi-GPU (DDP) step times assume 70% scaling efficiency, a stated
assumption until you feed rows from ``ray_saturn.profile``.
"""

from __future__ import annotations

import functools
import json
import time

import ray
import torch
from ray import tune
from ray.tune.schedulers import ASHAScheduler

import ray_saturn
from ray_saturn.cli.args import OneLineParser, count
from ray_saturn.limits import MAX_GPUS_PER_NODE
from ray_saturn.tune import SaturnScheduler, saturn_trainable
from ray_saturn.workloads.text import gpt_task

DDP_EFFICIENCY = 0.7


def make_task(config: dict, steps: int):
    return gpt_task(width=config["width"], lr=config["lr"], context=32, batch_size=16, max_steps=steps)


@functools.cache
def measured_step_s(width: int) -> float:
    """Median seconds per optimizer step of a width, over 5 steps after 2 warm-up steps, on this machine."""
    task = gpt_task(width=width, lr=1e-3, context=32, batch_size=16, max_steps=7)
    torch.manual_seed(0)
    model = task.model(task.hparams)
    opt = task.optimizer(model.parameters(), task.hparams)
    data = task.data(task.hparams)
    times = []
    for i in range(7):
        t0 = time.perf_counter()
        opt.zero_grad()
        batch = data[i]
        task.loss(model(batch[0]), batch).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return sorted(times[2:])[2]


def estimate(config: dict, steps: int, max_gpus: int) -> list[dict]:
    single = measured_step_s(config["width"])
    rows = [{"strategy": "single", "gpus": 1, "step_time_s": single, "steps": steps}]
    rows += [
        {"strategy": "ddp", "gpus": g, "step_time_s": single / (g * DDP_EFFICIENCY), "steps": steps}
        for g in (2, 4)
        if g <= max_gpus
    ]
    return rows


def main() -> None:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 trials, 30 steps each")
    parser.add_argument("--gpus", type=count("--gpus", high=MAX_GPUS_PER_NODE), default=4,
                        help="logical GPUs when a local Ray is started (4)")
    parser.add_argument("--storage", default=None, help="Tune storage path (default ~/ray_results)")
    parser.add_argument("--local", action="store_true", help="start a fresh local Ray even if a cluster is running")
    args = parser.parse_args()
    steps = 30 if args.quick else 150
    widths = [32, 64] if args.quick else [32, 64, 96]
    # Joins RAY_ADDRESS / a running cluster (ray job submit) unless --local; else a local Ray private to this
    # process (token auth, 127.0.0.1 only, no dashboard) with --gpus logical GPUs.
    ray_saturn.init_ray(args.gpus, fresh=args.local)
    max_gpus = int(max(n["Resources"].get("GPU", 0) for n in ray.nodes() if n["Alive"]))
    for w in widths:  # measured now, so that estimate (called inside Tune's event loop) only looks them up
        measured_step_s(w)
    scheduler = SaturnScheduler(
        functools.partial(estimate, steps=steps, max_gpus=max_gpus),
        base_scheduler=ASHAScheduler(time_attr="training_iteration", max_t=steps // 10, grace_period=1),
        restart_s=3.0,
        cpus_per_trial=0.25,
    )
    tuner = tune.Tuner(
        saturn_trainable(functools.partial(make_task, steps=steps), report_every=10),
        param_space={"width": tune.grid_search(widths), "lr": tune.grid_search([1e-3, 3e-3, 1e-2])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler, reuse_actors=False),
        run_config=tune.RunConfig(name="saturn-tune-search", storage_path=args.storage, verbose=1),
    )
    grid = tuner.fit()
    scheduler.close()
    print("ray_saturn first plan:", json.dumps(scheduler.plans[0].to_dict()))
    print("ray_saturn last plan:", scheduler.controller.plan.to_json())
    stats = scheduler.stats()
    print(
        f"ray_saturn: {stats.replans} plans, {stats.moves} moves ({stats.resizes_that_changed_size} changed size), "
        f"longest scheduler hook {stats.max_hook_ms:.0f} ms (of which estimate {stats.max_estimate_ms:.0f} ms), "
        f"restart cost measured {stats.restart_s:.1f} s"
    )
    for r in sorted(grid, key=lambda r: r.metrics.get("loss", float("inf"))):
        d = r.config["_saturn"]
        print(
            f"trial width={r.config['width']:<3} lr={r.config['lr']:<6g} {d['strategy']:>6}x{d['gpus']} "
            f"iterations={r.metrics['training_iteration']} loss={r.metrics['loss']:.3f}"
        )
    best = grid.get_best_result()
    print(
        "best:",
        json.dumps({"width": best.config["width"], "lr": best.config["lr"], "loss": round(best.metrics["loss"], 4)}),
    )
    if grid.errors:
        raise SystemExit(f"{len(grid.errors)} trial(s) failed")


if __name__ == "__main__":
    main()
