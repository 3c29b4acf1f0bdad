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
    ``net.ipv4.tcp_keepalive_intvl``, ``net.ipv4.tcp_keepalive_probes``, ``net.ipv4.tcp_rmem``,
    ``net.ipv4.tcp_wmem``; the last two were missing before the versions were read: a template using them was
    refused here while the API server admits it).

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

``baseline`` also has, from policy version v1.34, ``probe or lifecycle host``: no probe's or lifecycle handler's
``httpGet``/``tcpSocket`` sets ``host`` (a way to reach the node's or other hosts' services; ``127.0.0.1``
included).

**Versions** (``pod-security.kubernetes.io/enforce-version``, :func:`policy_of`): ``latest`` (the default) or
``v1.<minor>``; a namespace pinned to an older version is checked as ``k8s.io/pod-security-admission`` checks that
version (its ``VersionedCheck`` minimum versions). What differs, among the checks above:

===================================  ========================================================================
policy version                       difference from ``latest``
===================================  ========================================================================
below v1.8                           restricted has no ``allowPrivilegeEscalation != false``
below v1.19                          no field-based seccomp check at either level (v1.0-v1.18 check the
                                     ``seccomp.security.alpha.kubernetes.io`` annotations, not modelled)
below v1.22                          restricted has no ``unrestricted capabilities``; baseline's
                                     ``non-default capabilities`` applies there instead
below v1.23                          restricted has no ``runAsUser=0``
below v1.25                          Windows pods (``spec.os.name: windows``) are not exempt from
                                     restricted's ``allowPrivilegeEscalation``, ``seccompProfile`` and
                                     capabilities checks
below v1.27 / v1.29 / v1.32          fewer safe sysctls: v1.0 ``kernel.shm_rmid_forced``,
                                     ``net.ipv4.ip_local_port_range``, ``net.ipv4.tcp_syncookies``,
                                     ``net.ipv4.ping_group_range``, ``net.ipv4.ip_unprivileged_port_start``;
                                     v1.27 adds ``net.ipv4.ip_local_reserved_ports``; v1.29 adds
                                     ``net.ipv4.tcp_keepalive_time``, ``tcp_fin_timeout``,
                                     ``tcp_keepalive_intvl``, ``tcp_keepalive_probes``; v1.32 adds
                                     ``net.ipv4.tcp_rmem``, ``net.ipv4.tcp_wmem``
below v1.34                          no ``probe or lifecycle host``
below v1.35                          no user-namespace relaxation (``hostUsers: false``): baseline refuses
                                     ``procMount: Unmasked`` and restricted asks ``runAsNonRoot`` and
                                     refuses ``runAsUser=0`` of such a pod too
===================================  ========================================================================

A value that is neither (``v2.0``, ``1.30``, ``v1.030``) is invalid: Pod Security Admission then evaluates
``latest`` (its ``PolicyToEvaluate`` falls back to it), and so does :func:`policy_of`, saying so in
:attr:`Policy.note` (the job's ``PodSecurity`` condition, reason ``InvalidEnforceVersion``). A version newer than
the newest one this module knows is ``latest``, as Pod Security Admission caps it at its own.

**An invalid level** (``pod-security.kubernetes.io/enforce: bogus``, anything but the three levels) fails closed:
``api.ParseLevel`` returns ``restricted`` with its error, ``PolicyToEvaluate`` keeps it (it falls back to
``privileged`` for the audit and warn labels only), and ``ValidatePod`` skips its privileged short-cut when the
labels did not parse, so kube-apiserver checks the pod against ``restricted`` at the label's version (refusing
with ``violates PodSecurity "restricted:latest"``). :func:`level_of` and :func:`policy_of` do the same, saying so in
:attr:`Policy.note` (reason ``InvalidEnforceLevel``). kube-apiserver v1.36 refuses such a label on a namespace's
create or update with 422 (``ValidateNamespace``), unless it was already there; it skips the check on the
namespace's sub-resources (a ``PUT .../namespaces/NAME/status`` keeps the labels it carries), and a namespace
labelled before Pod Security admission ran keeps its label.

Not checked (the API server still refuses them at creation, as before): the AppArmor and SELinux options of
baseline. ``privileged`` or no label: nothing is checked. Containers are the template's ``containers``,
``initContainers`` and ``ephemeralContainers``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ENFORCE_LABEL", "LEVELS", "VERSION_LABEL", "Policy", "level_of", "policy_of", "violations"]

#: The namespace label Pod Security Admission enforces.
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
#: The namespace label that pins the enforced level's policy version (``latest`` or ``v1.<minor>``).
VERSION_LABEL = "pod-security.kubernetes.io/enforce-version"
LEVELS = ("privileged", "baseline", "restricted")
#: ``v1.<minor>`` as Pod Security Admission parses a version (``api.ParseVersion``): no leading zero.
_VERSION = re.compile(r"^v1\.(0|[1-9][0-9]{0,3})$")
#: The newest policy version whose checks differ from an older one's (the table above): any later version, and
#: ``latest``, check the same.
NEWEST = (1, 35)

_DEFAULT_CAPABILITIES = frozenset({"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                   "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
#: The safe sysctls by the policy version that added them (pod-security-admission's sysctlsAllowedV1Dot0/27/29/32).
_SYSCTLS_BY_VERSION = ((0, frozenset({"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                                      "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range",
                                      "net.ipv4.ip_unprivileged_port_start"})),
                       (27, frozenset({"net.ipv4.ip_local_reserved_ports"})),
                       (29, frozenset({"net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                                       "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"})),
                       (32, frozenset({"net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"})))
#: Hosts a probe or lifecycle handler may name from v1.34 on: none (the empty string is the pod's IP). Some
#: versions of pod-security-admission's source allow ``127.0.0.1`` and ``::1``; kube-apiserver v1.36 refuses them
#: (tests/test_pod_security.py, live), so they are refused here too.
_LOCAL_HOSTS = frozenset({""})
_RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image",
                                 "persistentVolumeClaim", "projected", "secret"})
#: Volume keys that are not a volume source.
_VOLUME_META = frozenset({"name"})


def level_of(labels: Mapping[str, str] | None) -> str:
    """The level a namespace with ``labels`` enforces: ``privileged`` without the label, the label's value when it
    is one of :data:`LEVELS`, else ``restricted`` (Pod Security Admission's ``ParseLevel`` fails closed)."""
    value = (labels or {}).get(ENFORCE_LABEL)
    if value is None:
        return "privileged"
    return value if value in LEVELS else "restricted"


@dataclass(frozen=True)
class Policy:
    """What a namespace enforces: its ``level`` (:func:`level_of`), the policy ``version`` (``(1, minor)``; None for
    ``latest``), ``note``: why a label was not read as written (empty when both were), and ``invalid_level``:
    whether the level label was one of them (the condition's reason: ``InvalidEnforceLevel``, else
    ``InvalidEnforceVersion``)."""

    level: str = "privileged"
    version: tuple[int, int] | None = None
    note: str = ""
    invalid_level: bool = False

    @property
    def text(self) -> str:
        """``restricted:latest`` / ``baseline:v1.30``, as the API server's refusal names the policy."""
        return f"{self.level}:{'latest' if self.version is None else f'v{self.version[0]}.{self.version[1]}'}"


def policy_of(labels: Mapping[str, str] | None) -> Policy:
    """The :class:`Policy` of a namespace with ``labels``, as Pod Security Admission's ``PolicyToEvaluate`` resolves
    it: the level (``restricted`` when the label is not a level), and the version of
    ``pod-security.kubernetes.io/enforce-version`` (``latest`` when absent, when newer than :data:`NEWEST`, or when
    invalid). :attr:`Policy.note` says which label was invalid and what applies instead."""
    labels = labels or {}
    level = level_of(labels)
    notes: list[str] = []
    raw_level = labels.get(ENFORCE_LABEL)
    invalid_level = raw_level is not None and raw_level not in LEVELS
    if invalid_level:
        notes.append(f"the namespace's {ENFORCE_LABEL} label {raw_level!r} is not one of {', '.join(LEVELS)}: "
                     "the checks of 'restricted' apply, as Pod Security admission applies them")
    raw = labels.get(VERSION_LABEL)
    version: tuple[int, int] | None = None
    if raw is not None and raw != "latest":
        found = _VERSION.match(raw)
        if found is None:
            notes.append(f"the namespace's {VERSION_LABEL} label {raw!r} is not 'latest' or 'v1.<minor>': the "
                         "checks of 'latest' apply, as Pod Security admission applies them")
        elif (1, int(found.group(1))) < NEWEST:
            version = (1, int(found.group(1)))
    return Policy(level, version, "; ".join(notes), invalid_level)


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


def violations(template: Mapping[str, Any], level: str, version: tuple[int, int] | None = None) -> tuple[str, ...]:
    """What of the pod ``template`` (a PodTemplateSpec: ``metadata`` and ``spec``) the Pod Security ``level`` of
    policy ``version`` (``(1, minor)``, None for ``latest``; the module docstring's table) forbids, one text per
    failed check (``"privileged (container \\"c\\" must not set securityContext.privileged=true)"``), in the order of
    the module docstring; empty when the level admits it."""
    if level not in ("baseline", "restricted"):
        return ()
    minor = 1 << 30 if version is None else version[1]
    spec = _map(template.get("spec"))
    out = _baseline(spec, minor)
    if level == "restricted":
        # restricted's checks of capabilities, seccomp and volumes replace baseline's (pod-security-admission's
        # OverrideCheckIDs; capabilities from v1.22): each failure is named once, as the API server names it
        overridden = _OVERRIDDEN if minor >= 22 else _OVERRIDDEN[1:]
        out = [v for v in out if not v.startswith(overridden)] + _restricted(spec, minor)
    return tuple(out)


#: Baseline checks that restricted's own version replaces.
_OVERRIDDEN = ("non-default capabilities", "seccompProfile", "hostPath volumes")


def _user_namespace(spec: Mapping[str, Any], minor: int) -> bool:
    """Whether the pod has its own user namespace (``hostUsers: false``) and the policy relaxes for it (v1.35)."""
    return spec.get("hostUsers") is False and minor >= 35


def _hosts(container: Mapping[str, Any]) -> list[str]:
    """The hosts ``container``'s probes and lifecycle handlers name (v1.34's check: any non-empty ``host``)."""
    handlers = [_map(container.get(p)) for p in ("livenessProbe", "readinessProbe", "startupProbe")]
    lifecycle = _map(container.get("lifecycle"))
    handlers += [_map(lifecycle.get(h)) for h in ("postStart", "preStop")]
    return [str(host) for handler in handlers for kind in ("httpGet", "tcpSocket")
            if (host := _map(handler.get(kind)).get("host")) is not None and host not in _LOCAL_HOSTS]


def _baseline(spec: Mapping[str, Any], minor: int) -> list[str]:
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
    if proc and not _user_namespace(spec, minor):  # baseline admits Unmasked in a user namespace (v1.35)
        out.append(proc)
    unconfined = _map(pod_context.get("seccompProfile")).get("type") == "Unconfined" or any(
        _map(ctx.get("seccompProfile")).get("type") == "Unconfined" for _, ctx in contexts)
    if unconfined and minor >= 19:
        out.append('seccompProfile (pod or containers must not set securityContext.seccompProfile.type to '
                   '"Unconfined")')
    safe = frozenset().union(*(names for since, names in _SYSCTLS_BY_VERSION if minor >= since))
    sysctls = [str(_map(s).get("name", "")) for s in _list(pod_context.get("sysctls"))
               if _map(s).get("name") not in safe]
    if sysctls:
        out.append(f"forbidden sysctls ({', '.join(sysctls)})")
    probing = [(c, _hosts(c)) for c in containers] if minor >= 34 else []
    if any(hosts for _, hosts in probing):
        out.append(f"probe or lifecycle host ({_names([c for c, hosts in probing if hosts])} "
                   f"{_verb([c for c, hosts in probing if hosts], 'uses', 'use')} probe or lifecycle host "
                   f"{', '.join(sorted({chr(34) + h + chr(34) for _, hosts in probing for h in hosts}))})")
    return out


def _proc(contexts: list[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> str | None:
    """The ``procMount`` failure of ``contexts`` (containers and their security contexts), or None."""
    proc = [(c, ctx.get("procMount")) for c, ctx in contexts if ctx.get("procMount") not in (None, "Default")]
    if not proc:
        return None
    values = ", ".join(sorted({f'"{v}"' for _, v in proc}))
    return f"procMount ({_names([c for c, _ in proc])} must not set securityContext.procMount to {values})"


def _restricted(spec: Mapping[str, Any], minor: int) -> list[str]:
    out: list[str] = []
    pod_context = _map(spec.get("securityContext"))
    containers = _containers(spec)
    contexts = [(c, _map(c.get("securityContext"))) for c in containers]
    user_namespace = _user_namespace(spec, minor)
    windows = _map(spec.get("os")).get("name") == "windows" and minor >= 25  # exempt from three checks (v1.25)
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
    if escalating and minor >= 8 and not windows:
        out.append(f"allowPrivilegeEscalation != false ({_names(escalating)} must set "
                   "securityContext.allowPrivilegeEscalation=false)")
    undropped = [c for c, ctx in contexts
                 if "ALL" not in [str(d) for d in _list(_map(ctx.get("capabilities")).get("drop"))]]
    adding = [c for c, ctx in contexts
              if any(a != "NET_BIND_SERVICE" for a in _list(_map(ctx.get("capabilities")).get("add")))]
    if (undropped or adding) and minor >= 22 and not windows:
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
    if not user_namespace and (pod_context.get("runAsUser") == 0 or root) and minor >= 23:
        who = "pod" if pod_context.get("runAsUser") == 0 else _names(root)
        out.append(f"runAsUser=0 ({who} must not set runAsUser=0)")
    pod_seccomp = _map(pod_context.get("seccompProfile")).get("type")
    if pod_seccomp not in ("RuntimeDefault", "Localhost") and minor >= 19 and not windows:
        missing = [c for c, ctx in contexts
                   if _map(ctx.get("seccompProfile")).get("type") not in ("RuntimeDefault", "Localhost")]
        if missing:
            out.append(f'seccompProfile (pod or {_names(missing)} must set securityContext.seccompProfile.type to '
                       '"RuntimeDefault" or "Localhost")')
    return out
