"""Shared pieces of the deploy checks: paths, and readers of the compose stack, the Dockerfiles and the
alert rules' configuration (the tools run through :func:`tests.support.services.run_tool`)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support import PACKAGE_ROOT, REPO_ROOT
from tests.support.services import run_tool

DEPLOY = REPO_ROOT / "deploy"
COMPOSE_DIR = DEPLOY / "compose"
DOCKER_DIR = DEPLOY / "docker"
KUBERNETES_DIR = DEPLOY / "kubernetes"


def load_documents(text: str) -> list[dict[str, Any]]:
    """The non-empty documents of a multi-document YAML text."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def project_version() -> str:
    """The distribution's version, from pyproject.toml (the images are tagged with it)."""
    text = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'^version = "([^"]+)"$', text, flags=re.MULTILINE)
    assert match, "pyproject.toml has no version"
    return match[1]


def alert_rule_jobs() -> dict[str, str]:
    """The job each selector of the alert rules' configuration (alerts/config.yaml) matches."""
    config = yaml.safe_load((PACKAGE_ROOT / "alerts" / "config.yaml").read_text(encoding="utf-8"))
    jobs = {}
    for name, matchers in config["selectors"].items():
        match = re.search(r'\bjob\s*=\s*"([^"]+)"', matchers)
        assert match, f"selector {name!r} ({matchers!r}) names no job"
        jobs[name] = match[1]
    return jobs


def kustomization_dirs() -> list[Path]:
    """Every buildable kustomization (base and overlays; components are built through the overlays)."""
    return sorted(
        p.parent
        for p in KUBERNETES_DIR.rglob("kustomization.yaml")
        if yaml.safe_load(p.read_text(encoding="utf-8"))["kind"] == "Kustomization"
    )


# ------------------------------------------------------------------------------------------ compose stack

COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
GPU_OVERRIDE = COMPOSE_DIR / "compose.gpu.yaml"
# Sharded Prometheus agents, VictoriaMetrics and vmalert in place of the one Prometheus (a stack of its own).
FLEET_FILE = COMPOSE_DIR / "compose.fleet.yaml"
# (Not named "gpu": that is the marker that skips tests on machines without CUDA.)
VARIANTS = {
    "default": (COMPOSE_FILE,),
    "nvidia-override": (COMPOSE_FILE, GPU_OVERRIDE),
    "fleet": (FLEET_FILE,),
}


@functools.cache
def compose_config(files: tuple[Path, ...]) -> dict[str, Any]:
    """The stack as docker-compose resolves it (paths absolute, ports normalised); fails if invalid.
    Cached: docker-compose takes about a second to start. Callers must not modify the result."""
    args = [arg for f in files for arg in ("-f", str(f))]
    result = run_tool(["docker-compose", *args, "config"])
    assert result.returncode == 0, f"docker-compose config failed:\n{result.stderr}"
    return yaml.safe_load(result.stdout)


def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts (named volumes left out)."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target, _mode = volume.split(":")
        if source.startswith("/"):
            mounts[target] = Path(source)
    return mounts


def container_ports(service: dict[str, Any]) -> set[int]:
    """The container ports a service publishes."""
    return {int(p.rsplit(":", 1)[1].split("/")[0]) for p in service.get("ports", [])}


# ---------------------------------------------------------------------------------------------- Dockerfiles


@dataclass
class Stage:
    """One build stage: its base image and its instructions (name, arguments), in order."""

    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args_of(self, instruction: str) -> list[str]:
        """The arguments of every ``instruction`` of the stage, whitespace normalised."""
        return [args for name, args in self.instructions if name == instruction]


def parse_dockerfile(path: Path) -> list[Stage]:
    """The build stages of a Dockerfile: base image (global ARG defaults substituted) and instructions."""
    text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, args = line.partition(" ")
        name, args = name.upper(), " ".join(args.split())
        if name == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m[1]], args.split()[0])
            stages.append(Stage(image))
        elif stages:
            stages[-1].instructions.append((name, args))
        elif name == "ARG":
            key, _, default = args.partition("=")
            global_args[key] = default
    return stages
