"""Why gpu_check trains its exactness check with SGD + momentum, not Adam: the same weights two ways.

On CUDA (the CPU if there is none): ``single`` with the optimizer's for-loop kernel against its foreach kernel
(same device, other rounding), and ``spill`` (optimizer on the CPU) against ``single``; with Adam and with SGD +
momentum. MLP width 4096, depth 8, lr 0.01, 8 steps, TF32 off. Prints the largest relative loss difference and,
per weight tensor (the worst), the largest difference / largest weight and the Frobenius relative difference.

    python release/optimizer_rounding.py

On one H200 (2026-12-04) Adam gave 0.49 and 0.72 (largest difference) with losses within 5e-7; SGD + momentum
gave 0 for both (release/README.md, "GPU check"). On a CPU every figure is 0 (one kernel order).
"""

import torch

from ray_saturn.strategies import WorkerContext, get_strategy
from ray_saturn.strategies.batching import DataStream
from ray_saturn.strategies.introspect import build_model
from ray_saturn.toy import mlp_task

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def train(task, strategy="single", foreach=None):
    runner = get_strategy(strategy).prepare(
        build_model(task), task, {"shards": 2} if strategy == "spill" else {}, WorkerContext(0, 1, dev)
    )
    if foreach is not None:
        for g in runner.optimizer.param_groups:
            g["foreach"] = foreach
    s = DataStream(task.data, task.hparams, 0)
    losses = [runner.step(next(s)) for _ in range(8)]
    return losses, {k: v.detach().float().cpu() for k, v in runner.module.state_dict().items()}


def cmp(name, x, ref):
    (la, a), (lb, b) = x, ref
    loss = max(abs(p - q) / abs(q) for p, q in zip(la, lb, strict=True))
    mx = max(float((a[k] - b[k]).abs().max() / b[k].abs().max()) for k in b)
    fr = max(float((a[k] - b[k]).norm() / b[k].norm()) for k in b)
    print(f"{name:<44} loss rel {loss:.1e}  weight max-abs rel {mx:.1e}  weight frobenius rel {fr:.1e}", flush=True)


for opt in ("adam", "sgd"):
    task = mlp_task("ctl", features=4096, width=4096, depth=8, batch_size=64, batches=4, max_steps=8, optimizer=opt)
    ref = train(task)
    cmp(f"{opt}: single, for-loop optimizer vs foreach", train(task, foreach=False), ref)
    cmp(f"{opt}: spill (optimizer on the CPU) vs single", train(task, "spill"), ref)
