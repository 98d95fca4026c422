"""A dead sweep is known by its missed heartbeat, on any host (pipeline.tracking.runs.close_orphans), against a real
MLflow store: a stale heartbeat's runs are closed as KILLED with why; a sweep beating on another host is left alone; a
heartbeat that stops while watched is missed after 3 beats; a dead driver on this host is known by its pid at once; a
heartbeat of a newer version is a named error, before anything is closed. tests/test_resume.py kills a sweep on one
host and resumes it on another."""

from __future__ import annotations

import json
import re
import socket
import time

import pytest
from mlflow.tracking import MlflowClient

from pipeline.tracking.runs import (
    HEARTBEAT,
    MISSED,
    Heartbeat,
    HeartbeatError,
    beat,
    close_orphans,
    driver_tags,
)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """One store for the module (making its tables takes seconds), an experiment per test."""
    return MlflowClient(f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}")


@pytest.fixture
def store(client, tmp_path, request):
    return client, client.create_experiment(request.node.name, artifact_location=tmp_path.as_uri())


def sweep(client: MlflowClient, experiment: str, host: str, heartbeat: str | None, pid: str = "1") -> tuple[str, str]:
    """A RUNNING parent (as a sweep's driver tags it) and a RUNNING child; returns their ids."""
    tags = {"stage": "sweep", "driver_host": host, "driver_pid": pid, "driver_started": "0.0"}
    parent = client.create_run(experiment, tags=tags | ({HEARTBEAT: heartbeat} if heartbeat else {})).info.run_id
    child = client.create_run(experiment, tags={"mlflow.parentRunId": parent}).info.run_id
    return parent, child


def status(client: MlflowClient, run_id: str) -> tuple[str, str | None]:
    run = client.get_run(run_id)
    return run.info.status, run.data.tags.get("reason")


def stale(every_s: float = 30, age: float = 3600) -> str:
    return json.dumps({"version": 1, "at": time.time() - age, "every_s": every_s})


def test_a_sweep_whose_heartbeat_stopped_long_ago_on_another_host_is_closed_at_once(store):
    client, experiment = store
    parent, child = sweep(client, experiment, "node-7", stale())
    began = time.monotonic()
    assert close_orphans(client, experiment) == [parent]
    assert time.monotonic() - began < 5  # no watching: missed beyond any clock skew
    assert status(client, parent)[0] == "KILLED" and "node-7) missed 3 heartbeats" in status(client, parent)[1]
    assert status(client, child) == ("KILLED", f"killed: its sweep's driver is gone: {status(client, parent)[1][8:]}")


def test_a_sweep_beating_on_another_host_is_left_alone_and_one_that_stops_is_missed_after_three_beats(store):
    client, experiment = store
    alive, alive_child = sweep(client, experiment, "node-1", beat(0.5))
    silent, _ = sweep(client, experiment, "node-2", beat(0.5))  # a fresh beat, and then none
    heart = Heartbeat(client, alive, 0.5)
    try:
        began = time.monotonic()
        assert close_orphans(client, experiment) == [silent]
        assert MISSED * 0.5 <= time.monotonic() - began < 10
    finally:
        heart.stop()
    assert status(client, alive) == ("RUNNING", None) and status(client, alive_child) == ("RUNNING", None)
    assert status(client, silent)[0] == "KILLED"


def test_a_dead_driver_on_this_host_is_known_by_its_process_and_a_live_one_left_alone(store):
    client, experiment = store
    me = driver_tags(30)  # this process: alive
    live = client.create_run(experiment, tags=me | {"stage": "sweep"}).info.run_id
    dead, _ = sweep(client, experiment, socket.gethostname(), beat(30), pid="999999999")  # a fresh beat: still dead
    assert close_orphans(client, experiment) == [dead]
    assert "died before the sweep ended" in status(client, dead)[1]
    assert status(client, live) == ("RUNNING", None)


def test_a_sweep_of_a_version_before_heartbeats_on_another_host_is_left_alone(store):
    client, experiment = store
    old, _ = sweep(client, experiment, "node-3", None)
    assert close_orphans(client, experiment) == [] and status(client, old) == ("RUNNING", None)


@pytest.mark.parametrize("tag, named", [
    (json.dumps({"version": 2, "at": 0, "every_s": 30}), "heartbeat tag of version 2, newer than this checkout's (1)"),
    ("not json", "is not a heartbeat this version reads"),
    (json.dumps({"version": 1}), "lacks a time or an interval"),
])
def test_a_heartbeat_this_version_cannot_read_is_a_named_error_and_nothing_is_closed(store, tag, named):
    client, experiment = store
    dead, _ = sweep(client, experiment, "node-4", stale())
    sweep(client, experiment, "node-5", tag)
    with pytest.raises(HeartbeatError, match=re.escape(named)):
        close_orphans(client, experiment)
    assert status(client, dead) == ("RUNNING", None)
