"""Stopping when asked (pipeline/common/signals.py), on real processes and signals: a command run in a process group of
its own is stopped whole, SIGINT first, and its runner returns once the group is gone; the sweep's stop request is
raised where it is safe, once however many senders repeat it, and forced by a later one; the report never leaves a
half-written page, table or metrics file, whenever the signal comes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from pipeline.common import signals
from tests.helpers import ROOT
from tests.helpers.tables import rows

# a command of two processes in one group, each writing which signal reached it and exiting 128 + its number; the
# child ignores nothing, the parent waits for it (as dvc waits for its stage)
FAMILY = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    out = sys.argv[1]
    def note(who):
        def handler(signum, frame):
            with open(f"{out}/{who}", "w") as f:
                f.write(signal.Signals(signum).name)
            os._exit(128 + signum)
        return handler
    if len(sys.argv) > 2:
        signal.signal(signal.SIGINT, note("child"))
        open(f"{out}/child-ready", "w").close()
        time.sleep(60)
    child = subprocess.Popen([sys.executable, __file__, out, "child"])
    signal.signal(signal.SIGINT, note("parent"))
    child.wait()
""")


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.05)


def runner(script: Path, out: Path, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeline.common.signals", *args, "--", sys.executable,
                             str(script), str(out)], stderr=subprocess.PIPE, text=True, **popen)


@pytest.mark.parametrize("request_signal", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1], ids=lambda s: s.name)
def test_a_stop_request_to_the_runner_reaches_its_whole_process_group_as_sigint(tmp_path, request_signal):
    script = tmp_path / "family.py"
    script.write_text(FAMILY)
    # started as a shell starts a background job, ignoring SIGINT: the command must not inherit that
    proc = runner(script, tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    wait_for(tmp_path / "child-ready")
    proc.send_signal(request_signal)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err  # the command's status: its parent process ended by SIGINT
    assert (tmp_path / "parent").read_text() == (tmp_path / "child").read_text() == "SIGINT"
    assert f"{signal.Signals(request_signal).name}: stopping" in err


def test_a_command_whose_time_is_up_is_stopped_whole_as_on_a_request(tmp_path):
    """``--stop-after``: a RayJob's driver stops itself before KubeRay's deadline, as a stop request stops it."""
    script = tmp_path / "family.py"
    script.write_text(FAMILY)
    began = time.monotonic()
    proc = runner(script, tmp_path, "--stop-after", "2")
    wait_for(tmp_path / "child-ready")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert (tmp_path / "parent").read_text() == (tmp_path / "child").read_text() == "SIGINT"
    assert "its 2 s (--stop-after) are up: stopping" in err and 2 <= time.monotonic() - began < 20


def test_a_stop_after_that_is_no_time_is_refused_before_the_command_runs(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pipeline.common.signals", "--stop-after", "0", "--", "touch",
                           str(tmp_path / "ran")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--stop-after: 0 is not a positive number of seconds" in done.stderr
    assert not (tmp_path / "ran").exists()


def test_what_ignores_sigint_gets_sigterm_after_the_grace_and_the_runner_waits_for_the_whole_group(tmp_path):
    script = tmp_path / "stubborn.py"
    script.write_text(textwrap.dedent("""
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if len(sys.argv) > 2:  # a grandchild that outlives the command, as a DVC stage outlives dvc
            open(sys.argv[1] + "/ready", "w").close()
            time.sleep(60)
        subprocess.Popen([sys.executable, __file__, sys.argv[1], "child"], start_new_session=False)
        time.sleep(60)
    """))
    began = time.monotonic()
    proc = runner(script, tmp_path, "--grace", "1")
    wait_for(tmp_path / "ready")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM and "SIGTERM" in err.splitlines()[-1], err
    assert time.monotonic() - began < 20  # the grace, not the command's 60 s
    listed = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout.split()
    assert not listed, listed  # nothing of the group is left


def test_the_runner_names_a_command_it_cannot_run(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pipeline.common.signals", "--", str(tmp_path / "nothing")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 127 and "cannot run" in done.stderr


SWEEPLIKE = textwrap.dedent("""
    import sys, time
    from pipeline.common.signals import STOP, Stopped
    STOP.install(float(sys.argv[2]))
    try:
        with STOP.deferred():  # Tune's loop: a signal is raised at its next step
            open(sys.argv[1], "w").close()
            while True:
                time.sleep(0.05)
                STOP.check()
    except Stopped as err:
        print(f"stopped: {err}", flush=True)
        time.sleep(float(sys.argv[3]))  # its clean-up: no signal may cut it short
        print("cleaned up", flush=True)
        sys.exit(err.code)
""")


def sweeplike(tmp_path: Path, timeout: float = 30, cleanup: float = 0) -> subprocess.Popen:
    script = tmp_path / "sweeplike.py"
    script.write_text(SWEEPLIKE)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "ready"), str(timeout), str(cleanup)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(tmp_path / "ready")
    return proc


def test_the_sweeps_stop_request_is_raised_at_its_next_safe_point_and_repeats_do_not_cut_its_cleanup(tmp_path):
    proc = sweeplike(tmp_path, cleanup=1.5)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)  # the same request from another sender (a runner passing it on)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)  # during the clean-up: ignored
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert out.splitlines() == ["stopped: stopped by SIGTERM", "cleaned up"]
    assert "SIGTERM received: stopping" in err


def test_a_stop_that_hangs_is_forced_after_its_timeout_and_the_process_ends_after_twice_that(tmp_path):
    script = tmp_path / "hung.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from pipeline.common.signals import STOP
        STOP.install(1.0)
        with STOP.deferred():  # a loop that never checks: the watchdog forces the stop
            open(sys.argv[1], "w").close()
            try:
                while True:
                    time.sleep(0.05)
            except SystemExit as err:
                print(f"forced: {err}", flush=True)
                while True:  # a clean-up that hangs: the process ends anyway
                    time.sleep(0.05)
    """))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "ready")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for(tmp_path / "ready")
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and out.strip() == "forced: stopped by SIGTERM (forced)", (out, err)
    assert 1.5 < time.monotonic() - began < 10 and "not stopped 2 s after SIGTERM: exiting" in err


@pytest.mark.parametrize("shell", ["/bin/sh", "/bin/bash"])
def test_a_stage_stops_when_the_process_that_ran_it_ends_through_a_shell_that_outlives_it(tmp_path, shell):
    """As dvc runs a stage (``$SHELL -c COMMAND``): dash does not exec COMMAND and outlives dvc, bash does; either
    way the stage watches dvc (a stand-in here, killed), not the shell, and stops saying why."""
    stage = tmp_path / "stage.py"
    stage.write_text(textwrap.dedent("""
        import os, sys, time
        from pipeline.common.signals import STOP, Stopped

        def say(path, text):  # whole or not at all: the test reads the file once it exists
            with open(path + ".part", "w") as f:
                f.write(text)
            os.replace(path + ".part", path)

        STOP.install()
        STOP.with_parent()
        say(sys.argv[1], str(STOP.parent))
        try:
            time.sleep(60)
        except Stopped as err:
            say(sys.argv[2], str(err))
    """))
    dvc = tmp_path / "dvc.py"  # runs the stage as dvc does and waits for it
    dvc.write_text(f"import subprocess, sys; subprocess.run([{shell!r}, '-c', sys.argv[1]])")
    ready, stopped = tmp_path / "ready", tmp_path / "stopped"
    command = f"{sys.executable} {stage} {ready} {stopped}"
    proc = subprocess.Popen([sys.executable, str(dvc), command], cwd=ROOT)
    wait_for(ready)
    assert ready.read_text() == str(proc.pid)  # the shell, exec'd or not, skipped
    proc.kill()
    proc.wait()
    wait_for(stopped, 10)
    assert stopped.read_text() == f"stopped by SIGTERM (its parent process {proc.pid}, which ran it (dvc), ended)"


def test_a_signal_held_back_is_raised_when_the_block_ends():
    seen = []
    with pytest.raises(signals.Stopped) as stopped, signals.exit_on_signals():
        with signals.held():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            seen.append("block ended")
    assert seen == ["block ended"] and stopped.value.code == 143


def test_a_stop_that_lands_in_a_weakref_callback_stops_the_process_with_no_traceback(tmp_path):
    """A signal handled while Python runs a weakref callback (importlib runs one as each import ends: a launcher
    stopped while it imports), where the ``Stopped`` it raises cannot unwind and Python would print it as ignored and
    go on: delivered again, it stops the process as a signal anywhere else does."""
    script = tmp_path / "callback.py"
    script.write_text(textwrap.dedent("""
        import os, signal, weakref
        from pipeline.common.signals import exit_on_signals

        class Held: pass

        def callback(ref):
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the next instruction, here inside the callback
            sum(range(1000))

        with exit_on_signals():
            held = Held()
            ref = weakref.ref(held, callback)
            del held
            print("went on after the callback", flush=True)
            sum(range(10**8))
            print("not stopped", flush=True)
    """))
    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert done.returncode == 128 + signal.SIGTERM and "not stopped" not in done.stdout, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "ignored" not in done.stderr, done.stderr


# ---- the report: whole or not at all


@pytest.fixture
def reported(tmp_path):
    """A report written once from a synthetic table (the old one a later run replaces), and how to write it again."""
    from pipeline.report import main

    table = pd.DataFrame(rows("lis", "standard", 2, {4: 16, 6: 32}) + rows("lis", "sparse", 2, {4: 16, 6: 64}))
    table.assign(mlflow_run_id="r").to_csv(tmp_path / "sweep.csv", index=False)
    paths = {"out": tmp_path / "report", "metrics": tmp_path / "report.json", "plots": tmp_path / "plots"}
    argv = ["--results", str(tmp_path / "sweep.csv"), "--no-mlflow", "--params", str(tmp_path / "params.yaml")]
    argv += [x for key, path in paths.items() for x in (f"--{key}", str(path))]
    params = (ROOT / "params.yaml").read_text()
    (tmp_path / "params.yaml").write_text(params.replace("profile: laptop", "profile: tiny"))
    assert main(argv) == 0
    return lambda: main(argv), paths


def snapshot(paths: dict) -> dict:
    return {str(f): f.read_bytes() for p in paths.values() for f in ([p] if p.is_file() else sorted(p.rglob("*")))
            if f.is_file() and f.name != "index.html"}  # the page says when it was made


def leftovers(paths: dict) -> list[Path]:
    return [p for p in paths["out"].parent.iterdir() if p.name.endswith(".tmp")]


def test_a_signal_while_the_report_is_written_leaves_the_last_one_whole(reported, monkeypatch):
    again, paths = reported
    before = snapshot(paths)
    json.loads(paths["metrics"].read_text())  # whole
    import pipeline.report as stage

    def killed_while_drawing(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
        raise AssertionError("SIGTERM did not stop the report")

    monkeypatch.setattr(stage, "page", killed_while_drawing)
    with pytest.raises(SystemExit) as stopped:
        again()
    assert stopped.value.code == 143
    assert snapshot(paths) == before and not leftovers(paths)


def test_a_signal_while_the_new_report_replaces_the_old_lets_all_of_it_in_first(reported, monkeypatch):
    again, paths = reported
    (paths["out"] / "old").write_text("from the last report")
    import pipeline.report as stage

    real = os.replace
    calls = []

    def signalled_replace(src, dst):
        if not calls:
            os.kill(os.getpid(), signal.SIGTERM)  # between the first rename and the others
        calls.append(dst)
        real(src, dst)

    monkeypatch.setattr(stage.os, "replace", signalled_replace)
    with pytest.raises(SystemExit) as stopped:
        again()
    assert stopped.value.code == 143 and len(calls) == 3  # the plots, the report, the metrics: all in place
    assert not (paths["out"] / "old").exists() and (paths["out"] / "index.html").exists()
    assert json.loads(paths["metrics"].read_text())["cells"] > 0 and not leftovers(paths)
