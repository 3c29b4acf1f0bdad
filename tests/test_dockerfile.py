"""Static checks of the operator image's ``Dockerfile`` and ``.dockerignore``.

No Docker engine is available where these tests run, so the image is never built here: the Dockerfile is parsed
(continuation lines joined, comments dropped) and its instructions checked against the project (Python version,
the torch pin of the Makefile, the console script, the chart's ports, user and image name).
"""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Stage:
    """One build stage: its base image, its name and its instructions as (INSTRUCTION, arguments)."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Return the global ARG defaults and the stages of a Dockerfile; raises ValueError on unknown instructions."""
    known = {"FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "WORKDIR", "USER", "EXPOSE", "ENTRYPOINT", "CMD", "LABEL",
             "HEALTHCHECK", "SHELL", "STOPSIGNAL", "VOLUME", "ONBUILD"}
    logical: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    if current:
        raise ValueError("Dockerfile ends inside a continuation line")
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for number, line in enumerate(logical):
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction not in known:
            raise ValueError(f"instruction {number}: unknown {instruction!r}")
        if instruction == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            base = words[0]
            for key, value in global_args.items():
                base = base.replace("${" + key + "}", value)
            stages.append(Stage(base=base, name=name))
        elif not stages:
            if instruction != "ARG":
                raise ValueError(f"instruction {number}: {instruction} before the first FROM")
            key, _, value = args.partition("=")
            global_args[key.strip()] = value.strip()
        else:
            stages[-1].instructions.append((instruction, args.strip()))
    return global_args, stages


DOCKERFILE = (ROOT / "Dockerfile").read_text()
GLOBAL_ARGS, STAGES = parse_dockerfile(DOCKERFILE)
FINAL = STAGES[-1]
BUILD = next(s for s in STAGES if s.name == "build")


def stage_args(stage: Stage) -> dict[str, str]:
    found = {}
    for instruction, args in stage.instructions:
        if instruction == "ARG" and "=" in args:
            key, _, value = args.partition("=")
            found[key] = value
    return found


def ignored(path: str, patterns: list[str]) -> bool:
    for pattern in patterns:
        pattern = pattern.rstrip("/")
        if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path.split("/")[0], pattern):
            return True
        if pattern.startswith("**/") and any(fnmatch.fnmatch(part, pattern[3:]) for part in path.split("/")):
            return True
    return False


def test_parser_rejects_broken_files() -> None:
    with pytest.raises(ValueError, match="unknown"):
        parse_dockerfile("FROM x\nRUNN true\n")
    with pytest.raises(ValueError, match="before the first FROM"):
        parse_dockerfile("RUN true\nFROM x\n")
    with pytest.raises(ValueError, match="continuation"):
        parse_dockerfile("FROM x\nRUN a \\\n")


def test_multi_stage_on_a_slim_python_matching_the_project() -> None:
    assert len(STAGES) >= 2 and [s.name for s in STAGES] == ["build", "runtime"]
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minimum = re.search(r"(\d+\.\d+)", requires)
    assert minimum is not None
    for stage in STAGES:
        assert re.fullmatch(rf"python:{re.escape(minimum[1])}-slim(-[a-z]+)?", stage.base), stage.base
    assert not any(i == "ADD" for s in STAGES for i, _ in s.instructions)


def test_torch_cpu_is_installed_explicitly_before_the_project() -> None:
    pinned = re.search(r"torch==([0-9.]+)", (ROOT / "Makefile").read_text())
    assert pinned is not None
    args = stage_args(BUILD)
    assert args["TORCH_VERSION"] == pinned[1] == "2.13.0"
    assert args["TORCH_INDEX_URL"].rstrip("/").endswith("/whl/cpu")
    runs = [a for i, a in BUILD.instructions if i == "RUN"]
    torch_at = next(n for n, a in enumerate(runs) if '"torch==${TORCH_VERSION}"' in a)
    assert '--index-url "${TORCH_INDEX_URL}"' in runs[torch_at]
    project_at = next(n for n, a in enumerate(runs) if re.search(r"pip install \.(\s|$)", a))
    assert torch_at < project_at


def test_torch_is_left_out_of_the_default_image() -> None:
    """The operator plans on the CPU (numpy) and never imports torch; torch is the project's ``torch`` extra
    (pyproject.toml) and enters the image only with ``--build-arg WITH_TORCH=true`` (issue 29: a light install)."""
    assert stage_args(BUILD)["WITH_TORCH"] == "false"
    runs = [a for i, a in BUILD.instructions if i == "RUN"]
    torch_runs = [a for a in runs if '"torch==${TORCH_VERSION}"' in a]
    assert torch_runs and all('[ "${WITH_TORCH}" = true ]' in a for a in torch_runs)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("torch") for d in project["dependencies"])
    assert any(d.startswith("torch") for d in project["optional-dependencies"]["torch"])


def test_runtime_stage_is_non_root_and_carries_only_the_environment() -> None:
    users = [a for i, a in FINAL.instructions if i == "USER"]
    assert users, "the runtime stage must switch to a non-root user"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0
    values = yaml.safe_load((ROOT / "helm" / "walras" / "templates" / "deployment.yaml").read_text().split(
        "securityContext:")[1].split("seccompProfile")[0])
    assert values["runAsUser"] == int(uid) and values["runAsGroup"] == int(gid)
    copies = [a for i, a in FINAL.instructions if i == "COPY"]
    assert copies == ["--from=build /opt/walras /opt/walras"]
    assert not any(i == "RUN" and "pip" in a for i, a in FINAL.instructions)


def test_entrypoint_ports_and_image_name_match_the_chart() -> None:
    instructions = dict(FINAL.instructions)
    assert json.loads(instructions["ENTRYPOINT"]) == ["walras"]
    assert json.loads(instructions["CMD"]) == ["run"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["walras"] == "walras.cli:main"
    values = yaml.safe_load((ROOT / "helm" / "walras" / "values.yaml").read_text())
    assert {int(p) for p in instructions["EXPOSE"].split()} == set(values["operator"]["ports"].values())
    assert 'org.opencontainers.image.title="walras"' in instructions["LABEL"]
    assert values["image"]["repository"] == "walras"
    chart = yaml.safe_load((ROOT / "helm" / "walras" / "Chart.yaml").read_text())
    assert chart["appVersion"] == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_copied_sources_exist_and_are_not_ignored() -> None:
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    for needed in (".git", ".venv", ".tools"):
        assert ignored(needed, patterns)
    sources = []
    for instruction, args in BUILD.instructions:
        if instruction == "COPY" and not args.startswith("--from"):
            sources.extend(args.split()[:-1])
    assert {"pyproject.toml", "README.md", "allocator", "operator"} <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not ignored(source, patterns), f"{source} is copied but excluded by .dockerignore"
    assert ignored("operator/walras/__pycache__", patterns)


def test_numba_cache_is_on_the_writable_tmp_volume() -> None:
    """The root filesystem is read-only (chart), so numba's kernel cache must live under the /tmp emptyDir."""
    envs = " ".join(a for i, a in FINAL.instructions if i == "ENV")
    found = re.search(r"NUMBA_CACHE_DIR=(\S+)", envs)
    assert found and found.group(1).startswith("/tmp/")
    deployment = (ROOT / "helm" / "walras" / "templates" / "deployment.yaml").read_text()
    assert "readOnlyRootFilesystem: true" in deployment and "mountPath: /tmp" in deployment


def test_pricing_kernels_are_compiled_ahead_of_time_in_the_build_stage() -> None:
    """A fresh pod's first plan must not import numba or compile (allocator/pricing/_compiled/kernels.py, route "aot"):
    the build stage compiles the kernels after installing the project and checks that the route loads; the compiler
    stays in the build stage."""
    runs = [a for i, a in BUILD.instructions if i == "RUN"]
    project_at = next(n for n, a in enumerate(runs) if re.search(r"pip install \.(\s|$)", a))
    aot_at = next(n for n, a in enumerate(runs) if "python -m allocator.pricing._compiled.aot" in a)
    assert project_at <= aot_at
    assert "gcc" in runs[aot_at] and "k.route == 'aot'" in runs[aot_at]
    assert runs[aot_at].index("apt-get install") < runs[aot_at].index("python -m allocator.pricing._compiled.aot")
    assert not any(i == "RUN" and "gcc" in a for i, a in FINAL.instructions)
    from allocator.pricing._compiled import kernels

    assert kernels.AOT_MODULE == "allocator.pricing._compiled._kernels_aot"

