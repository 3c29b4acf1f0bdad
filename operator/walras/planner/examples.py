"""The example cluster of ``examples/`` packaged with ``walras`` (for ``walras demo`` and tests).

``walras/data/examples.yaml`` is the concatenation of the files under ``examples/`` (``cluster/nodes.yaml``,
``pools.yaml``, ``profile.yaml``, ``jobs/*.yaml``) in :data:`FILES` order; ``tests/test_examples.py`` checks that the
copy equals the originals. Regenerate it with ``python -m walras.planner.examples --write`` after editing
``examples/``.
"""

from __future__ import annotations

import argparse
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from walras.planner.manifests import parse_documents
from walras.planner.model import Snapshot

#: The example files, relative to ``examples/``, in the order the packaged copy concatenates them.
FILES: tuple[str, ...] = ("cluster/nodes.yaml", "pools.yaml", "profile.yaml", "jobs/gpu.yaml", "jobs/cpu.yaml")


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


def concatenate(examples_dir: Path) -> str:
    """The packaged file's text built from ``examples_dir`` (documents separated by ``---``)."""
    parts = []
    for name in FILES:
        parts.append(f"# --- examples/{name}\n" + (examples_dir / name).read_text().rstrip("\n") + "\n")
    return "---\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate walras/data/examples.yaml from examples/.")
    parser.add_argument("--examples", default="examples", help="the examples directory")
    parser.add_argument("--write", action="store_true", help="write the packaged copy")
    args = parser.parse_args(argv)
    text = concatenate(Path(args.examples))
    target = Path(__file__).resolve().parents[1] / "data" / "examples.yaml"
    if args.write:
        target.write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
