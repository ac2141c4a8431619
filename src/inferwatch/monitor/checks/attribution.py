"""Which models and pods use which GPU, joined by the GPU's UUID alone.

Both sides carry ``uuid`` as NVML spells it: the serving process on ``llm_model_info`` and every
per-device series, the exporter on every ``gpu_*`` series and on ``gpu_kubernetes_pod_info``. Neither a
device index (each process and container numbers its own GPUs from 0) nor a host (a pod's scrape address
is the pod's, not the node's) ties the two sides together. ``diagnose`` and ``top`` both read this.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from ..expr import group_of
from ..queries import GPU_PODS, MODEL, MODEL_GPUS
from ..scrape import Labels
from .findings import Source


def model_gpus(model_groups: Iterable[Labels]) -> dict[Labels, str]:
    """Model group (``queries.MODEL``) -> the UUID of the GPU the model runs on, from the groups of
    ``queries.MODEL_GPUS``; models on the CPU are left out."""
    out: dict[Labels, str] = {}
    for group in model_groups:
        labels = dict(group)
        if labels.get("uuid"):
            out[group_of(labels, MODEL)] = labels["uuid"]
    return out


def gpu_users(model_groups: Iterable[Labels], pod_groups: Iterable[Labels]) -> dict[str, tuple[str, ...]]:
    """GPU UUID -> who uses it: ``model NAME on INSTANCE`` for each instrumented model (the groups of
    ``queries.MODEL_GPUS``), then ``pod NAMESPACE/NAME`` for each pod the kubelet gave it to (the groups
    of ``queries.GPU_PODS``)."""
    users: defaultdict[str, set[str]] = defaultdict(set)
    for group, uuid in model_gpus(model_groups).items():
        labels = dict(group)
        users[uuid].add(f"model {labels['model']} on {labels['instance']}")
    for group in pod_groups:
        labels = dict(group)
        if labels.get("uuid") and labels.get("pod"):
            users[labels["uuid"]].add(f"pod {labels.get('namespace', '')}/{labels['pod']}")
    # Models first, then pods: sorted by kind, then by name.
    return {
        uuid: tuple(sorted(found, key=lambda u: (not u.startswith("model"), u)))
        for uuid, found in users.items()
    }


def serving_on(source: Source) -> Callable[[Labels], str]:
    """For the group of a GPU series (it has ``uuid``): the end of a finding's summary that names whom the
    GPU serves, ``; it serves model a on h:8797, pod ns/a``, or nothing when no user is known."""
    users = gpu_users(source.series(MODEL_GPUS), source.series(GPU_PODS))

    def serving(gpu: Labels) -> str:
        found = users.get(dict(gpu).get("uuid", ""), ())
        return f"; it serves {', '.join(found)}" if found else ""

    return serving
