"""A local Kubernetes control plane from real binaries: etcd, kube-apiserver, kube-controller-manager (and, on
request, kube-scheduler) on free loopback ports in one folder.

The binaries are found in ``$KUBEBUILDER_ASSETS`` (envtest's convention: a folder holding ``etcd``,
``kube-apiserver``, ``kube-controller-manager``, ``kube-scheduler``); ``make controlplane`` unpacks them into
``.tools/k8s/bin`` and the Makefile exports the variable. There is no kubelet and no container runtime: Nodes are API
objects and :mod:`walras_testbed.kubelet.standin` plays the kubelet.

What :meth:`LocalControlPlane.start` sets up (the flags follow ``shared/k8s/control-plane``, the reference script):

* etcd with its data in ``WORKDIR/etcd``;
* kube-apiserver with serving certificates it generates itself (``WORKDIR/certs``), **RBAC** authorization, a static
  token file with three users (``admin`` in ``system:masters``, ``system:kube-scheduler`` and
  ``system:kube-controller-manager``, which the bootstrap RBAC policy binds to their roles) and **service-account
  tokens** signed by a freshly generated RSA key (``--service-account-key-file``/``--service-account-signing-key-file``,
  issuer ``https://kubernetes.default.svc``);
* kube-controller-manager (garbage collector, namespaces, service accounts and their tokens, node lifecycle,
  ReplicaSet/Job, disruption) with the same signing key and the API server's CA as root CA;
* ``WORKDIR/kubeconfig`` for the admin user; :meth:`LocalControlPlane.user_kubeconfig` writes one per token.

Readiness is ``/readyz`` answering 200, then the ``default`` ServiceAccount of namespace ``default`` existing (the
service-account controller creates it; pod creation is refused before). Every process runs in its own process group
and :meth:`LocalControlPlane.stop` (also registered with :mod:`atexit`) terminates the groups, killing them after a
grace period. The RSA key comes from the ``openssl`` command line tool.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
HOW_TO_GET = ("`make controlplane` (part of `make test`) unpacks ../shared/k8s/*.tar.xz into .tools/k8s/bin and sets "
              "KUBEBUILDER_ASSETS; elsewhere `setup-envtest use 1.36` gives etcd and kube-apiserver and the Kubernetes "
              "server release tarball kube-controller-manager and kube-scheduler: point KUBEBUILDER_ASSETS at a folder "
              "holding all four")


class ControlPlaneError(RuntimeError):
    """A control-plane process did not start or did not become ready (the message names its log file)."""


def find_binaries(assets: str | os.PathLike[str] | None = None,
                  names: Sequence[str] = BINARIES) -> tuple[Path | None, list[str]]:
    """The folder holding the control-plane binaries and the names missing from it.

    ``assets`` defaults to ``$KUBEBUILDER_ASSETS``. Returns ``(None, names)`` when neither is set.
    """
    folder = assets if assets is not None else os.environ.get("KUBEBUILDER_ASSETS")
    if not folder:
        return None, list(names)
    path = Path(folder)
    missing = [n for n in names if not (path / n).is_file() or not os.access(path / n, os.X_OK)]
    return path, missing


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout: float = 10.0) -> bytes:
    """The body of a GET of ``url`` (urllib's errors propagate)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body


def wait_for(check: Any, what: str, deadline_s: float, procs: Sequence[subprocess.Popen[bytes]] = ()) -> Any:
    """``check()``'s first truthy result within ``deadline_s`` seconds, polled every 0.25 s (an exception counts as
    not yet: the process is still starting); ``RuntimeError`` with the process's output if one of ``procs`` exits
    first, or with the last error on timeout."""
    deadline = time.monotonic() + deadline_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} while waiting for {what}:\n"
                                   f"{output[-3000:]}")
        try:
            result = check()
            if result:
                return result
        except Exception as exc:
            last = exc
        time.sleep(0.25)
    raise RuntimeError(f"timed out after {deadline_s} s waiting for {what} (last error: {last})")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to ``proc``, SIGKILL after 15 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@dataclass
class Process:
    """One control-plane process in its own process group, its output in ``log``."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``grace`` seconds."""
        if self.popen.poll() is not None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            with _suppress_lookup():
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class _suppress_lookup:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, value: object, tb: object) -> bool:
        return kind is ProcessLookupError


def kubeconfig_text(server: str, ca_file: Path, token: str, user: str = "admin",
                    namespace: str | None = None) -> str:
    """A kubeconfig for a bearer token (``namespace`` sets the context's default namespace)."""
    context: dict[str, Any] = {"cluster": "local", "user": user}
    if namespace:
        context["namespace"] = namespace
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "local", "context": context}],
        "current-context": "local",
    }, sort_keys=False)


@dataclass
class LocalControlPlane:
    """A running control plane (see the module docstring). Start it with :meth:`start`, stop it with :meth:`stop`."""

    workdir: Path
    binaries: Path
    server: str
    token: str
    ca_file: Path
    kubeconfig: Path
    processes: list[Process] = field(default_factory=list)
    user_tokens: dict[str, str] = field(default_factory=dict)

    # ---------------------------------------------------------------- start / stop
    @classmethod
    def start(cls, workdir: Path, binaries: Path | None = None, timeout: float = 90.0,
              controller_manager_args: Sequence[str] = (), apiserver_args: Sequence[str] = ()) -> LocalControlPlane:
        """Start etcd, kube-apiserver and kube-controller-manager in ``workdir`` and wait until they are ready
        (``apiserver_args`` and ``controller_manager_args`` are appended to those processes' flags, e.g. an audit
        policy).

        Raises :class:`ControlPlaneError` (after stopping what started) when a binary is missing or a process does
        not become ready within ``timeout`` seconds.
        """
        folder, missing = find_binaries(binaries)
        if folder is None or missing:
            raise ControlPlaneError(f"control-plane binaries missing ({', '.join(missing)}): {HOW_TO_GET}")
        if shutil.which("openssl") is None:
            raise ControlPlaneError("openssl is needed to generate the service-account signing key")
        workdir.mkdir(parents=True, exist_ok=True)
        workdir = workdir.resolve()
        tokens = {user: secrets.token_hex(24) for user in
                  ("admin", "system:kube-scheduler", "system:kube-controller-manager")}
        (workdir / "tokens.csv").write_text(
            f'{tokens["admin"]},admin,admin-uid,"system:masters"\n'
            f'{tokens["system:kube-scheduler"]},system:kube-scheduler,kube-scheduler-uid\n'
            f'{tokens["system:kube-controller-manager"]},system:kube-controller-manager,kcm-uid\n')
        subprocess.run(["openssl", "genrsa", "-out", str(workdir / "sa.key"), "2048"], check=True,
                       capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(workdir / "sa.key"), "-pubout", "-out",
                        str(workdir / "sa.pub")], check=True, capture_output=True)
        ca_file = workdir / "certs" / "apiserver.crt"
        api_port = free_port()
        server = f"https://127.0.0.1:{api_port}"
        kubeconfig = workdir / "kubeconfig"
        kubeconfig.write_text(kubeconfig_text(server, ca_file, tokens["admin"]))
        plane = cls(workdir=workdir, binaries=folder, server=server, token=tokens["admin"], ca_file=ca_file,
                    kubeconfig=kubeconfig, user_tokens=tokens)
        atexit.register(plane.stop)
        try:
            etcd_port, peer_port = free_port(), free_port()
            plane._spawn("etcd", ["--data-dir", str(workdir / "etcd"),
                                  "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                                  "--listen-peer-urls", f"http://127.0.0.1:{peer_port}"])
            plane._spawn("kube-apiserver", [
                "--etcd-servers", f"http://127.0.0.1:{etcd_port}", "--cert-dir", str(workdir / "certs"),
                "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", str(api_port),
                "--service-account-issuer", "https://kubernetes.default.svc",
                "--service-account-key-file", str(workdir / "sa.pub"),
                "--service-account-signing-key-file", str(workdir / "sa.key"),
                "--service-cluster-ip-range", "10.0.0.0/24", "--authorization-mode", "RBAC",
                "--token-auth-file", str(workdir / "tokens.csv"), "--allow-privileged=true", "--profiling=false",
                *apiserver_args])
            plane._wait(timeout, "kube-apiserver /readyz", plane._readyz)
            kcm_config = workdir / "kube-controller-manager.kubeconfig"
            kcm_config.write_text(kubeconfig_text(server, ca_file, tokens["system:kube-controller-manager"],
                                                  "system:kube-controller-manager"))
            plane._spawn("kube-controller-manager", [
                "--kubeconfig", str(kcm_config), "--use-service-account-credentials=true",
                "--service-account-private-key-file", str(workdir / "sa.key"), "--root-ca-file", str(ca_file),
                "--leader-elect=false", "--secure-port", "0", *controller_manager_args])
            plane._wait(timeout, "the default ServiceAccount of namespace default",
                        lambda: plane._exists("/api/v1/namespaces/default/serviceaccounts/default"))
        except BaseException:
            plane.stop()
            raise
        return plane

    def alive(self) -> bool:
        """etcd, kube-apiserver and kube-controller-manager are running (schedulers come and go per test)."""
        core = [p for p in self.processes if p.name in BINARIES[:3]]
        return len(core) == 3 and all(p.alive() for p in core)

    def stop(self) -> None:
        """Stop every process (last started first); safe to call twice."""
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()

    def _spawn(self, name: str, args: Sequence[str]) -> Process:
        log = self.workdir / f"{name}-{len(self.processes)}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen([str(self.binaries / name.split("@")[0]), *args], stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        proc = Process(name, popen, log)
        self.processes.append(proc)
        return proc

    def _wait(self, timeout: float, what: str, ready: Any) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.processes:
                if not proc.alive():
                    raise ControlPlaneError(f"{proc.name} exited with {proc.popen.returncode} while waiting for "
                                            f"{what}; {proc.log}:\n{proc.tail()}")
            if ready():
                return
            time.sleep(0.2)
        raise ControlPlaneError(f"timed out after {timeout:g} s waiting for {what} (logs in {self.workdir})")

    # ---------------------------------------------------------------- HTTP
    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def request(self, method: str, path: str, body: Any = None, token: str | None = None,
                content_type: str = "application/json") -> tuple[int, Any]:
        """One API call as ``token`` (default: admin): ``(status, decoded JSON body or text)``."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token or self.token}", "Accept": "application/json",
            "Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=10) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def _readyz(self) -> bool:
        if not self.ca_file.exists():
            return False
        try:
            return self.request("GET", "/readyz")[0] == 200
        except (OSError, ssl.SSLError):
            return False

    def _exists(self, path: str) -> bool:
        try:
            return self.request("GET", path)[0] == 200
        except OSError:
            return False

    # ---------------------------------------------------------------- users
    def user_kubeconfig(self, path: Path, token: str, user: str, namespace: str | None = None) -> Path:
        """Write a kubeconfig for ``token`` to ``path``."""
        path.write_text(kubeconfig_text(self.server, self.ca_file, token, user, namespace))
        return path

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A token of ServiceAccount ``namespace/name`` from the TokenRequest API (signed with the plane's key)."""
        status, body = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                                    {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                     "spec": {"expirationSeconds": seconds}})
        if status != 201:
            raise ControlPlaneError(f"TokenRequest for {namespace}/{name} answered {status}: {body}")
        return str(body["status"]["token"])

    def service_account_kubeconfig(self, path: Path, namespace: str, name: str, seconds: int = 3600) -> Path:
        """A kubeconfig authenticating as ServiceAccount ``namespace/name`` (a TokenRequest token)."""
        return self.user_kubeconfig(path, self.service_account_token(namespace, name, seconds),
                                    f"system:serviceaccount:{namespace}:{name}", namespace)

    # ---------------------------------------------------------------- scheduler
    def start_scheduler(self, config: Path | None = None, timeout: float = 60.0) -> Process:
        """Start a kube-scheduler with the KubeSchedulerConfiguration ``config`` (default: the default profile).

        When the configuration names no ``clientConnection.kubeconfig``, a copy is written that uses the user
        ``system:kube-scheduler`` (bound to its role by the bootstrap RBAC policy) and no leader election. Returns
        once the scheduler has logged (``--v=2``) that its Pod and Node caches are populated; stop it with ``.stop()``.
        """
        doc: dict[str, Any] = (yaml.safe_load(config.read_text()) if config is not None else None) or {
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
        if not (doc.get("clientConnection") or {}).get("kubeconfig"):
            sched_kc = self.user_kubeconfig(self.workdir / "kube-scheduler.kubeconfig",
                                            self.user_tokens["system:kube-scheduler"], "system:kube-scheduler")
            doc = {**doc, "clientConnection": {**(doc.get("clientConnection") or {}), "kubeconfig": str(sched_kc)}}
        doc.setdefault("leaderElection", {"leaderElect": False})
        path = self.workdir / f"kube-scheduler-{len(self.processes)}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        proc = self._spawn("kube-scheduler", ["--config", str(path), "--secure-port", "0", "--v=2"])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                self.processes.remove(proc)
                raise ControlPlaneError(f"kube-scheduler exited with {proc.popen.returncode}; {proc.log}:\n"
                                        f"{proc.tail()}")
            text = proc.log.read_text(errors="replace")
            if all(f'"Caches populated" type="*v1.{kind}"' in text for kind in ("Pod", "Node")):
                return proc
            time.sleep(0.2)
        proc.stop()
        self.processes.remove(proc)
        raise ControlPlaneError(f"kube-scheduler not started after {timeout:g} s; {proc.log}:\n{proc.tail()}")
