"""``walras plan``'s read-ahead (``walras.cli.plan.ReadAhead``): the manifests read and validated in a forked child
while the parent imports the planner give the same plan, and the same one-line errors naming file and object.

The files are cut into pieces of whole documents shared by the child and the parent; the pieces, the message format
and the sharing are checked in this process (``_child`` writing into a pipe, ``ReadAhead.result`` taking pieces and
reading it; a thread plays the child where both sides take pieces); the fork itself only happens in a fresh process
(``ReadAhead.start`` declines in one with torch imported or other threads running), so two tests run
``python -m walras plan`` as a user does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from walras.cli import main
from walras.cli.plan import ReadAhead, _child
from walras.manifests import examples, load_manifests, loader

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


def _through_pipe(files: list[str], *, before: Any = None) -> Any:
    """The read-ahead in this process: ``_child`` decodes every piece and writes its message into a pipe, then
    ``ReadAhead.result`` (the parent's side, with nothing left to take) reads it. ``before(ahead)`` runs first."""
    ahead = ReadAhead.prepare(files, validate=True)
    assert ahead is not None
    if before is not None:
        before(ahead)
    read_end, write_end = os.pipe()
    try:
        _child(ahead, write_end)  # closes write_end
        ahead.fd = read_end
        return ahead.result()
    finally:
        ahead.close()


def test_the_message_carries_the_snapshot(cluster_dir: Path, tmp_path: Path) -> None:
    import gc

    assert _through_pipe([str(cluster_dir)]) == load_manifests([cluster_dir])
    assert gc.isenabled()  # the child's work run in this process leaves the collector as it was
    # a value marshal cannot write (a YAML timestamp) goes by pickle
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "annotations": {"since": "x"}}}
    (tmp_path / "node.yaml").write_text(yaml.safe_dump(node).replace("since: x", "since: 2024-01-02"))
    snapshot = _through_pipe([str(tmp_path / "node.yaml")])
    assert snapshot == load_manifests([tmp_path / "node.yaml"])
    assert type(snapshot.nodes[0]["metadata"]["annotations"]["since"]).__name__ == "date"


def test_a_user_error_sends_the_caller_to_its_own_read(broken_dir: Path) -> None:
    """The child stops at a user error and the result is ``None``: ``walras plan`` then reads the files itself, so
    the message is the sequential read's (tested in a fresh process below)."""
    assert _through_pipe([str(broken_dir)]) is None


def test_a_piece_nobody_decoded_sends_the_caller_to_its_own_read(cluster_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "PIECE_BYTES", 2048)
    assert _through_pipe([str(cluster_dir)], before=lambda ahead: ahead.take(front=True)) is None


def test_an_empty_message_means_read_it_yourself(cluster_dir: Path) -> None:
    ahead = ReadAhead.prepare([str(cluster_dir)], validate=True)
    assert ahead is not None
    read_end, write_end = os.pipe()
    os.close(write_end)
    ahead.fd = read_end
    try:
        assert ahead.result() is None
    finally:
        ahead.close()


def _many_pods(folder: Path, n: int) -> Path:
    """``n`` Pods in one YAML stream, some with a block scalar holding an indented ``---`` line and a quoted
    multi-line scalar with one (neither is a document boundary), plus the example cluster's objects in a second
    file."""
    notes = ["note: |\n      line one\n      ---\n      line three", "note: 'line one\n\n      ---\n\n      end'",
             "note: plain"]
    docs = [f"apiVersion: v1\nkind: Pod\nmetadata:\n  name: p-{k:04d}\n  namespace: default\n  annotations:\n"
            f"    {notes[k % 3]}\nspec:\n  containers:\n  - name: c\n    resources:\n      requests:\n"
            f"        cpu: '1'\n" for k in range(n)]
    (folder / "pods.yaml").write_text("---\n".join(docs))
    (folder / "cluster.yaml").write_text(yaml.safe_dump_all(examples.documents()))
    return folder


def test_pieces_are_whole_documents_and_decode_to_the_files_objects(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _many_pods(tmp_path, 300)
    text = (folder / "pods.yaml").read_text()
    notes = [pod["metadata"]["annotations"]["note"] for pod in load_manifests([folder / "pods.yaml"]).pods]
    assert notes[:3] == ["line one\n---\nline three\n", "line one\n---\nend", "plain"]
    monkeypatch.setattr(loader, "PIECE_BYTES", 4096)
    files, pieces = loader.split_manifests([folder])
    per_file = [sum(1 for k, _ in pieces if k == f) for f in range(len(files))]
    assert per_file[files.index(folder / "pods.yaml")] > 5
    assert b"".join(data for k, data in pieces if files[k].name == "pods.yaml") == (folder / "pods.yaml").read_bytes()
    for k, data in pieces:
        if files[k].name == "pods.yaml":
            assert data.startswith((b"apiVersion", b"---"))
    joined = loader.join_snapshots([loader.load_piece(files[k], data) for k, data in pieces], [folder],
                                      len(files))
    assert joined == load_manifests([folder])
    # a stream with a directive is one piece (the directive belongs to the document after it)
    (tmp_path / "directive.yaml").write_text("%YAML 1.1\n" + text)
    _, pieces = loader.split_manifests([tmp_path / "directive.yaml"])
    assert len(pieces) == 1


def test_both_processes_take_pieces_and_the_join_keeps_the_stream_order(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The child (a thread here) waits in its first piece until this side has decoded one, so both sides decode
    some pieces; the joined snapshot is the sequential read's, objects in file and document order."""
    folder = _many_pods(tmp_path, 300)
    monkeypatch.setattr(loader, "PIECE_BYTES", 4096)
    ahead = ReadAhead.prepare([str(folder)], validate=True)
    assert ahead is not None
    parent_decoded = threading.Event()
    who: dict[str, list[int]] = {"child": [], "parent": []}
    decode = ahead.decode

    def tracked(index: int) -> Any:
        if threading.current_thread() is threading.main_thread():
            out = decode(index)
            who["parent"].append(index)
            parent_decoded.set()
            return out
        assert parent_decoded.wait(30)
        who["child"].append(index)
        return decode(index)

    ahead.decode = tracked  # type: ignore[method-assign]
    read_end, write_end = os.pipe()
    ahead.fd = read_end
    child = threading.Thread(target=_child, args=(ahead, write_end))
    child.start()
    try:
        snapshot = ahead.result()
    finally:
        child.join(60)
        ahead.close()
    assert who["child"] and who["parent"], who
    assert sorted(who["child"] + who["parent"]) == list(range(len(ahead.pieces)))
    assert snapshot == load_manifests([folder])


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


def test_the_collector_stays_off_until_the_exit_of_walras_plan_as_a_program() -> None:
    """Run as the program (``main()`` without ``argv``), ``walras plan`` ends through ``exit_now`` with the cyclic
    collector still off: switched back on after the plan, the next allocation would set off a full collection of what
    is still alive (0.23-0.27 s on 20,000 pods). Called with ``argv``, or interrupted as the program (it then returns
130), ``main`` leaves the collector as it was."""
    examples_dir = ROOT / "examples"
    code = (
        "import gc, os, sys\nimport walras.cli as cli\n"
        "def seen(status):\n"
        "    sys.stdout.flush()\n"
        "    sys.stderr.write(f'collector on at exit: {gc.isenabled()}, status {status}\\n')\n"
        "    sys.stderr.flush()\n"
        "    os._exit(status)\n"
        "cli.exit_now = seen\n"
        f"cli.main(['plan', '-f', {str(examples_dir)!r}, '-o', 'json'])\n"
        "sys.stderr.write(f'collector on after main(argv): {gc.isenabled()}\\n')\n"
        "import walras.cli.plan as plan\n"
        "run, plan.run = plan.run, lambda args: (_ for _ in ()).throw(KeyboardInterrupt())\n"
        "sys.argv = ['walras', 'plan', '-f', 'x']\n"
        "sys.stderr.write(f'interrupted: {cli.main()}, collector on: {gc.isenabled()}\\n')\n"
        "plan.run = run\n"
        f"sys.argv = ['walras', 'plan', '-f', {str(examples_dir)!r}, '-o', 'json']\n"
        "cli.main()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-3:] == ["collector on after main(argv): True",
                                             "interrupted: 130, collector on: True",
                                             "collector on at exit: False, status 0"], done.stderr
