"""The deploy checks' fixtures: each kustomization built once per session."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.deploy.support import KUBERNETES_DIR, kustomization_dirs, load_documents
from tests.support.services import run_tool


@pytest.fixture(scope="session")
def kustomize_builds() -> dict[str, list[dict[str, Any]]]:
    """``kubectl kustomize`` of every kustomization, by its path relative to deploy/kubernetes."""
    builds = {}
    for directory in kustomization_dirs():
        result = run_tool(["kubectl", "kustomize", str(directory)])
        assert result.returncode == 0, f"kubectl kustomize {directory} failed:\n{result.stderr}"
        builds[str(directory.relative_to(KUBERNETES_DIR))] = load_documents(result.stdout)
    return builds
