"""docs/reference/api.md and docs/reference/cli.md are what scripts/gen_api_reference.py generates from crds/ and
walras.cli's parsers now (regenerate with ``python scripts/gen_api_reference.py``), and the generated pages carry the
facts a reader looks up: every spec field of every kind, every option of every sub-command."""

from __future__ import annotations

import argparse

import yaml

from scripts import gen_api_reference as gen


def test_the_api_reference_is_current() -> None:
    assert gen.API_PAGE.read_text() == gen.render_api(), "run: python scripts/gen_api_reference.py"


def test_the_cli_reference_is_current() -> None:
    assert gen.CLI_PAGE.read_text() == gen.render_cli(), "run: python scripts/gen_api_reference.py"


def _leaf_paths(node: dict, path: str = "") -> list[str]:
    """Field paths of a schema, walked independently of the generator (properties only)."""
    out = []
    for name, child in node.get("properties", {}).items():
        here = f"{path}.{name}" if path else name
        out.append(here)
        out += _leaf_paths(child, here)
        items = child.get("items", {})
        out += _leaf_paths(items, f"{here}[]") if isinstance(items, dict) else []
    return out


def test_every_field_of_every_kind_has_a_row_with_its_description() -> None:
    page = gen.API_PAGE.read_text()
    for crd_file in sorted(gen.CRDS.glob("*.yaml")):
        crd = yaml.safe_load(crd_file.read_text())
        kind = crd["spec"]["names"]["kind"]
        section = page.split(f"\n## {kind}\n", 1)[1].split("\n## ", 1)[0]
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path in _leaf_paths(schema):
            if path.split(".")[0] in ("apiVersion", "kind", "metadata"):
                continue
            assert f"| `{path}` |" in section, (kind, path)
        for column in crd["spec"]["versions"][0].get("additionalPrinterColumns", []):
            assert f"| {column['name']} |" in section, (kind, column["name"])
    assert "| `spec.share` | number | yes |  | > `0`; <= `1000000000` |" in page
    assert "`self.all(k, size(k) <= 253" in page


def test_every_option_of_every_subcommand_is_listed() -> None:
    from walras.cli import build_parser

    page = gen.CLI_PAGE.read_text()
    commands = gen.subcommands(build_parser())
    assert set(commands) == {"solve", "plan", "check", "explain", "simulate", "run", "demo"}
    for name, parser in commands.items():
        section = page.split(f"\n## walras {name}\n", 1)[1].split("\n## ", 1)[0]
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings:
                assert f"`{flag}`" in section, (name, flag)
    assert "| `--plan-period` | `PLAN_PERIOD` | `30.0` |" in page
