"""Stopping when asked. SIGTERM (a scheduler's notice, `ray job stop`, a pod's termination, `systemctl stop`, kill)
and SIGINT (Ctrl-C) end a stage cleanly and within a bounded time, instead of Python's default for SIGTERM (death,
no clean-up):

- ``exit_on_signals``: generate and report unwind as from an error (their staging files removed, nothing
  half-written), and exit with 128 + the signal's number, as a shell reports a killed command; ``held`` keeps a
  signal out of a few lines that must run whole (a report's directories swapped in).
- ``Stop``: the sweep's (``STOP``). A signal unwinds it at once (``Stopped``), except inside Ray Tune's loop
  (``deferred``), where Tune's next step raises it (``pipeline.scheduling.tuning.StopOnSignal``), between two events
  of its trials. A second signal, or ``timeout`` seconds, raises it wherever the sweep is, and ``timeout`` more end
  the process (``os._exit``), whatever it waits on. A sweep that DVC runs stops too when dvc dies (``with_parent``):
  DVC forwards no signal to its stage.
- ``run_group`` (``python -m pipeline.common.signals [--grace S] [--stop-after S] -- COMMAND...``): COMMAND in a
  process group of its own, which a stop request to the runner (SIGTERM, SIGINT, SIGUSR1), or its own time running
  out (``--stop-after``: a RayJob's ``CAPACITY_ATLAS_STOP_AFTER_S``, before KubeRay's deadline), reaches whole:
  SIGINT to the group, as a terminal's Ctrl-C, which DVC passes to its stage by waiting for it (it ignores SIGINT
  meanwhile) and Ray's own processes ignore (they start with SIGINT blocked); SIGTERM to what is left after
  ``grace`` seconds, SIGKILL 10 s later. What the launchers start `dvc repro` with (ops/slurm, ops/ray-job,
  ops/nightly through pipeline.nightly).

Standard library only: the launchers run it by module before anything else is imported.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOP_REQUESTS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)  # what run_group passes on (USR1: Slurm's notice)
KILL_AFTER_S = 10.0  # run_group: from SIGTERM to SIGKILL of what is left of the group
SAME_REQUEST_S = 2.0  # signals this close to the first are the same request, from several senders
SHELLS = {"sh", "dash", "bash", "zsh", "fish"}  # what dvc may run a stage's command with


def name(signum: int) -> str:
    return signal.Signals(signum).name


class Stopped(SystemExit):
    """The process was asked to stop by signal ``signum``; exits with 128 + ``signum`` unless caught."""

    def __init__(self, signum: int, why: str = ""):
        super().__init__(128 + signum)
        self.signum, self.why = signum, why

    def __str__(self) -> str:
        return f"stopped by {name(self.signum)}{f' ({self.why})' if self.why else ''}"


@contextlib.contextmanager
def exit_on_signals() -> Iterator[None]:
    """SIGTERM and SIGINT unwind like an error (``Stopped``), so that clean-ups run at once. A signal the caller
    ignores stays ignored (a shell starts background jobs ignoring SIGINT). A ``Stopped`` raised where Python cannot
    unwind it (in a weakref callback or a ``__del__``: importlib runs one as an import ends), which Python would print
    as ignored and go on, is delivered again, to land where it can."""

    def unwind(signum: int, frame) -> None:
        for sig in SIGNALS:  # a second signal must not interrupt the clean-up
            signal.signal(sig, signal.SIG_IGN)
        raise Stopped(signum)

    def again(unraisable) -> None:
        if not isinstance(unraisable.exc_value, Stopped):
            hook(unraisable)
            return
        for sig in previous:
            signal.signal(sig, unwind)
        # sent from another thread a moment later: sent from here, it would be handled in this hook, unraisable again
        later = threading.Timer(0.01, os.kill, (os.getpid(), unraisable.exc_value.signum))
        later.daemon = True
        later.start()

    previous = {sig: signal.signal(sig, unwind) for sig in SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}
    hook, sys.unraisablehook = sys.unraisablehook, again
    try:
        yield
    finally:
        sys.unraisablehook = hook
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """SIGTERM and SIGINT held back while the block runs (a few renames that must happen together); one that came
    meanwhile is raised again as the block ends, to the handler there was."""
    pending: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, frame: pending.append(signum))
        for sig in SIGNALS
        if signal.getsignal(sig) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in pending:
            signal.raise_signal(signum)


def runner() -> int:
    """The nearest ancestor of this process that is not a shell running a command (``sh -c ...``)."""
    parent = os.getppid()
    while parent > 1 and is_shell(parent):
        parent = parent_of(parent)
    return parent


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:  # "pid (comm) state ppid ...", comm may hold spaces and parentheses
        return int(f.read().rsplit(")", 1)[1].split()[1])


def is_shell(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return False
    return os.path.basename(args[0].decode(errors="replace")).lstrip("-") in SHELLS and b"-c" in args[1:]


class Stop:
    """The sweep's stop requests (one per process, ``STOP``): ``install`` its handlers (again after ``ray.init``,
    which sets its own for SIGTERM), ``deferred`` around Tune's loop, ``check`` from Tune's loop. ``signum`` is the
    first signal's, None before one came."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.since = 0.0  # when it came (time.monotonic)
        self.raised = False  # Stopped raised: the clean-up is under way
        self.timed_out = False  # the watchdog forces the stop
        self.why = ""
        self.timeout = 30.0
        self.deferring = False
        self.ignored: set[int] | None = None  # signals ignored when first installed: left so
        self.parent: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def install(self, timeout: float | None = None) -> None:
        if timeout is not None:
            self.timeout = timeout
        if self.ignored is None:
            self.ignored = {sig for sig in SIGNALS if signal.getsignal(sig) is signal.SIG_IGN}
        for sig in SIGNALS:
            if sig not in self.ignored:
                signal.signal(sig, self._handle)

    def with_parent(self) -> None:
        """SIGTERM to this process when the process that ran it ends (Linux): a DVC stage's is dvc, which dies of a
        SIGTERM without passing it on. dvc runs a stage through ``$SHELL -c``, and a shell that does not exec its
        command (dash) outlives dvc, so the process watched is the nearest ancestor that is not such a shell."""
        try:
            pid = runner()
            handle = os.pidfd_open(pid)  # a handle on that very process: its pid may be reused once it is reaped
        except (AttributeError, OSError):
            return  # not Linux 5.3+, or it is gone already: the launchers signal the whole process group anyway
        self.parent = pid
        threading.Thread(target=self._watch, args=(handle,), name="parent-watch", daemon=True).start()

    def _watch(self, handle: int) -> None:
        select.select([handle], [], [])  # readable once the process has ended
        if self.signum is None:
            self.why = f"its parent process {self.parent}, which ran it (dvc), ended"
        os.kill(os.getpid(), signal.SIGTERM)

    def _handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            # the same request from several senders (a whole process tree or cgroup signalled, and a runner passing
            # it on) comes at once; a later one, or the timeout, forces the stop, unless it is under way already:
            # nothing may cut its clean-up short (the watchdog bounds it)
            if self.raised or (time.monotonic() - self.since < SAME_REQUEST_S and not self.timed_out):
                return
            self.raised = True
            raise Stopped(self.signum, f"{self.why}; forced" if self.why else "forced")
        self.signum, self.since = signum, time.monotonic()
        print(
            f"sweep: {name(signum)} received{f' ({self.why})' if self.why else ''}: stopping; its unfinished trials "
            f"continue from their checkpoints when it runs again (a second signal, or {self.timeout:g} s, forces it)",
            file=sys.stderr,
            flush=True,
        )
        threading.Thread(target=self._watchdog, name="stop-watchdog", daemon=True).start()
        if not self.deferring:
            self.raised = True
            raise Stopped(signum, self.why)

    def _watchdog(self) -> None:
        """``timeout`` seconds after the request, the stop is forced wherever the sweep is; ``timeout`` more, the
        process ends as it is (a later sweep closes its MLflow runs: ``pipeline.tracking.runs.close_orphans``)."""
        time.sleep(self.timeout)
        assert self.signum is not None
        self.timed_out = True
        signal.raise_signal(self.signum)
        time.sleep(self.timeout)
        print(
            f"sweep: not stopped {2 * self.timeout:g} s after {name(self.signum)}: exiting", file=sys.stderr, flush=True
        )
        os._exit(128 + self.signum)

    def check(self) -> None:
        """Raises ``Stopped`` if a stop was requested (Tune's loop calls this at every step)."""
        if self.signum is not None and not self.raised:
            self.raised = True
            raise Stopped(self.signum, self.why)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """A signal inside the block is only noted: ``check`` raises it at a safe point."""
        self.install()
        self.deferring = True
        try:
            yield
        finally:
            self.deferring = False
        self.check()


STOP = Stop()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user in it: alive
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def run_group(cmd: list[str], grace: float, stop_after: float | None = None, **popen) -> int:
    """Runs ``cmd`` in a session (a process group) of its own and returns its exit status (128 + the signal's
    number if it is stopped). A stop request to this process (SIGTERM, SIGINT, SIGUSR1), or ``stop_after`` seconds
    since ``cmd`` started, sends SIGINT to the group; then, once ``grace`` seconds have passed with some of it left,
    SIGTERM; ``KILL_AFTER_S`` later SIGKILL. It returns once the whole group is gone, not only ``cmd``'s process: a DVC
    stage outlives dvc."""
    asked: list[int] = []

    def request(signum: int, frame) -> None:
        asked.append(signum)

    previous = {sig: signal.signal(sig, request) for sig in STOP_REQUESTS}
    try:
        # the handlers above are reset to the default in the child at exec, so that SIGINT is not ignored there even
        # where this process was started ignoring it (a shell's background job)
        proc = subprocess.Popen(cmd, start_new_session=True, **popen)
        began = time.monotonic()
        pgid, status = proc.pid, None
        interrupted = False
        term_at: float | None = None  # when what is left of the group gets SIGTERM
        kill_at: float | None = None
        while status is None or group_alive(pgid):
            if status is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    status = proc.wait(timeout=0.2)
            else:
                time.sleep(0.2)
            now = time.monotonic()
            timed_out = stop_after is not None and status is None and now - began >= stop_after
            if (asked or timed_out) and not interrupted:
                why = name(asked[0]) if asked else f"its {stop_after:g} s (--stop-after) are up"
                say(f"{why}: stopping `{' '.join(cmd)}` (SIGINT to its process group)")
                signal_group(pgid, signal.SIGINT)
                interrupted, term_at = True, now + grace
            if status is not None and term_at is None:  # COMMAND ended, some of its group did not: they get grace
                term_at = now + grace
            if term_at is not None and kill_at is None and now > term_at:
                say(f"`{' '.join(cmd)}`: its process group still runs after {grace:g} s: SIGTERM")
                signal_group(pgid, signal.SIGTERM)
                kill_at = now + KILL_AFTER_S
            if kill_at is not None and now > kill_at:
                signal_group(pgid, signal.SIGKILL)
        return status if status >= 0 else 128 - status
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


PROG = "pipeline.common.signals"


def say(text: str) -> None:
    print(f"{PROG}: {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="Runs COMMAND in a process group of its own; SIGTERM, SIGINT or SIGUSR1 to this process, or "
        "--stop-after seconds of COMMAND, stop the whole group (SIGINT, then SIGTERM after --grace seconds, then "
        "SIGKILL). Exits with COMMAND's status.",
    )
    ap.add_argument("--grace", type=float, default=90.0, help="seconds from SIGINT to SIGTERM (default: %(default)s)")
    ap.add_argument(
        "--stop-after",
        type=float,
        metavar="S",
        help="stop COMMAND as on a request once it has run S seconds (a scheduler's deadline, less the time a clean "
        "stop takes)",
    )
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no COMMAND given")
    if args.stop_after is not None and not args.stop_after > 0:
        ap.error(f"--stop-after: {args.stop_after:g} is not a positive number of seconds")
    try:
        return run_group(command, args.grace, args.stop_after)
    except OSError as err:  # not found, not executable
        say(f"error: cannot run {command[0]!r}: {err}")
        return 127


if __name__ == "__main__":
    sys.exit(main())
