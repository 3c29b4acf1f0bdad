"""``walras simulate`` validates its cluster and the trace's job types, with suggestions (issue 29: ``a100=2x8``
was accepted silently and an unknown job type listed none of the known ones)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from walras.cli import simulate as cli
from walras.cli.errors import UsageError

from allocator.datasets import gavel_throughputs


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["simulate", *argv])


@pytest.mark.parametrize(("cluster", "message"), [
    ("a100=2x8", "--cluster: no job type is measured on 'a100': the accelerator types are k80, p100, v100; the "
                 "format is TYPE=NODESxGPUS,... (e.g. k80=8x4,p100=8x4,v100=8x4)"),
    ("k80=2x4,p-100=2x4", "no job type is measured on 'p-100': did you mean p100?"),
    ("v100=2", "cluster item 'v100=2' is not TYPE=NODESxGPUS (e.g. v100=8x4); TYPE is one of k80, p100, v100"),
])
def test_bad_clusters_are_refused_with_the_format(tmp_path: Path, cluster: str, message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        cli.run(args("--generate", "--jobs", "2", "--cluster", cluster, "-o", str(tmp_path)))


def test_an_unknown_job_type_gets_the_closest_ones(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival,job_type,work,pods\n0,ResNet-50 (batch size 65),100,1\n")
    with pytest.raises(UsageError) as caught:
        cli.run(args("--trace", str(trace), "-o", str(tmp_path)))
    text = str(caught.value)
    assert "job type 'ResNet-50 (batch size 65)' with 1 pod(s): not a job type of Gavel's table" in text
    assert "did you mean 'ResNet-50 (batch size 64)'" in text and "walras simulate --job-types" in text


def test_job_types_lists_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(args("--job-types")) == 0
    out = capsys.readouterr().out
    table = gavel_throughputs()
    for name in set(table.job_types):  # every name of the measured table, each once
        if name in cli.job_types():
            assert out.count(f"  {name}  pods ") == 1, name
    assert out.startswith("job types (pods measured with), on k80, p100, v100:")
