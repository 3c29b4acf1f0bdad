"""``walras plan``'s read-ahead (``walras.cli.plan.ReadAhead``): the manifests read and validated in a forked child
while the parent imports the planner give the same plan, and the same one-line errors naming file and object.

The child's message format is checked in this process (``_child`` writing into a pipe, ``ReadAhead.result``
reading it); the fork itself only happens in a fresh process (this one has torch imported already, so
``ReadAhead.start`` declines), so two tests run ``python -m walras plan`` as a user does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from walras.cli import main
from walras.cli.plan import ReadAhead, _child
from walras.planner import examples, load_manifests

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def broken_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example cluster with one FungibleJob whose ``spec.replicas`` is misspelled, in its own file."""
    out = tmp_path_factory.mktemp("broken")
    docs = examples.documents()
    job = json.loads(json.dumps(next(d for d in docs if d.get("kind") == "FungibleJob")))
    job["spec"]["replica"] = job["spec"].pop("replicas")
    (out / "cluster.yaml").write_text(yaml.safe_dump_all([d for d in docs if d is not job]))
    (out / "zz-job.yaml").write_text(yaml.safe_dump(job))
    return out


def _through_pipe(files: list[str]) -> Any:
    read_end, write_end = os.pipe()
    try:
        _child(files, True, write_end)  # closes write_end
        return ReadAhead(pid=-1, fd=read_end).result()
    finally:
        os.close(read_end)


def test_the_message_carries_the_snapshot(cluster_dir: Path, tmp_path: Path) -> None:
    assert _through_pipe([str(cluster_dir)]) == load_manifests([cluster_dir])
    # a value marshal cannot write (a YAML timestamp) goes by pickle
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "annotations": {"since": "x"}}}
    (tmp_path / "node.yaml").write_text(yaml.safe_dump(node).replace("since: x", "since: 2024-01-02"))
    snapshot = _through_pipe([str(tmp_path / "node.yaml")])
    assert snapshot == load_manifests([tmp_path / "node.yaml"])
    assert type(snapshot.nodes[0]["metadata"]["annotations"]["since"]).__name__ == "date"


def test_the_message_carries_a_user_error(broken_dir: Path) -> None:
    with pytest.raises(ValueError) as caught:
        _through_pipe([str(broken_dir)])
    with pytest.raises(ValueError) as direct:
        load_manifests([broken_dir])
    assert str(caught.value) == str(direct.value)
    assert "zz-job.yaml" in str(caught.value) and 'unknown field "replica"' in str(caught.value)


def test_an_empty_message_means_read_it_yourself() -> None:
    read_end, write_end = os.pipe()
    os.close(write_end)
    try:
        assert ReadAhead(pid=-1, fd=read_end).result() is None
    finally:
        os.close(read_end)


def _fresh(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.pop("WALRAS_READ_AHEAD", None)
    return subprocess.run([sys.executable, "-m", "walras", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120, check=False)


def _without_clocks(plan: dict[str, Any]) -> dict[str, Any]:
    plan = dict(plan)
    plan.pop("seconds", None)
    plan["solver"] = {k: v for k, v in plan["solver"].items() if k != "seconds"}
    return plan


def test_a_fresh_process_plans_as_this_one(cluster_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    done = _fresh("plan", "-f", str(cluster_dir), "-o", "json")
    assert done.returncode == 0, done.stderr
    assert main(["plan", "-f", str(cluster_dir), "-o", "json"]) == 0
    here = json.loads(capsys.readouterr().out)
    assert _without_clocks(json.loads(done.stdout)) == _without_clocks(here)


def test_a_fresh_process_reports_an_invalid_manifest_in_one_line(broken_dir: Path) -> None:
    done = _fresh("plan", "-f", str(broken_dir))
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("walras plan: error: ") and "zz-job.yaml" in line and "FungibleJob" in line
    assert 'spec.replica: unknown field "replica"' in line and "Traceback" not in done.stderr


def test_exit_now_flushes_what_was_written_and_keeps_the_status() -> None:
    """``walras.cli.exit_now`` (``walras plan`` run as a program ends through it): buffered output is not lost."""
    code = ("import sys\nfrom walras.cli import exit_now\nsys.stdout.write('x' * 100000)\n"
            "sys.stderr.write('note')\nexit_now(3)\nprint('not reached')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          check=False)
    assert (done.returncode, done.stdout, done.stderr) == (3, "x" * 100000, "note")
