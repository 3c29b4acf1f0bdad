"""A kubelet stand-in (in the spirit of kwok) and a local control plane from real binaries, for ``walras demo`` and
the tests: clusters where Nodes are API objects and no container runs.

* :mod:`walras_testbed.kubelet.standin`: :class:`KubeletStandIn` registers a scenario's Nodes, renews their Leases,
  admits bound pods as a kubelet does (``Running``, or ``Failed`` with ``OutOf<resource>``), finishes deletions, and
  can complete or fail pods, take nodes NotReady or lose them (silent), and keep a pod being deleted
  ``Terminating`` for its grace period where its annotation says it checkpoints. :class:`KubeletThread` runs it
  in a background thread.
* :mod:`walras_testbed.kubelet.controlplane`: :class:`LocalControlPlane` starts etcd, kube-apiserver,
  kube-controller-manager (and kube-scheduler) from ``$KUBEBUILDER_ASSETS``.

Written on aiohttp (already the operator's HTTP library) rather than the ``kubernetes`` client: the stand-in needs
watch streams, merge/strategic patches on subresources and delete preconditions, all plain HTTP, in one event loop.
This package knows nothing of Walras's planning: it only reproduces what a kubelet shows the control plane.
"""

from walras_testbed.kubelet.client import ApiClient, ApiConfig, ApiError
from walras_testbed.kubelet.runner import KubeletThread
from walras_testbed.kubelet.standin import KubeletStandIn

__all__ = ["ApiClient", "ApiConfig", "ApiError", "KubeletStandIn", "KubeletThread"]
