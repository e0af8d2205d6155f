"""LLM-style fine-tuning grid: a GPT too big for one (logical) GPU's memory budget, 2 learning rates x 2 freezings.

On GPUs the per-GPU memory budget defaults to 80% of what one unsharded
worker needs for the model's weights, gradients and Adam state, so the
profiler marks ``single`` and ``ddp`` infeasible and the plan has to shard
(``fsdp``). With ``--local`` (logical GPUs on the CPU) a worker's "peak
memory" is its process's resident-set growth, activations and allocator
included, which does not shrink with sharding the way GPU memory does; so
there is no budget unless ``--memory-limit-gb`` gives one, and the plan is
free to pick ``ddp``. The GPT ties its output head to its embedding, which
``fsdp`` keeps in one group. Run it locally or as a job::

    python examples/llm_finetune_grid.py --local --plan-only     # profile + plan, print both plans
    python examples/llm_finetune_grid.py --local                 # and train with ray_saturn.run
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import ray_saturn
from ray_saturn import ClusterSpec
from ray_saturn.cli.args import OneLineParser, count, positive
from ray_saturn.limits import MAX_GPUS_PER_NODE, MAX_STEPS
from ray_saturn.workloads.text import TinyGPT, gpt_task, vocabulary

WIDTH, DEPTH, HEADS, CONTEXT = 192, 6, 6, 64


def frozen_gpt(hp: Mapping[str, Any], *, freeze: int):
    """The base GPT with its embeddings and first ``freeze`` blocks frozen (a fine-tuning variant)."""
    model = TinyGPT(len(vocabulary()), WIDTH, DEPTH, HEADS, CONTEXT)
    if freeze:
        model.tok.weight.requires_grad_(False)
        model.pos.requires_grad_(False)
        for block in model.layers[:freeze]:
            block.requires_grad_(False)
    return model


def tasks(steps: int) -> list[ray_saturn.Task]:
    out = []
    for lr in (1e-4, 3e-4):
        for freeze in (0, 3):
            task = gpt_task(width=WIDTH, depth=DEPTH, heads=HEADS, context=CONTEXT, lr=lr, max_steps=steps,
                            name=f"gpt-ft-lr{lr:g}-freeze{freeze}", strategies=("single", "ddp", "fsdp"))
            task.model = functools.partial(frozen_gpt, freeze=freeze)
            out.append(task)
    return out


def model_bytes() -> int:
    """Weights + gradients + two Adam moments, fp32: what one unsharded worker holds at least."""
    n = sum(p.numel() for p in TinyGPT(len(vocabulary()), WIDTH, DEPTH, HEADS, CONTEXT).parameters())
    return 16 * n


def main() -> None:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--local", action="store_true", help="start a local Ray with logical GPUs")
    parser.add_argument("--gpus", type=count("--gpus", high=MAX_GPUS_PER_NODE), default=4,
                        help="logical GPUs of the local Ray (--local; 4)")
    parser.add_argument("--steps", type=count("--steps", high=MAX_STEPS), default=200, help="steps per task (200)")
    parser.add_argument("--memory-limit-gb", type=positive("--memory-limit-gb", "GB"), default=None,
                        help="per-GPU memory budget (default on GPUs: 80%% of what one unsharded worker needs; "
                             "with --local: none)")
    parser.add_argument("--plan-only", action="store_true")
    parser.add_argument("--storage", default="/tmp/ray-saturn-runs/llm-grid")
    args = parser.parse_args()
    limit = args.memory_limit_gb
    if limit is None and not args.local:
        limit = 0.8 * model_bytes() / 1e9
    # Joins RAY_ADDRESS / a running cluster (unless --local); else a local Ray private to this process.
    ray_saturn.init_ray(args.gpus, fresh=args.local)
    cluster = ClusterSpec.from_ray()
    grid = tasks(args.steps)
    budget = f"budget {limit * 1e3:.1f} MB per GPU" if limit is not None else "no memory budget"
    print(f"model state {model_bytes() / 1e6:.1f} MB per unsharded worker; {budget}")
    profile = ray_saturn.profile(grid, cluster, memory_limit_gb=limit)
    plan = ray_saturn.plan(profile, cluster, "saturn", time_limit_s=10)
    baseline = ray_saturn.plan(profile, cluster, "fifo-whole-node", time_limit_s=10)
    print("plan:", plan.to_json())
    print(f"makespan {plan.makespan_s:.1f}s, lower bound {plan.lower_bound_s:.1f}s, "
          f"fifo-whole-node {baseline.makespan_s:.1f}s")
    if args.plan_only:
        return
    run = getattr(ray_saturn, "run", None)
    if run is None:
        raise SystemExit("this ray_saturn build has no ray_saturn.run yet (runtime branch); use --plan-only")
    result = run(grid, cluster, storage=args.storage, profile=profile, name="llm-grid")
    print(json.dumps(result.to_dict()))


if __name__ == "__main__":
    main()
