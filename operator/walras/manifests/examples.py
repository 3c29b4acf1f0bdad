"""The example cluster packaged with ``walras`` (for ``walras demo`` and tests).

``walras/data/examples.yaml`` is the concatenation of the emulated nodes (``operator/walras/data/emulated-nodes.yaml``)
and the files under ``examples/`` in :data:`FILES` order (paths from the repository root); ``tests/test_examples.py``
checks that the copy equals the originals. Regenerate it with ``python -m walras.manifests.examples --write`` (from the
repository root) after editing them.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from walras.manifests.loader import parse_documents
from walras.planner.model import Snapshot

#: The example files, relative to ``examples/``, in the order the packaged copy concatenates them.
FILES: tuple[str, ...] = ("operator/walras/data/emulated-nodes.yaml", "examples/00-namespaces.yaml",
                          "examples/pools.yaml", "examples/profile.yaml", "examples/jobs/gpu.yaml",
                          "examples/jobs/cpu.yaml")


def example_paths() -> list[Path]:
    """Path(s) of the packaged example manifests (one multi-document YAML file)."""
    return [Path(str(resources.files("walras").joinpath("data/examples.yaml")))]


def documents() -> list[dict[str, Any]]:
    """Every object of the example cluster, decoded."""
    text = resources.files("walras").joinpath("data/examples.yaml").read_text()
    return [doc for doc in yaml.safe_load_all(text) if isinstance(doc, dict)]


def snapshot() -> Snapshot:
    """The example cluster as a :class:`Snapshot` (no pods running yet)."""
    return parse_documents(documents(), "walras/data/examples.yaml")


def concatenate(root: Path) -> str:
    """The packaged file's text built from the sources under the repository ``root`` (documents separated by
    ``---``, each headed by its path)."""
    parts = [f"# --- {name}\n" + (root / name).read_text().rstrip("\n") + "\n" for name in FILES]
    return "---\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate walras/data/examples.yaml from examples/.")
    parser.add_argument("--root", default=".", help="the repository root")
    parser.add_argument("--write", action="store_true", help="write the packaged copy")
    args = parser.parse_args(argv)
    text = concatenate(Path(args.root))
    target = Path(__file__).resolve().parents[1] / "data" / "examples.yaml"
    if args.write:
        target.write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
