"""The runtime on Ray: a driver actor executes the plan and keeps it current.

Parts (one module each):

- :mod:`~ray_saturn.runtime.driver`: the driver, an explicit state machine
  (planning, launching, running, re-planning, moving, finished, failed),
  steppable one iteration at a time. Its decisions come from the control
  plane (:mod:`ray_saturn.control`), the same objects the simulator runs.
- :mod:`~ray_saturn.runtime.records`: per-task records (state read from the
  control plane's task progress) and the run's result;
  :mod:`~ray_saturn.runtime.config`: the driver's and the run's settings.
- :mod:`~ray_saturn.runtime.journal`: the run folder's file names and their
  readers and writers (state, events, plan, settings, profile).
- :mod:`~ray_saturn.runtime.ledger` and :mod:`~ray_saturn.runtime.pg_manager`:
  the GPU ledger and the placement groups that hold each decision's GPUs,
  and the hand-over of those GPUs to Ray Train V2's TorchTrainer.
- :mod:`~ray_saturn.runtime.launcher`: the launcher protocol (launch, stop,
  poll typed events) and the worker-side progress reporter.
- :mod:`~ray_saturn.runtime.train_launcher`: a TorchTrainer run per segment.
- :mod:`~ray_saturn.runtime.emulated`: the sleep-per-step workload of
  ``ray-saturn emulate``; :mod:`~ray_saturn.runtime.fake`: Ray-free launcher
  and ledger for tests.
- :mod:`~ray_saturn.runtime.storage`: the run folder (local or pyarrow URI).
- :mod:`~ray_saturn.runtime.api`: ``run``, ``resume``, ``run_status``;
  :mod:`~ray_saturn.runtime.emulation`: ``emulate`` and its local cluster;
  :mod:`~ray_saturn.runtime.actor`: the driver actor both start
  (re-exported from :mod:`ray_saturn`).

What the emulated path exercises and what it does not: ``emulate`` runs the
same driver actor, control plane, ledger, placement groups (one hold per
decision, on the planned nodes), progress board, checkpoint folder layout,
re-planning, moves, node-loss handling and resume as a training run. Its
segments are Ray tasks inside the hold's bundle that sleep per step and
checkpoint a step counter, instead of TorchTrainer runs: it does not
exercise Ray Train's controller, the TorchTrainer hand-over (label
selectors), torch.distributed, the strategies or DCP checkpoints.

Example:
    >>> import ray_saturn
    >>> callable(ray_saturn.run) and callable(ray_saturn.emulate)
    True
"""
