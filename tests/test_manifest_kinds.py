"""``walras plan`` refuses the kinds it would otherwise skip silently, with the fix in the message (issue 29: a
``FungibleJobs`` typo and a ``batch/v1`` Job were skipped and the command exited 0)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from walras.manifests import load_manifests

ROOT = Path(__file__).resolve().parents[1]


def plan(*files: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT)])}
    args = [a for f in files for a in ("-f", str(f))]
    return subprocess.run([sys.executable, "-m", "walras", "plan", "-f", str(ROOT / "examples"), *args],
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize(("api", "kind", "fix"), [
    ("walras.dev/v1alpha1", "FungibleJobs", "did you mean FungibleJob?"),
    ("walras.dev/v1alpha1", "resourcepool", "did you mean ResourcePool?"),
    ("walras.dev/v1alpha1", "ColocationProfil", "did you mean ColocationProfile?"),
    ("walras.dev/v1alpha1", "Market", "is not a Walras kind: the walras.dev kinds are ResourcePool, FungibleJob"),
    ("batch/v1", "Job", "describe the workload as a FungibleJob"),
    ("apps/v1", "Deployment", "describe the workload as a FungibleJob"),
])
def test_unknown_kind_is_an_error_with_the_fix(tmp_path: Path, api: str, kind: str, fix: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"apiVersion: {api}\nkind: {kind}\nmetadata: {{name: x, namespace: ml}}\nspec: {{}}\n")
    with pytest.raises(ValueError, match=r"bad\.yaml document 0: kind") as caught:
        load_manifests(bad, validate=False)
    assert fix in str(caught.value)


def test_walras_plan_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "jobs.yaml"
    bad.write_text("apiVersion: walras.dev/v1alpha1\nkind: FungibleJobs\nmetadata: {name: x, namespace: ml}\n")
    result = plan(bad)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"walras plan: error: {bad} document 0: kind 'FungibleJobs' (walras.dev/v1alpha1) is not a kind walras "
        "reads: did you mean FungibleJob?"]
    assert result.stdout == ""


def test_kinds_the_planner_does_not_read_are_passed_over(tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\napiVersion: v1\nkind: Service\n"
                     "metadata: {name: s}\n")
    result = plan(other)  # examples/ itself has Namespaces
    assert result.returncode == 0, result.stderr
    assert "solver:" in result.stdout


def test_an_object_without_a_kind_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "nokind.yaml"
    bad.write_text("apiVersion: v1\nmetadata: {name: c}\n")
    with pytest.raises(ValueError, match="without a kind"):
        load_manifests(bad, validate=False)
