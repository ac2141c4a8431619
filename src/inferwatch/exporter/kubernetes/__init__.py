"""Kubernetes attribution: which pods and containers hold each GPU, and which pod a process runs in.

* :mod:`.podresources`: the kubelet's PodResources API (gRPC over the node's unix socket), listed on a
  thread of its own; ``podresources.proto`` is the published API and ``podresources_pb2.py`` the code
  generated from it (``make podresources``), the only modules here that import protobuf and gRPC.
* :mod:`.devices`: the GPU or MIG device a PodResources device ID names.
* :mod:`.cgroup`: the pod UID and container ID of a process, from ``/proc/<pid>/cgroup``.

The collectors that turn these into series are in :mod:`inferwatch.exporter.collectors.kubernetes`.
"""
