"""The Pod Security Standards (https://kubernetes.io/docs/concepts/security/pod-security-standards/) as the
planner applies them to a FungibleJob's pod template before any pod is created (issue 30: a template the namespace's
``pod-security.kubernetes.io/enforce`` level refuses used to loop on 403s at every plan).

:func:`violations` is a faithful subset of the checks of ``k8s.io/pod-security-admission`` (policy version
``latest``), with the same names and the same wording of what is wrong, so that the condition reads like the API
server's refusal. Checked, per level (each level includes the ones above it):

``baseline``
  * ``hostProcess``: no Windows ``hostProcess`` container (pod or container ``securityContext.windowsOptions``);
  * ``host namespaces``: ``hostNetwork``, ``hostPID``, ``hostIPC`` unset or false;
  * ``privileged``: no container with ``securityContext.privileged: true``;
  * ``non-default capabilities``: ``capabilities.add`` only of the container runtime's default set (AUDIT_WRITE,
    CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, MKNOD, NET_BIND_SERVICE, SETFCAP, SETGID, SETPCAP, SETUID,
    SYS_CHROOT);
  * ``hostPath volumes``: no ``hostPath`` volume;
  * ``hostPort``: no container port with a non-zero ``hostPort``;
  * ``procMount``: ``securityContext.procMount`` unset or ``Default``, unless the pod has its own user namespace
    (``hostUsers: false``);
  * ``seccompProfile``: no ``Unconfined`` seccomp profile (pod or container);
  * ``forbidden sysctls``: only the safe sysctls (``kernel.shm_rmid_forced``, ``net.ipv4.ip_local_port_range``,
    ``net.ipv4.ip_unprivileged_port_start``, ``net.ipv4.tcp_syncookies``, ``net.ipv4.ping_group_range``,
    ``net.ipv4.ip_local_reserved_ports``, ``net.ipv4.tcp_keepalive_time``, ``net.ipv4.tcp_fin_timeout``,
    ``net.ipv4.tcp_keepalive_intvl``, ``net.ipv4.tcp_keepalive_probes``).

``restricted``
  * ``restricted volume types``: only configMap, csi, downwardAPI, emptyDir, ephemeral, image,
    persistentVolumeClaim, projected, secret;
  * ``allowPrivilegeEscalation != false``: every container sets ``securityContext.allowPrivilegeEscalation: false``;
  * ``unrestricted capabilities``: every container drops ``ALL`` and adds nothing but ``NET_BIND_SERVICE``;
  * ``procMount``: unset or ``Default``, in a user namespace too;
  * ``runAsNonRoot != true``: ``runAsNonRoot: true`` on the pod or on every container, and no container sets it
    false (not asked of a pod with its own user namespace, ``hostUsers: false``);
  * ``runAsUser=0``: neither the pod nor a container runs as uid 0 (the same exception);
  * ``seccompProfile``: ``RuntimeDefault`` or ``Localhost`` on the pod or on every container.

Not checked (the API server still refuses them at creation, as before): the AppArmor and SELinux options of
baseline, and the level's version label (``enforce-version``; ``latest`` is assumed). ``privileged``, an unknown
level or no label: nothing is checked. Containers are the template's ``containers``, ``initContainers`` and
``ephemeralContainers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["ENFORCE_LABEL", "LEVELS", "level_of", "violations"]

#: The namespace label Pod Security Admission enforces.
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
LEVELS = ("privileged", "baseline", "restricted")

_DEFAULT_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
_SAFE_SYSCTLS = frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                           "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                           "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                           "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                           "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"})
_RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                                 "persistentVolumeClaim", "projected", "secret"})
#: Volume keys that are not a volume source.
_VOLUME_META = frozenset({"name"})


def level_of(labels: Mapping[str, str] | None) -> str:
    """The level a namespace with ``labels`` enforces: ``baseline`` or ``restricted``, else ``privileged`` (no
    label, or a value Pod Security Admission does not know, which it refuses to create)."""
    value = (labels or {}).get(ENFORCE_LABEL, "privileged")
    return value if value in LEVELS else "privileged"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [_map(c) for key in ("initContainers", "containers", "ephemeralContainers") for c in _list(spec.get(key))]


def _names(containers: list[Mapping[str, Any]]) -> str:
    """``container "a"`` / ``containers "a", "b"``, as the API server words it."""
    quoted = ", ".join(f'"{c.get("name", "")}"' for c in containers)
    return f"container {quoted}" if len(containers) == 1 else f"containers {quoted}"


def _verb(containers: list[Mapping[str, Any]], singular: str, plural: str) -> str:
    return singular if len(containers) == 1 else plural


def violations(template: Mapping[str, Any], level: str) -> tuple[str, ...]:
    """What of the pod ``template`` (a PodTemplateSpec: ``metadata`` and ``spec``) the Pod Security ``level``
    forbids, one text per failed check (``"privileged (container \\"c\\" must not set
    securityContext.privileged=true)"``), in the order of the module docstring; empty when the level admits it."""
    if level not in ("baseline", "restricted"):
        return ()
    spec = _map(template.get("spec"))
    out = _baseline(spec)
    if level == "restricted":
        # restricted's checks of capabilities, seccomp and volumes replace baseline's (pod-security-admission's
        # OverrideCheckIDs): each failure is named once, as the API server names it
        out = [v for v in out if not v.startswith(_OVERRIDDEN)] + _restricted(spec)
    return tuple(out)


#: Baseline checks that restricted's own version replaces.
_OVERRIDDEN = ("non-default capabilities", "seccompProfile", "hostPath volumes")


def _baseline(spec: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    pod_context = _map(spec.get("securityContext"))
    containers = _containers(spec)
    contexts = [(c, _map(c.get("securityContext"))) for c in containers]
    host_process = [c for c, ctx in contexts if _map(ctx.get("windowsOptions")).get("hostProcess") is True]
    if _map(pod_context.get("windowsOptions")).get("hostProcess") is True or host_process:
        out.append("hostProcess (pod or containers must not set securityContext.windowsOptions.hostProcess=true)")
    hosts = [name for name in ("hostNetwork", "hostPID", "hostIPC") if spec.get(name) is True]
    if hosts:
        out.append(f"host namespaces ({', '.join(f'{h}=true' for h in hosts)})")
    privileged = [c for c, ctx in contexts if ctx.get("privileged") is True]
    if privileged:
        out.append(f"privileged ({_names(privileged)} {_verb(privileged, 'must', 'must')} not set "
                   "securityContext.privileged=true)")
    added: list[tuple[Mapping[str, Any], list[str]]] = []
    for c, ctx in contexts:
        extra = [str(a) for a in _list(_map(ctx.get("capabilities")).get("add")) if a not in _DEFAULT_CAPABILITIES]
        if extra:
            added.append((c, extra))
    if added:
        caps = sorted({a for _, extra in added for a in extra})
        out.append(f"non-default capabilities ({_names([c for c, _ in added])} must not include "
                   f"{', '.join(repr(a).replace(chr(39), chr(34)) for a in caps)} in securityContext.capabilities.add)")
    host_paths = [str(_map(v).get("name", "")) for v in _list(spec.get("volumes")) if "hostPath" in _map(v)]
    if host_paths:
        out.append(f"hostPath volumes (volume{'s' if len(host_paths) > 1 else ''} "
                   f"{', '.join(f'{chr(34)}{n}{chr(34)}' for n in host_paths)})")
    ported = [c for c in containers if any(_map(p).get("hostPort") not in (None, 0) for p in _list(c.get("ports")))]
    if ported:
        out.append(f"hostPort ({_names(ported)} {_verb(ported, 'uses', 'use')} hostPort)")
    proc = _proc(contexts)
    if proc and spec.get("hostUsers") is not False:  # baseline admits Unmasked in a user namespace
        out.append(proc)
    unconfined = _map(pod_context.get("seccompProfile")).get("type") == "Unconfined" or any(
        _map(ctx.get("seccompProfile")).get("type") == "Unconfined" for _, ctx in contexts)
    if unconfined:
        out.append('seccompProfile (pod or containers must not set securityContext.seccompProfile.type to '
                   '"Unconfined")')
    sysctls = [str(_map(s).get("name", "")) for s in _list(pod_context.get("sysctls"))
               if _map(s).get("name") not in _SAFE_SYSCTLS]
    if sysctls:
        out.append(f"forbidden sysctls ({', '.join(sysctls)})")
    return out


def _proc(contexts: list[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> str | None:
    """The ``procMount`` failure of ``contexts`` (containers and their security contexts), or None."""
    proc = [(c, ctx.get("procMount")) for c, ctx in contexts if ctx.get("procMount") not in (None, "Default")]
    if not proc:
        return None
    values = ", ".join(sorted({f'"{v}"' for _, v in proc}))
    return f"procMount ({_names([c for c, _ in proc])} must not set securityContext.procMount to {values})"


def _restricted(spec: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    pod_context = _map(spec.get("securityContext"))
    containers = _containers(spec)
    contexts = [(c, _map(c.get("securityContext"))) for c in containers]
    user_namespace = spec.get("hostUsers") is False
    proc = _proc(contexts)
    if proc and user_namespace:  # restricted refuses what baseline admitted in a user namespace
        out.append(proc)
    kinds = []
    for v in _list(spec.get("volumes")):
        source = [k for k in _map(v) if k not in _VOLUME_META]
        kinds += [f'"{_map(v).get("name", "")}" uses restricted volume type "{k}"' for k in source
                  if k not in _RESTRICTED_VOLUMES]
    if kinds:
        out.append(f"restricted volume types ({'; '.join(kinds)})")
    escalating = [c for c, ctx in contexts if ctx.get("allowPrivilegeEscalation") is not False]
    if escalating:
        out.append(f"allowPrivilegeEscalation != false ({_names(escalating)} must set "
                   "securityContext.allowPrivilegeEscalation=false)")
    undropped = [c for c, ctx in contexts
                 if "ALL" not in [str(d) for d in _list(_map(ctx.get("capabilities")).get("drop"))]]
    adding = [c for c, ctx in contexts
              if any(a != "NET_BIND_SERVICE" for a in _list(_map(ctx.get("capabilities")).get("add")))]
    if undropped or adding:
        parts = []
        if undropped:
            parts.append(f'{_names(undropped)} must set securityContext.capabilities.drop=["ALL"]')
        if adding:
            parts.append(f"{_names(adding)} must not include capabilities other than NET_BIND_SERVICE in "
                         "securityContext.capabilities.add")
        out.append(f"unrestricted capabilities ({'; '.join(parts)})")
    pod_non_root = pod_context.get("runAsNonRoot")
    explicit_false = [c for c, ctx in contexts if ctx.get("runAsNonRoot") is False]
    unset = [c for c, ctx in contexts if ctx.get("runAsNonRoot") is not True] if pod_non_root is not True else []
    if not user_namespace and (pod_non_root is False or explicit_false or unset):
        if pod_non_root is False or explicit_false:
            who = "pod" if pod_non_root is False else _names(explicit_false)
            detail = f"{who} must not set securityContext.runAsNonRoot=false"
        else:
            detail = f"pod or {_names(unset)} must set securityContext.runAsNonRoot=true"
        out.append(f"runAsNonRoot != true ({detail})")
    root = [c for c, ctx in contexts if ctx.get("runAsUser") == 0]
    if not user_namespace and (pod_context.get("runAsUser") == 0 or root):
        who = "pod" if pod_context.get("runAsUser") == 0 else _names(root)
        out.append(f"runAsUser=0 ({who} must not set runAsUser=0)")
    pod_seccomp = _map(pod_context.get("seccompProfile")).get("type")
    if pod_seccomp not in ("RuntimeDefault", "Localhost"):
        missing = [c for c, ctx in contexts
                   if _map(ctx.get("seccompProfile")).get("type") not in ("RuntimeDefault", "Localhost")]
        if missing:
            out.append(f'seccompProfile (pod or {_names(missing)} must set securityContext.seccompProfile.type to '
                       '"RuntimeDefault" or "Localhost")')
    return out
