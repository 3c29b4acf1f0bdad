"""Every user error of the ``walras`` command ends in one line on stderr and exit status 2, never a traceback.

Each case runs the real console entry point in a subprocess (``python -m walras``) and checks the status, that
stderr is exactly one line starting with ``walras <command>: error:``, and that it names what went wrong. The
in-process tests check the route table of :func:`walras.cli.describe` and :func:`walras.cli.main`.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from walras import cli
from walras.cli.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]


def walras(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "WALRAS_LOG_LEVEL": "ERROR", **(env or {})}
    full.pop("WALRAS_TRACEBACK", None)
    return subprocess.run([sys.executable, "-m", "walras", *args], capture_output=True, text=True, timeout=timeout,
                          env=full, cwd=ROOT)


def assert_one_line_error(result: subprocess.CompletedProcess[str], command: str, *needles: str) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"walras {command}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_device_cuda_without_cuda() -> None:
    import torch

    device = "cuda:999" if torch.cuda.is_available() else "cuda"
    result = walras("solve", "--jobs", "50", "--device", device)
    assert_one_line_error(result, "solve", device)


def test_unwritable_output(tmp_path: Path) -> None:
    target = tmp_path / "missing-dir" / "out.npz"
    result = walras("solve", "--jobs", "50", "--device", "cpu", "--output", str(target))
    assert_one_line_error(result, "solve", str(target))
    assert not target.exists()


def test_demo_on_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = walras("demo", "-f", str(missing), "--timeout", "10")
    assert_one_line_error(result, "demo", str(missing))


def test_run_without_any_cluster_configuration(tmp_path: Path) -> None:
    env = {"KUBECONFIG": str(tmp_path / "no-kubeconfig"), "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": "",
           "KUBERNETES_SERVICE_PORT": ""}
    result = walras("run", "--standalone", env=env)
    assert_one_line_error(result, "run", "no Kubernetes cluster configured", "--kubeconfig")


def test_run_with_an_unreachable_cluster(tmp_path: Path) -> None:
    port = closed_port()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n")
    result = walras("run", "--standalone", "--kubeconfig", str(kubeconfig))
    assert_one_line_error(result, "run", "cannot reach the Kubernetes API", f"127.0.0.1:{port}")


@pytest.mark.parametrize("option", ["--extender-port", "--metrics-port", "--health-port"])
def test_run_with_a_port_in_use(tmp_path: Path, busy_port: int, option: str) -> None:
    from walras_testbed.emulator.server import EmulatorThread

    ports = {"--extender-port": "0", "--metrics-port": "0", "--health-port": "0", option: str(busy_port)}
    with EmulatorThread() as emulator:
        kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
        result = walras("run", "--standalone", "--kubeconfig", str(kubeconfig),
                        *[arg for pair in ports.items() for arg in pair])
    assert_one_line_error(result, "run", f":{busy_port}", "cannot listen")


# ------------------------------------------------------------------ in process: the route table


def test_usage_error_and_os_errors_are_one_line() -> None:
    assert cli.describe(UsageError("bad\nthing")) == "bad; thing"
    missing = FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/y.yaml")
    assert cli.describe(missing) == "/x/y.yaml: No such file or directory"
    assert cli.describe(OSError(errno.EADDRINUSE, "Address already in use")) == "Address already in use"
    assert cli.describe(KeyError("bug")) is None
    assert cli.describe(AssertionError("bug")) is None


def test_main_prints_one_line_and_returns_2(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    def fail(args: object) -> int:
        raise UsageError("the thing is wrong")

    parser = cli.build_parser(load=[])
    monkeypatch.setattr(cli, "build_parser", lambda load=None: _with_run(parser, fail))
    assert cli.main(["plan"]) == 2
    assert capsys.readouterr().err == "walras plan: error: the thing is wrong\n"


def test_bugs_keep_their_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(args: object) -> int:
        raise KeyError("a bug")

    parser = cli.build_parser(load=[])
    monkeypatch.setattr(cli, "build_parser", lambda load=None: _with_run(parser, bug))
    with pytest.raises(KeyError):
        cli.main(["plan"])


def test_walras_traceback_reraises_user_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(args: object) -> int:
        raise UsageError("x")

    parser = cli.build_parser(load=[])
    monkeypatch.setattr(cli, "build_parser", lambda load=None: _with_run(parser, fail))
    monkeypatch.setenv("WALRAS_TRACEBACK", "1")
    with pytest.raises(UsageError):
        cli.main(["plan"])


def _with_run(parser: object, fn: object) -> object:
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    parser.set_defaults(_run=fn)
    return parser
