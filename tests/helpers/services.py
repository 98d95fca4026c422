"""Real services for the tests and benchmarks: a two-node Ray cluster with token authentication and an MLflow server.

Nothing here binds the machine's network address. Ray's GCS and raylet listen on loopback only when their node's IP is
exactly 127.0.0.1 and on every interface (``::``) otherwise, and Ray rewrites a node IP of 127.0.0.1 into the machine's
network address whenever it can find one. Two nodes told apart by IP therefore live in a network namespace of their
own (`unshare --net`): its only interface is ``lo``, so the head there keeps 127.0.0.1, the second node 127.0.0.2, and
an all-interfaces socket of the second node is reachable from that namespace's loopback alone. Drivers run inside it
too: ``Netns.command`` wraps a command line in ``nsenter``, ``Netns.call`` runs a function on a thread that joined it.

Every process is started in a session of its own and stopped by pid (never ``ray stop``, which stops every Ray
process on the machine); a service that does not come up in time raises ``ServiceTimeout`` with its log's tail.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

BIN = Path(sys.executable).parent  # the venv's `ray` and `mlflow` sit beside its python
STARTUP_TIMEOUT = 60.0  # seconds; a head, a node or an MLflow server on 2 busy cores takes 3-10 s
CLONE_NEWNET = 0x40000000
# Variables that would point a started service elsewhere or change its authentication; each service gets its own.
FOREIGN_ENV = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
               "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "MLFLOW_TRACKING_URI")
JOB_SERVER_PORT = 8265  # Ray's default dashboard port: the namespace is the cluster's own
# Unix socket paths (a Ray session's sockets/plasma_store, sockets/raylet) must fit in 107 bytes; a Ray session
# directory name takes up to 43 of them, sockets/plasma_store 21 more.
MAX_RAY_TEMP_DIR = 40
T = TypeVar("T")


class ServiceTimeout(RuntimeError):
    """A service did not come up in time, or died while starting; the message ends with its log's tail."""


@dataclass(frozen=True)
class Netns:
    """A network namespace, by the path of its handle (/proc/<pid>/ns/net); ``path=None`` is this process's own."""

    path: str | None = None

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return argv if self.path is None else ["nsenter", f"--net={self.path}", "--", *argv]

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a thread that joined the namespace (a namespace is per thread, so this process's other
        threads stay where they are); returns its result or raises its exception."""
        path = self.path
        if path is None:
            return fn(*args)
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                with open(path) as handle:
                    if ctypes.CDLL(None, use_errno=True).setns(handle.fileno(), CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), f"setns {path}")
                outcome["value"] = fn(*args)
            except BaseException as err:  # re-raised in the caller's thread
                outcome["error"] = err

        thread = threading.Thread(target=run, name="netns-call")
        thread.start()
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]


@dataclass
class RayCluster:
    """A running cluster. A driver runs where it is reachable, with its address and token:
    ``subprocess.run(cluster.command([sys.executable, ...]), env=cluster.driver_env(MLFLOW_TRACKING_URI=...))``."""

    address: str  # host:port of the head's GCS, for RAY_ADDRESS or ray.init(address=...)
    token_path: Path
    node_ips: list[str]  # head first
    netns: Netns
    roots: list[int]  # the `ray start --block` processes; Ray's processes of each node descend from one
    logs: Path  # the directory of the nodes' logs
    head_temp: Path  # the head's --temp-dir: its session, the jobs' working directories
    job_server: str | None = None  # http://host:port of the head's job server (the dashboard), if it runs one

    def pids(self) -> set[int]:
        """The cluster's processes now (Ray starts and ends workers as tasks come and go)."""
        return set().union(*map(tree, self.roots))

    @property
    def env(self) -> dict[str, str]:
        """What a driver adds to its environment: the head's address and the token, as Ray reads them, and the job
        server's address for `ray job`."""
        env = {"RAY_ADDRESS": self.address, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path)}
        return env | ({"RAY_API_SERVER_ADDRESS": self.job_server} if self.job_server else {})

    def driver_env(self, **extra: str) -> dict[str, str]:
        """A full environment for a driver process: this one's, minus foreign Ray and MLflow settings, plus ``env``."""
        return clean_env() | self.env | extra

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run where the cluster is reachable (its network namespace)."""
        return self.netns.command(argv)


@dataclass
class MlflowServer:
    uri: str
    artifact_root: Path
    backend_uri: str
    netns: Netns
    root: int
    admin: tuple[str, str] | None = None  # basic-auth's admin (username, password); None: no auth

    def pids(self) -> set[int]:
        return tree(self.root)


# A `ray start` node starts idle workers ahead of any task when a driver joins (Ray's system config, read from
# RAY_<setting>). A trial's actor cannot use them (it runs in the driver's runtime env, py_modules and all) and starts
# its own: on 2 cores they are CPU spent for nothing (0.4 CPU-s each, counted on a two-node cluster).
NO_IDLE_WORKERS = {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}


def clean_env() -> dict[str, str]:
    """This process's environment without foreign Ray and MLflow settings, for a subprocess of a test's cluster."""
    return {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV} | NO_IDLE_WORKERS


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tree(pid: int) -> set[int]:
    """``pid`` and all its descendants alive now."""
    try:
        root = psutil.Process(pid)
        return {pid} | {p.pid for p in root.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def start(argv: list[str], env: dict[str, str], log: Path, netns: Netns) -> subprocess.Popen:
    """A service in a session (process group) of its own, output to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(netns.command(argv), env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def stop(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM to ``proc`` (``ray start --block`` then stops its node's processes, as ``ray stop`` would, but only
    these), then SIGKILL to whatever is left of its process tree and process group."""
    descendants = []
    for pid in tree(proc.pid) - {proc.pid}:
        with contextlib.suppress(psutil.NoSuchProcess):
            descendants.append(psutil.Process(pid))
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace)
    _, alive = psutil.wait_procs(descendants, timeout=2)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def tail(log: Path, lines: int = 25) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_for(what: str, ready: Callable[[], Any], procs: list[subprocess.Popen], log: Path,
             timeout: float = STARTUP_TIMEOUT) -> Any:
    """Poll ``ready()`` until it returns something truthy; ServiceTimeout if a process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise ServiceTimeout(f"{what}: process exited with code {dead[0].returncode} while starting; "
                                 f"{log}:\n{tail(log)}")
        if time.monotonic() > deadline:
            raise ServiceTimeout(f"{what}: not up after {timeout:.0f} s; {log}:\n{tail(log)}")
        time.sleep(0.2)


@contextlib.contextmanager
def network_namespace(log: Path) -> Iterator[Netns]:
    """A new network namespace with its loopback up, held by a sleeping process; gone when its last process is."""
    holder = start(["unshare", "--net", "sh", "-c", "ip link set lo up && echo up && exec sleep infinity"],
                   clean_env(), log, Netns())
    try:
        wait_for("network namespace", lambda: "up" in log.read_text(), [holder], log, timeout=10)
        yield Netns(f"/proc/{holder.pid}/ns/net")
    finally:
        stop(holder, grace=2)


def namespace_problem() -> str | None:
    """Why this machine cannot create network namespaces (needs root or CAP_SYS_ADMIN), or None if it can."""
    missing = [tool for tool in ("unshare", "nsenter", "ip") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (util-linux, iproute2)"
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"`unshare --net` fails: {probe.stderr.strip()} (run as root)"


def ray_temp_dir(tmp_dir: Path, name: str, stack: contextlib.ExitStack) -> Path:
    """``tmp_dir/name`` if short enough for Ray's socket paths, else a short directory in /tmp removed on exit."""
    wanted = tmp_dir / name
    if len(str(wanted)) <= MAX_RAY_TEMP_DIR:
        wanted.mkdir(parents=True, exist_ok=True)
        return wanted
    short = Path(tempfile.mkdtemp(prefix=f"ray-{name}-", dir="/tmp"))
    stack.callback(shutil.rmtree, short, ignore_errors=True)
    return short


PROBE = """
import sys, time
import ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
deadline = time.monotonic() + float(sys.argv[3])
while len([n for n in ray.nodes() if n["Alive"]]) < int(sys.argv[2]):
    if time.monotonic() > deadline:
        sys.exit("alive nodes: " + ", ".join(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]))
    time.sleep(0.2)
"""


def job_server_up(url: str, token: Path) -> bool:
    """The job server at ``url`` answers an authenticated request (every one but its health check needs the token)."""
    request = urllib.request.Request(url + "/api/version", headers={"Authorization": f"Bearer {token.read_text()}"})
    try:
        with urllib.request.urlopen(request, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


# every node's `ray start` options, but its resources
OBJECT_STORE_BYTES = 100_000_000
NODE_OPTIONS = ["--block", "--disable-usage-stats", f"--object-store-memory={OBJECT_STORE_BYTES}",
                "--min-worker-port=0", "--max-worker-port=0"]
AUTOSCALED_GCS_PORT = 6379  # the fake provider's nodes join the head here; free, in the cluster's own namespace


def autoscaler_config(groups: dict[str, dict], head_cpus: int, idle_timeout_s: float) -> dict:
    """A cluster config of Ray's ``fake_multinode`` provider (its example.yaml, without SSH or Docker): the head,
    then ``groups`` (name -> ``{"resources": {...}, "max_workers": n}``), each starting with no node."""
    types = {name: {"node_config": {}, "min_workers": 0, **group} for name, group in groups.items()}
    for group in types.values():  # each node's object store as small as the cluster's other nodes'
        group["resources"] = {"object_store_memory": OBJECT_STORE_BYTES} | group["resources"]
    return {
        "cluster_name": "test", "max_workers": sum(g["max_workers"] for g in groups.values()),
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "gcs_address": f"127.0.0.1:{AUTOSCALED_GCS_PORT}"},
        "available_node_types": {"ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {},
                                                      "max_workers": 0}} | types,
        "head_node_type": "ray.head.default", "auth": {}, "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_s / 60, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [], **{f"{k}_commands": [] for k in (
            "initialization", "setup", "head_setup", "worker_setup", "head_start_ray", "worker_start_ray")},
    }


@contextlib.contextmanager
def ray_cluster(tmp_dir: Path, nodes: int = 2, cpus_per_node: int = 1, head_cpus: int | None = None,
                job_server: bool = False, autoscaler: dict[str, dict] | None = None, idle_timeout_s: float = 60,
                **ray_env: str) -> Iterator[RayCluster]:
    """A Ray head on 127.0.0.1 and ``nodes - 1`` more nodes on 127.0.0.2, 127.0.0.3, ..., all in a network
    namespace of their own, with token authentication as Ray ships it: RAY_AUTH_MODE=token and the token in a file
    (RAY_AUTH_TOKEN_PATH), one random token per cluster. With ``job_server``, the head runs Ray's job server (the
    dashboard) on 127.0.0.1:8265, for `ray job submit`. The nodes run with this venv first on their PATH, as started
    from an activated environment: a job's entrypoint finds its python and dvc. ``ray_env``: more of every node's
    environment (Ray's ``RAY_<setting>`` variables). With ``autoscaler`` (node group -> its resources, most nodes),
    the head runs Ray's autoscaler, as `ray up` and KubeRay start it, with the provider Ray tests itself with
    (``fake_multinode``): it starts a group's nodes as processes of the head's tree, on 127.0.0.1, and stops one
    that has been idle for ``idle_timeout_s``. Returns once every
    node has registered with the head (and the job server answers)."""
    tmp_dir = Path(tmp_dir)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    token = tmp_dir / "ray_auth_token"
    token.write_text(secrets.token_hex(32))  # what `ray get-auth-token --generate` writes: 256 random bits in hex
    token.chmod(0o600)
    env = clean_env() | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                         "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"} | ray_env
    dashboard = (["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={JOB_SERVER_PORT}"]
                 if job_server else ["--include-dashboard=false"])
    common = [*NODE_OPTIONS, "--num-gpus=0"]
    head_cpus = cpus_per_node if head_cpus is None else head_cpus
    with contextlib.ExitStack() as stack:
        netns = stack.enter_context(network_namespace(tmp_dir / "netns.log"))
        procs: list[subprocess.Popen] = []
        head_temp = ray_temp_dir(tmp_dir, "rh", stack)
        head_log = tmp_dir / "ray-head.log"
        scaling = []
        if autoscaler:
            config = tmp_dir / "autoscaler.json"
            config.write_text(json.dumps(autoscaler_config(autoscaler, head_cpus, idle_timeout_s)))
            scaling = [f"--autoscaling-config={config}"]
            env |= {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_TMPDIR": str(head_temp)}
        head = start([str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1",
                      f"--port={AUTOSCALED_GCS_PORT if autoscaler else 0}", *dashboard, f"--temp-dir={head_temp}",
                      *scaling, f"--num-cpus={head_cpus}", *common], env, head_log, netns)
        stack.callback(stop, head)
        procs.append(head)
        address_file = head_temp / "ray_current_cluster"  # written by `ray start` once the head is up
        address = wait_for("Ray head", lambda: address_file.exists() and address_file.read_text().strip(),
                           procs, head_log)
        ips = ["127.0.0.1"]
        for i in range(2, nodes + 1):
            ip, log = f"127.0.0.{i}", tmp_dir / f"ray-node{i}.log"
            node = start([str(BIN / "ray"), "start", f"--address={address}", f"--node-ip-address={ip}",
                          f"--temp-dir={ray_temp_dir(tmp_dir, f'r{i}', stack)}", f"--num-cpus={cpus_per_node}",
                          *common], env, log, netns)
            stack.callback(stop, node)
            procs.append(node)
            ips.append(ip)
        probe_log = tmp_dir / "ray-probe.log"
        with open(probe_log, "wb") as out:
            try:
                probe = subprocess.run(netns.command([sys.executable, "-c", PROBE, address, str(nodes),
                                                      str(STARTUP_TIMEOUT)]),
                                       env=env, stdout=out, stderr=subprocess.STDOUT, timeout=STARTUP_TIMEOUT + 30)
            except subprocess.TimeoutExpired:
                probe = None
        if probe is None or probe.returncode != 0:
            raise ServiceTimeout(f"Ray cluster at {address}: not all {nodes} nodes registered; {probe_log}:\n"
                                 f"{tail(probe_log)}\nhead log {head_log}:\n{tail(head_log)}")
        url = f"http://127.0.0.1:{JOB_SERVER_PORT}" if job_server else None
        if url:
            wait_for(f"Ray job server at {url}", lambda: netns.call(job_server_up, url, token), procs, head_log)
        yield RayCluster(address=address, token_path=token, node_ips=ips, netns=netns, roots=[p.pid for p in procs],
                         logs=tmp_dir, head_temp=head_temp, job_server=url)


@contextlib.contextmanager
def joined_node(cluster: RayCluster, ip: str, *resources: str) -> Iterator[subprocess.Popen]:
    """One more node of ``cluster`` at ``ip``, with ``resources`` (`ray start` options: ``--num-cpus=1``,
    ``--num-gpus=1``), as a node that joins late (an autoscaler's, one still starting); stopped on exit."""
    with contextlib.ExitStack() as stack:
        log = cluster.logs / f"ray-node-{ip}.log"
        temp = ray_temp_dir(cluster.logs, f"j{ip.rsplit('.', 1)[1]}", stack)
        env = clean_env() | {k: v for k, v in cluster.env.items() if k != "RAY_ADDRESS"}
        node = start([str(BIN / "ray"), "start", f"--address={cluster.address}", f"--node-ip-address={ip}",
                      f"--temp-dir={temp}", *NODE_OPTIONS, *resources], env, log, cluster.netns)
        stack.callback(stop, node)
        yield node


def healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(uri + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def mlflow_server(tmp_dir: Path, netns: Netns = Netns(), backend: str | None = None, auth: bool = False,
                  options: tuple[str, ...] = (), port: int | None = None) -> Iterator[MlflowServer]:
    """``mlflow server`` on 127.0.0.1 (inside ``netns`` if given, e.g. a RayCluster's, so its drivers reach it) with
    its own SQLite store (or ``backend``: an existing store, to look at) and artifact root; artifacts go through the
    server, so clients need no access to the root. ``auth``: MLflow's basic-auth app (``--app-name basic-auth``),
    its users in an SQLite file of its own, new users reading every experiment, and an admin with a random password
    (MLflow ships none: it creates the admin from its config at the first start). ``options``: more
    ``mlflow server`` options (``--allowed-hosts ...``). ``port``: a free one unless given (a server restarted where
    its clients look for it)."""
    tmp_dir = Path(tmp_dir)
    root = tmp_dir / "mlartifacts"
    root.mkdir(parents=True, exist_ok=True)
    backend = backend or f"sqlite:///{tmp_dir / 'mlflow.db'}"
    port = port or netns.call(free_port)
    uri = f"http://127.0.0.1:{port}"
    log = tmp_dir / "mlflow-server.log"
    argv = [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", backend, "--serve-artifacts", "--artifacts-destination", str(root), *options]
    env = clean_env() | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no GenAI job workers
    admin = None
    if auth:
        admin = ("admin", secrets.token_urlsafe(16))
        config = tmp_dir / "basic_auth.ini"
        config.write_text(f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{tmp_dir / 'users.db'}\n"
                          f"admin_username = {admin[0]}\nadmin_password = {admin[1]}\n")
        argv += ["--app-name", "basic-auth"]
        # the app refuses to start without a secret key for its CSRF tokens (one key for all of a server's workers)
        env |= {"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16)}
    proc = start(argv, env, log, netns)
    try:
        wait_for(f"MLflow server at {uri}", lambda: netns.call(healthy, uri), [proc], log)
        yield MlflowServer(uri=uri, artifact_root=root, backend_uri=backend, netns=netns, root=proc.pid, admin=admin)
    finally:
        stop(proc, grace=5)


def listening(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket (IPv4 and IPv6) that a process in ``pids`` holds, read
    from /proc/<pid>/net (the process's own network namespace) and matched by socket inode."""
    found = []
    for pid in pids:
        try:
            inodes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            tables = {v: Path(f"/proc/{pid}/net/{v}").read_text() for v in ("tcp", "tcp6")}
        except (FileNotFoundError, ProcessLookupError):
            continue  # a worker that exited meanwhile
        for table in tables.values():
            for line in table.splitlines()[1:]:
                fields = line.split()
                if fields[3] != "0A" or f"socket:[{fields[9]}]" not in inodes:  # 0A: TCP_LISTEN
                    continue
                host, port = fields[1].split(":")
                found.append((pid, decode_address(host), int(port, 16)))
    return found


def decode_address(hex_host: str) -> str:
    """/proc/net/tcp{,6} addresses: 32-bit words in host (little-endian) byte order."""
    raw = b"".join(bytes.fromhex(hex_host[i:i + 8])[::-1] for i in range(0, len(hex_host), 8))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, raw)


def interfaces(netns: Netns) -> list[str]:
    """Names of the network interfaces of ``netns``."""
    return netns.call(lambda: [name for _, name in socket.if_nameindex()])
