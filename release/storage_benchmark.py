"""Checkpoint save and load on S3 against a local folder, for the demo's largest model (one run).

The model is the demo's largest task (``ray_saturn.demo.demo_tasks()[0]``, a
GPT of width 256, depth 4, AdamW). One process, strategy ``single``, after one
training step (so the optimizer state exists): ``save_checkpoint`` and
``load_checkpoint`` into a freshly prepared model, each ``--repeats`` times,
alternating local and S3, into

- a local folder (``tempfile``), and
- an S3 bucket on a moto server on 127.0.0.1 (``tests/s3_server.py``: real
  HTTP, real S3 protocol, credentials enforced; no network latency, so this is
  the overhead of the storage path itself, a lower bound for a real bucket).

Prints medians, the S3/local ratios and the checkpoint's size; ``--json`` writes them.

    python release/storage_benchmark.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()

    import torch
    from s3_server import s3_server

    from ray_saturn.demo import demo_tasks
    from ray_saturn.strategies import WorkerContext, get_strategy
    from ray_saturn.strategies.batching import DataStream
    from ray_saturn.strategies.checkpoint import load_checkpoint, save_checkpoint
    from ray_saturn.strategies.introspect import build_model

    torch.set_num_threads(1)
    task = demo_tasks()[0]
    ctx = WorkerContext(0, 1, torch.device("cpu"))
    strat = get_strategy("single")

    def runner():
        r = strat.prepare(build_model(task), task, {}, ctx)
        r.step(next(DataStream(task.data, task.hparams)))
        return r

    src = runner()
    params = sum(p.numel() for p in src.module.parameters())
    times: dict[str, dict[str, list[float]]] = {"local": {"save": [], "load": []}, "s3": {"save": [], "load": []}}
    sizes: dict[str, int] = {}
    with s3_server() as s3, s3.credentials(), tempfile.TemporaryDirectory() as local:
        where = {"local": os.path.join(local, "ckpt"), "s3": s3.uri("bench/ckpt")}
        for i in range(args.repeats + 1):  # the first round warms up (imports, connections) and is dropped
            for kind, d in where.items():
                t0 = time.perf_counter()
                path = save_checkpoint(d, src.module, src.optimizer, step=i + 1, data_position=i + 1,
                                       strategy="single", task=task.name)
                t1 = time.perf_counter()
                dst = runner()
                t2 = time.perf_counter()
                load_checkpoint(path, dst.module, dst.optimizer, d)
                t3 = time.perf_counter()
                dst.close()
                if i > 0:
                    times[kind]["save"].append(t1 - t0)
                    times[kind]["load"].append(t3 - t2)
        sizes["local"] = sum(
            f.stat().st_size for f in Path(where["local"]).rglob("*") if f.is_file() and "step-" in str(f.parent)
        ) // 2  # keep=2: two checkpoints are there
    med = {k: {op: statistics.median(v) for op, v in ops.items()} for k, ops in times.items()}
    out = {
        "model": f"{task.name} ({params / 1e6:.2f} M parameters, AdamW)",
        "checkpoint_mb": round(sizes["local"] / 1e6, 1),
        "repeats": args.repeats,
        "local_save_s": round(med["local"]["save"], 4),
        "s3_save_s": round(med["s3"]["save"], 4),
        "local_load_s": round(med["local"]["load"], 4),
        "s3_load_s": round(med["s3"]["load"], 4),
        "save_ratio": round(med["s3"]["save"] / med["local"]["save"], 2),
        "load_ratio": round(med["s3"]["load"] / med["local"]["load"], 2),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
