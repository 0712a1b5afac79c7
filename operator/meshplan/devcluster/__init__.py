"""A real Kubernetes control plane with simulated GPU nodes, as local processes.

Why: the machines that build and test meshplan have no Docker, so kind cannot
run. The same pieces controller-runtime's envtest and kwokctl run — etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, built from Go modules
by `e2e/build-control-plane.sh` — are started here as plain processes on
loopback, with kwok standing in for kubelets and a real Prometheus.

Layout:
- `pki`: a throwaway CA, serving and client certificates (openssl).
- `fleets`: GPU fleet files -> Node objects with the labels and allocatable
  NVIDIA's GPU feature discovery and device plugin set.
- `cluster`: start/stop/status of the processes, with a state directory that
  records pids, ports and paths so `down` stops exactly what `up` started.
"""

from .cluster import Cluster, ClusterError, default_state_dir  # noqa: F401
