"""A fake Kubernetes apiserver that speaks the real list/watch HTTP protocol.

It serves pods, nodes, apps/v1 daemonsets, nvidia.com/v1 clusterpolicies (the GPU Operator CRD, which
can be "not installed"), resource.k8s.io resourceclaims (v1, or the beta versions older clusters serve)
and coordination.k8s.io/v1 leases, with the discovery endpoints the official `kubernetes` client needs,
and the TokenReview / SubjectAccessReview of the scenario's users. Like etcd, one revision counter
spans all kinds; lists come in pages as one snapshot; watches resume from a resourceVersion, get
BOOKMARK events and an ERROR 410 ("too old resource version") once the version is compacted away. It
passes the same conformance suite as Kubernetes' own apiserver (tests/controlplane/test_conformance.py).
The kinds, the versioned store and its watch fan-out live in `store`, discovery in `discovery`, chunked
lists in `paging`, the reviews in `reviews`, and `FakeApiServer` (HTTP routes on a background event
loop: start, stop, restart on the same port, kubeconfig) in `server`.
"""

from periscope.sim.apiserver.server import FakeApiServer

__all__ = ["FakeApiServer"]
