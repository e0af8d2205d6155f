"""A fake Tune around SaturnScheduler: trials, the controller's whitelisted interface, a clock.

The fixtures that patch them in (``fake_tune``, ``no_background``) are in conftest.py.
"""

from __future__ import annotations


class FakeTrial:
    PENDING, RUNNING, PAUSED, TERMINATED, ERROR = "PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR"

    def __init__(self, tid, config):
        self.trial_id, self.config, self.status = tid, dict(config), self.PENDING
        self.placement_group_factory = None

    def set_status(self, status):
        self.status = status

    def update_resources(self, pgf):
        assert self.status != self.RUNNING, "Tune refuses to resize a running trial"
        self.placement_group_factory = pgf

    def invalidate_json_state(self):
        pass

    @property
    def gpus(self):
        return self.placement_group_factory.required_resources.get("GPU", 0)


class FakeTune:
    """What a scheduler may touch of Tune's controller (its whitelisted interface)."""

    _reuse_actors = False

    def __init__(self, scheduler):
        self.s, self.trials, self.started = scheduler, {}, []

    def get_trials(self):
        return list(self.trials.values())

    def _set_trial_status(self, trial, status):
        trial.status = status
        if status == FakeTrial.PENDING:
            self.started.append(trial.trial_id)

    def add(self, tid, config):
        t = FakeTrial(tid, config)
        self.trials[tid] = t
        self.s.on_trial_add(self, t)
        return t

    def step(self):
        """One Tune step: the chosen trial and every trial set PENDING start running."""
        chosen = self.s.choose_trial_to_run(self)
        if chosen is not None:
            self.started.append(chosen.trial_id)
        out = []
        for tid in self.started:
            self.trials[tid].status = FakeTrial.RUNNING
            out.append(tid)
        self.started = []
        return out

    def result(self, tid, step, step_time, total=None, pid=None):
        """A result of trial ``tid``; ``pid``: the actor process it came from (Tune fills it in every result)."""
        t = self.trials[tid]
        total = total if total is not None else t.config.get("steps", 100)
        result = {"saturn_step": step, "saturn_step_time_s": step_time, "saturn_total_steps": total}
        if pid is not None:
            result.update(pid=pid, hostname="host-0")
        return self.s.on_trial_result(self, t, result)

    def complete(self, tid):
        t = self.trials[tid]
        t.status = FakeTrial.TERMINATED
        self.s.on_trial_complete(self, t, {})


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t
