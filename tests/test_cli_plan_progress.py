"""``walras plan`` reports its slow steps on stderr (issue 29: a 5,000-job file printed nothing for 34 s): with
``--progress``, or by default on a terminal for manifests of 1 MiB or more; stdout (the plan) is the same with and
without it, and a failed step says so before the one-line error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from walras.cli import main
from walras.cli.plan import PROGRESS_BYTES, input_bytes, show_progress

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = str(ROOT / "examples")
NODES = str(ROOT / "operator" / "walras" / "data" / "emulated-nodes.yaml")


def _count(kind: str, *paths: str) -> int:
    files = [p for path in map(Path, paths) for p in ([path] if path.is_file() else sorted(path.rglob("*.yaml")))]
    return sum(1 for f in files for doc in yaml.safe_load_all(f.read_text()) if doc and doc.get("kind") == kind)


def test_progress_names_each_step_and_leaves_stdout_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", EXAMPLES, "-f", NODES]) == 0
    quiet = capsys.readouterr()
    assert "walras plan:" not in quiet.err  # not a terminal, no --progress: nothing
    pods = tmp_path / "pods.yaml"
    assert main(["plan", "-f", EXAMPLES, "-f", NODES, "--progress", "--emit-pods", str(pods)]) == 0
    loud = capsys.readouterr()
    def plan_lines(out: str) -> list[str]:  # the last line reports the solve's and the plan's seconds
        return [line for line in out.splitlines() if not line.startswith("solver:")]

    assert plan_lines(loud.out) == plan_lines(quiet.out) and "POOL" in loud.out
    lines = [line for line in loud.err.splitlines() if line.startswith("walras plan:")]
    nodes, jobs = _count("Node", NODES), _count("FungibleJob", EXAMPLES)
    assert (nodes, jobs) == (9, 11)
    steps = ["reading 2 manifest path(s) and loading the planner",
             f"planning {nodes} node(s), {jobs} FungibleJob(s), 0 pod(s)", f"writing the pods to {pods}"]
    expected = [f"walras plan: {s} ..." for s in steps]
    starts = [line for line in lines if line.endswith(" ...")]
    ends = [line for line in lines if not line.endswith(" ...")]
    assert starts == expected
    assert len(ends) == 3 and all(re.fullmatch(rf"walras plan: {re.escape(s)}: done \(\d+\.\d s\)", e)
                                  for s, e in zip(steps, ends, strict=True))
    assert pods.stat().st_size > 0


def test_a_failed_step_says_so_before_the_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: walras.dev/v1alpha1\nkind: FungibleJobs\nmetadata: {name: x, namespace: a}\n")
    assert main(["plan", "-f", str(bad), "--progress"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"walras plan: reading 1 manifest path\(s\) and loading the planner: failed \(\d+\.\d s\)", err)
    assert "walras plan: error:" in err and "FungibleJobs" in err
    assert "planning" not in err


def test_by_default_only_a_terminal_with_a_large_input_shows_progress(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    (small / "a.yaml").write_text("# small\n")
    (small / "ignored.txt").write_bytes(b"x" * PROGRESS_BYTES)  # not a manifest: not counted
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * PROGRESS_BYTES + b"\n")
    assert input_bytes([str(small)]) == 8 and input_bytes([str(big), str(tmp_path / "missing.yaml")]) > PROGRESS_BYTES
    assert not show_progress(None, [str(small)], terminal=True)
    assert show_progress(None, [str(big)], terminal=True)
    assert not show_progress(None, [str(big)], terminal=False)
    assert show_progress(True, [str(small)], terminal=False)
    assert not show_progress(False, [str(big)], terminal=True)
