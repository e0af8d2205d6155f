"""Metrics: the RunMetrics API, and the series on the node's Prometheus endpoint."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest

from ray_saturn.metrics import MetricsError, RunMetrics


def test_snapshot_without_ray_is_recorded_and_validated():
    m = RunMetrics("r1")
    m.plan(planned_makespan_s=10.0, lower_bound_s=8.0)
    m.task_state("a", "running", gpus=2)
    m.task_progress("a", steps_done=3, total_steps=12, step_time_s=0.5)
    m.replanned(2)
    m.moved()
    m.task_state("a", "finished")
    snap = m.snapshot()
    assert snap["run"] == {"planned_makespan_s": 10.0, "lower_bound_s": 8.0, "replans": 2, "moves": 1}
    assert snap["tasks"]["a"] == {
        "state": "finished", "progress": 0.25, "steps_done": 3, "total_steps": 12, "gpus": 0, "step_time_s": 0.5,
    }


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.task_state("a", "sleeping"),
        lambda m: m.task_progress("a", steps_done=-1, total_steps=3),
        lambda m: m.plan(planned_makespan_s=float("nan"), lower_bound_s=1.0),
        lambda m: m.task_state("", "running"),
    ],
)
def test_bad_updates_are_one_line_errors(call):
    with pytest.raises(MetricsError) as err:
        call(RunMetrics("r"))
    assert "\n" not in str(err.value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.ray
def test_series_reach_the_prometheus_endpoint():
    import ray

    port = _free_port()
    ray.init(
        address="local",
        num_cpus=1,
        num_gpus=2,
        include_dashboard=False,
        _metrics_export_port=port,
        _system_config={"metrics_report_interval_ms": 500},
    )
    try:

        @ray.remote(num_cpus=0)
        class Driver:  # stands in for the runtime's driver actor
            def go(self):
                m = RunMetrics("metrics-test")
                m.plan(planned_makespan_s=123.5, lower_bound_s=100.25)
                m.task_state("gpt-a", "running", gpus=2)
                m.task_progress("gpt-a", steps_done=30, total_steps=120, step_time_s=0.75)
                m.replanned(3)
                m.moved()
                return m.snapshot()

        driver = Driver.remote()
        ray.get(driver.go.remote())
        wanted = {
            'ray_saturn_task_progress{': 0.25,
            'ray_saturn_task_gpus{': 2.0,
            'ray_saturn_task_step_time_s{': 0.75,
            'ray_saturn_run_planned_makespan_s{': 123.5,
            'ray_saturn_run_lower_bound_s{': 100.25,
        }
        deadline = time.monotonic() + 60
        found: dict[str, float] = {}
        text = ""
        while time.monotonic() < deadline and len(found) < len(wanted) + 2:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            found = {}
            for line in text.splitlines():
                if 'run="metrics-test"' not in line:
                    continue
                for prefix in wanted:
                    if line.startswith(prefix):
                        found[prefix] = float(line.rsplit(" ", 1)[1])
                if line.startswith("ray_saturn_task_state{") and 'state="running"' in line and 'task="gpt-a"' in line:
                    found["state"] = float(line.rsplit(" ", 1)[1])
                if line.startswith(("ray_saturn_run_replans{", "ray_saturn_run_replans_total{")):
                    found["replans"] = float(line.rsplit(" ", 1)[1])
            time.sleep(0.5)
        for prefix, value in wanted.items():
            assert found.get(prefix) == pytest.approx(value), (prefix, found)
        assert found.get("state") == 1.0
        assert found.get("replans") == 3.0
        assert 'task="gpt-a"' in text
    finally:
        ray.shutdown()
