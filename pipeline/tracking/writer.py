"""MLflow writes off the driver's hot path: the Tune callbacks queue them, one thread sends them, in order.

Ray Tune processes a trial's results in its one driver loop; a callback that waits on MLflow (a SQLite commit, an
HTTP round trip to a server) for every metric holds every other trial's results back (Ray warns about it above
0.5 s). ``RunWriter`` takes a write in microseconds and sends it from a thread of its own: everything queued for a
run is merged into as few ``log_batch`` calls as MLflow's batch limits allow, and a run's metrics and tags are
always sent before its termination. MLflow's own asynchronous logging is not used: every ``set_terminated``
drains it for all runs and restarts its threads, and it sends a run's batches from ten threads at once.

A write that fails (MLflow's client has already retried it) is kept in ``errors``; the sweep reports them when
it ends (``pipeline.scheduling.driver``). ``flush`` waits until everything queued so far is sent. The thread starts
on the first write and is left out when Tune pickles the callbacks that hold a writer.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from mlflow.entities import DatasetInput, Metric, Param, RunTag
from mlflow.tracking import MlflowClient

GATHER = 0.2  # seconds a write may wait for others to go out with it: a server's cost is per request
# MLflow's limits for one log_batch call: entities in all, and params and tags each
MAX_ENTITIES, MAX_PARAMS, MAX_TAGS = 1000, 100, 100


@dataclass
class Pending:
    """What is queued for one run and not sent yet."""

    metrics: list[Metric] = field(default_factory=list)
    params: list[Param] = field(default_factory=list)
    tags: list[RunTag] = field(default_factory=list)


class RunWriter:
    def __init__(self, client: MlflowClient, gather: float = GATHER):
        self.client, self.gather = client, gather
        self.errors: list[str] = []
        self._queue: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None

    def __getstate__(self) -> dict:
        return self.__dict__ | {"_queue": None, "_thread": None}

    # ---- what the callbacks call: each returns at once --------------------------------------------------------
    def log(
        self,
        run_id: str,
        metrics: Mapping[str, float] | Sequence[Metric] = (),
        step: int = 0,
        params: dict | None = None,
        tags: dict | None = None,
    ) -> None:
        """Metrics (name -> value at ``step``, or ``Metric`` records), params and tags of one run."""
        stamp = int(time.time() * 1000)
        if isinstance(metrics, Mapping):
            metrics = [Metric(k, float(v), stamp, step) for k, v in metrics.items()]
        batch = Pending(
            list(metrics),
            [Param(k, str(v)) for k, v in (params or {}).items()],
            [RunTag(k, str(v)) for k, v in (tags or {}).items()],
        )
        self._put(("log", run_id, batch))

    def inputs(self, run_id: str, datasets: list[DatasetInput]) -> None:
        self._put(("inputs", run_id, datasets))

    def terminate(self, run_id: str, status: str) -> None:
        """Ends the run once everything queued for it before is sent."""
        self._put(("terminate", run_id, status))

    def reopen(self, run_id: str) -> None:
        """Marks an ended run running again (a paused trial that goes on), after what was queued for it."""
        self._put(("reopen", run_id, None))

    def flush(self) -> None:
        """Waits until everything queued so far is sent (or has failed, into ``errors``)."""
        if self._thread is None:
            return
        done = threading.Event()
        self._put(("flush", "", done))
        done.wait()

    # ---- the writing thread -----------------------------------------------------------------------------------
    def _put(self, item: tuple) -> None:
        if self._thread is None:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run, name="mlflow-writer", daemon=True)
            self._thread.start()
        assert self._queue is not None
        self._queue.put(item)

    def _run(self) -> None:
        assert self._queue is not None
        while True:
            items = [self._queue.get()]
            time.sleep(self.gather)  # lets a run's next reports join its batch
            while not self._queue.empty():  # everything queued meanwhile goes out together
                items.append(self._queue.get())
            self._send(items)

    def _send(self, items: Iterable[tuple]) -> None:
        pending: dict[str, Pending] = {}
        for kind, run_id, payload in items:
            if kind == "log":
                batch = pending.setdefault(run_id, Pending())
                batch.metrics += payload.metrics
                batch.params += payload.params
                batch.tags += payload.tags
                continue
            if kind == "flush":
                self._drain(pending)
                payload.set()
                continue
            if run_id in pending:  # the run's data first
                self._drain({run_id: pending.pop(run_id)})
            if kind == "inputs":
                self._call(f"datasets of run {run_id}", self.client.log_inputs, run_id, payload)
            elif kind == "reopen":
                self._call(f"reopening run {run_id}", self.client.update_run, run_id, "RUNNING")
            else:
                self._call(f"end of run {run_id}", self.client.set_terminated, run_id, payload)
        self._drain(pending)

    def _drain(self, pending: dict[str, Pending]) -> None:
        for run_id, b in pending.items():
            while b.metrics or b.params or b.tags:
                params, tags = b.params[:MAX_PARAMS], b.tags[:MAX_TAGS]
                room = MAX_ENTITIES - len(params) - len(tags)
                metrics = b.metrics[:room]
                b.metrics, b.params, b.tags = b.metrics[room:], b.params[MAX_PARAMS:], b.tags[MAX_TAGS:]
                self._call(f"metrics of run {run_id}", self.client.log_batch, run_id, metrics, params, tags)
        pending.clear()

    def _call(self, what: str, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as err:  # kept and reported when the sweep ends: a dead server must not stop training
            self.errors.append(f"{what}: {type(err).__name__}: {err}")
