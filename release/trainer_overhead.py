"""Release check: what a TorchTrainer segment costs outside its steps, at a given controller poll.

    PYTHONPATH=. python release/trainer_overhead.py [--poll 2.0 0.5] [--fits 4]

For each poll interval (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``; ``default`` is
Ray's own), in a fresh child process with its own local Ray of 2 logical
GPUs, it runs ``--fits`` one-GPU TorchTrainer runs one after the other, each
a loop that stamps the time and returns, and prints per run the seconds from
``fit()`` to the loop (start) and from the loop's end to ``fit()`` returning
(stop): what a finished segment keeps its GPUs after its last step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, os, sys, tempfile, time
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, logging_level="ERROR")


@ray.remote(num_cpus=0)
class Stamp:
    def __init__(self):
        self.t = None

    def mark(self, t):
        self.t = t

    def get(self):
        return self.t


def loop(config):
    import torch  # noqa: F401  (a segment's loop imports it first)

    ray.get(config["stamp"].mark.remote(time.time()))


out = []
folder = tempfile.mkdtemp(prefix="trainer-overhead-")
for i in range(int(sys.argv[1])):
    stamp = Stamp.remote()
    ray.get(stamp.get.remote())
    trainer = TorchTrainer(loop, train_loop_config={"stamp": stamp}, torch_config=TorchConfig(backend="gloo"),
                           scaling_config=ScalingConfig(num_workers=1, use_gpu=True),
                           run_config=RunConfig(name=f"fit-{i}", storage_path=folder))
    t0 = time.time()
    trainer.fit()
    t1 = time.time()
    mark = ray.get(stamp.get.remote())
    out.append({"start_s": round(mark - t0, 2), "stop_s": round(t1 - mark, 2)})
print(json.dumps(out))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--poll", nargs="+", default=["default", "0.5"],
                        help="controller poll intervals in seconds ('default': Ray's own)")
    parser.add_argument("--fits", type=int, default=4)
    args = parser.parse_args()
    for poll in args.poll:
        env = {k: v for k, v in os.environ.items() if k != "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"}
        if poll != "default":
            env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = str(float(poll))
        proc = subprocess.run([sys.executable, "-c", CHILD, str(args.fits)], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"poll {poll}: failed: {proc.stderr.strip().splitlines()[-1:]}")
            return 1
        fits = json.loads(proc.stdout.strip().splitlines()[-1])
        starts = ", ".join(f"{f['start_s']:.2f}" for f in fits)
        stops = ", ".join(f"{f['stop_s']:.2f}" for f in fits)
        print(f"poll {poll}: start {starts} s; stop {stops} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
