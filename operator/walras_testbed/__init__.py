"""The stand-ins that ``walras demo`` and the tests run the product against; no part of the product.

* :mod:`walras_testbed.kubelet`: a kubelet stand-in (in the spirit of kwok) that plays the Nodes of a real control
  plane, and :class:`~walras_testbed.kubelet.controlplane.LocalControlPlane`, which starts etcd, kube-apiserver and
  kube-controller-manager from ``$KUBEBUILDER_ASSETS``;
* :mod:`walras_testbed.emulator`: an in-memory emulated Kubernetes API on loopback, for machines without the
  control-plane binaries (NOT a real cluster; ``docs/emulator.md`` lists how it differs).

Import-linter contracts (``pyproject.toml``) keep the two sides apart: nothing here imports ``walras`` or
``allocator``, the kubelet stand-in does not import the emulator, and no product package imports this one except
``walras.cli.demo`` (on use, for ``walras demo``). It ships in the wheel beside ``walras`` because ``walras demo``
runs from an installed wheel.
"""
