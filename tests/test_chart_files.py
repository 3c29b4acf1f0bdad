"""The Helm chart is self-contained and its README documents its values (issue 29: ``crds/`` and ``files/`` were
symbolic links out of the chart, so a copied chart failed with "error evaluating symlink"; there was no README).

``scripts/sync_chart.py --check`` (``make chart`` writes) finds no copy out of date; a copy of the chart alone, in a
directory with nothing beside it, passes ``helm lint`` and renders; and the README has a row for every key of
values.yaml with its default.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.realtools import require

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "walras"


def sync_chart():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("sync_chart", ROOT / "scripts" / "sync_chart.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sync_chart"] = module
    spec.loader.exec_module(module)
    return module


def test_the_chart_has_no_link_and_its_copies_are_up_to_date() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "sync_chart.py"), "--check"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    links = [p for p in CHART.rglob("*") if p.is_symlink()]
    assert links == []
    for crd in sorted((ROOT / "crds").glob("*.yaml")):
        assert (CHART / "crds" / crd.name).read_bytes() == crd.read_bytes()


def test_the_check_names_a_stale_copy(tmp_path: Path) -> None:
    module = sync_chart()
    for name in ("crds", "deploy", "helm"):
        shutil.copytree(ROOT / name, tmp_path / name)
    assert module.stale(tmp_path) == []
    (tmp_path / "crds" / "resourcepools.walras.dev.yaml").write_text("# changed\n")
    (tmp_path / "helm" / "walras" / "crds" / "old.walras.dev.yaml").write_text("# left over\n")
    assert module.stale(tmp_path) == ["helm/walras/crds/resourcepools.walras.dev.yaml is out of date",
                                      "helm/walras/crds/old.walras.dev.yaml has no source in crds/"]
    module.sync(tmp_path)
    assert module.stale(tmp_path) == []


def test_the_readme_lists_every_value_with_its_default() -> None:
    readme = (CHART / "README.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def leaves(node: object, prefix: str = "") -> list[tuple[str, object]]:
        if isinstance(node, dict) and node:
            return [leaf for k, v in node.items() for leaf in leaves(v, f"{prefix}{k}.")]
        return [(prefix[:-1], node)]

    for key, default in leaves(values):
        assert f"| `{key}` | `{json.dumps(default)}` |" in readme.replace("\\|", "|"), key
    assert "kubectl apply -R -f examples/" in readme
    assert "| `operator.planPeriod` | `30` | Seconds between periodic re-plans" in readme


def test_a_copied_chart_lints_and_renders(tmp_path: Path) -> None:
    binary = require("helm")
    copy = tmp_path / "walras"
    shutil.copytree(CHART, copy, symlinks=True)  # links would stay links and dangle here
    lint = subprocess.run([binary, "lint", "--strict", str(copy)], capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "0 chart(s) failed" in lint.stdout
    rendered = subprocess.run([binary, "template", "walras", str(copy), "--include-crds"], capture_output=True,
                              text=True, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d}
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount"} <= kinds
