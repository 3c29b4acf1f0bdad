"""The Kubernetes boundary: the only code of the operator that talks to the API server or builds an API object.

* :mod:`walras.kube.errors`: the typed error hierarchy (:class:`NotFound`, :class:`Conflict`, :class:`Gone`,
  :class:`TooManyRequests`...) and the mapping of the client libraries' exceptions into it;
* :mod:`walras.kube.client`: the asynchronous API client the operator writes through (retries, backoff), the
  kubeconfig, and the one-shot listing ``walras check`` reads;
* :mod:`walras.kube.decode`: raw API objects -> the planner's typed, frozen :class:`~walras.planner.cluster.Cluster`
  (quantities parsed once; memoised by uid and resourceVersion in a :class:`~walras.kube.decode.TranslationCache`
  the caller owns);
* :mod:`walras.kube.snapshot`: the planner's :class:`~walras.planner.model.Snapshot` of the watched objects, and
  the fingerprint of an object (its decode, :mod:`walras.kube.decode`);
* :mod:`walras.kube.encode`: typed plan -> pod manifests (from each job's template, parsed once), resize patches,
  status bodies and patches, Events.

The planner never imports this package (an import contract in ``pyproject.toml``); only this package imports the
Kubernetes client libraries.
"""
