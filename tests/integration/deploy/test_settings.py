"""The settings the deployments hand to inferwatch are ones inferwatch accepts, with the meaning intended.

Each deployment configures the exporter through its image's environment plus its own flags and
variables; here they are parsed by the exporter's real configuration code (a renamed flag or variable,
or a bad value, fails), and the demo command of the serving image by the demo's real argument parser.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from typing import Any

import pytest

from inferwatch.exporter.config import ENV_PREFIX, ExporterConfig, options, parse_config
from inferwatch.instrumentation.demo import command as demo
from tests.integration.deploy.support import DOCKER_DIR, VARIANTS, compose_config, parse_dockerfile

pytestmark = pytest.mark.integration

KNOWN_VARIABLES = {option.env for option in options()}


def image_environment(dockerfile: str) -> dict[str, str]:
    """The ENV of an image's runtime stage."""
    env = {}
    for args in parse_dockerfile(DOCKER_DIR / dockerfile)[-1].args_of("ENV"):
        for pair in shlex.split(args):
            key, _, value = pair.partition("=")
            env[key] = value
    return env


def exporter_config(args: list[str], env: dict[str, str]) -> ExporterConfig:
    """The exporter's configuration for ``args`` and ``env``, refusing variables it does not know."""
    unknown = {k for k in env if k.startswith(ENV_PREFIX)} - KNOWN_VARIABLES
    assert not unknown, f"the exporter has no variables {sorted(unknown)}"
    config = parse_config(args, env)
    assert config is not None
    return config


def test_the_exporter_image_configures_the_exporter() -> None:
    config = exporter_config([], image_environment("Dockerfile.exporter"))
    assert config.listen_address == ":8798"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_compose_exporter_finds_the_demo_process(variant: str) -> None:
    exporter = compose_config(VARIANTS[variant])["services"]["exporter"]
    env = {**image_environment("Dockerfile.exporter"), **exporter.get("environment", {})}
    # docker-compose prints `$$` (a literal `$`) escaped; the container gets one `$`.
    env = {key: value.replace("$$", "$") for key, value in env.items()}
    config = exporter_config(exporter.get("command", []), env)
    name_pattern = config.collector_settings["processes"].name_pattern
    assert config.enabled("processes") and name_pattern is not None
    assert name_pattern.search("inferwatch")  # the demo's process name (its console script)
    assert not name_pattern.search("inferwatch-expo")  # the exporter's own, cut to 15 characters


def _daemonset_container(build: list[dict[str, Any]]) -> dict[str, Any]:
    (daemonset,) = [o for o in build if o["kind"] == "DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    return container


def test_every_kubernetes_build_configures_the_exporter(kustomize_builds: dict) -> None:
    for name, build in kustomize_builds.items():
        container = _daemonset_container(build)
        env = {
            **image_environment("Dockerfile.exporter"),
            **{e["name"]: e["value"] for e in container["env"]},
        }
        config = exporter_config(container.get("args", []), env)
        assert config.listen_port == container["ports"][0]["containerPort"], name
        pod = next(o for o in build if o["kind"] == "DaemonSet")["spec"]["template"]["spec"]
        assert config.enabled("processes") is bool(pod.get("hostPID")), (
            f"{name}: per-process metrics need hostPID"
        )
        # Where the kubelet's socket directory is mounted, the exporter looks for the socket in it.
        mounted = {m["mountPath"] for m in container["volumeMounts"]}
        if "/var/lib/kubelet/pod-resources" in mounted:
            assert config.enabled("kubernetes"), name
            socket = config.collector_settings["kubernetes"].socket
            assert os.path.dirname(socket) == "/var/lib/kubelet/pod-resources", name


def test_the_serving_image_runs_the_demo_on_its_exposed_port() -> None:
    runtime = parse_dockerfile(DOCKER_DIR / "Dockerfile.serving")[-1]
    (entrypoint,) = runtime.args_of("ENTRYPOINT")
    (command,) = runtime.args_of("CMD")
    argv = json.loads(command)
    assert json.loads(entrypoint) == ["inferwatch"] and argv[0] == "demo"
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    args = parser.parse_args(argv[1:])
    assert args.addr == "0.0.0.0" and runtime.args_of("EXPOSE") == [str(args.port)]
    assert args.duration is None, "the image serves until stopped"
