"""A real Kubernetes control plane for tests and `periscope up --apiserver kube` (development kit).

devkit/controlplane is a small Go program: an embedded etcd and Kubernetes' own kube-apiserver, on
loopback, with certificates made at start, a static token file for test users, RBAC and Node
authorization and `--runtime-config` passed through (so a test can serve only
`resource.k8s.io/v1beta1`, as a 1.32 cluster does). `build` compiles it once into a cache outside the
checkout; `process.ControlPlane` runs it as a child that dies with its owner; `writer.KubeObjects`
writes the simulated cluster into it; `cluster` prepares one for `periscope up` (the deploy/ RBAC,
the scenario's users). `python -m periscope.sim.controlplane` starts one by hand.
"""

from periscope.sim.controlplane.build import ControlPlaneUnavailable, ensure_built
from periscope.sim.controlplane.process import ControlPlane, TokenUser, service_account_user

__all__ = ["ControlPlane", "ControlPlaneUnavailable", "TokenUser", "ensure_built", "service_account_user"]
