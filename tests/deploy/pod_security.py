"""A pod spec against the Pod Security Standards' "restricted" profile (which holds the "baseline" one), rule by
rule as https://kubernetes.io/docs/concepts/security/pod-security-standards/ lists them; ``violations`` returns
one sentence per broken rule, naming the field."""

from collections.abc import Iterator

# Restricted: "Volume Types" (every other type, hostPath first, is refused).
VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
# Baseline: "Sysctls", the safe set.
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
SECCOMP_TYPES = {"RuntimeDefault", "Localhost"}


def containers(pod: dict) -> Iterator[dict]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key) or []


def _pod_level(pod: dict) -> list[str]:
    found = [f"spec.{key} is set" for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= VOLUME_TYPES:
            found.append(f"volume {volume['name']!r} is of type {', '.join(sorted(kinds - VOLUME_TYPES))}")
    context = pod.get("securityContext") or {}
    for sysctl in context.get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"sysctl {sysctl['name']} is not in the safe set")
    return found


def _container(pod_context: dict, container: dict) -> list[str]:
    name, context = container["name"], container.get("securityContext") or {}

    def either(key: str):  # the container's value, else the pod's
        return context.get(key, pod_context.get(key))

    found = []
    if context.get("privileged"):
        found.append(f"{name}: privileged")
    if context.get("allowPrivilegeEscalation") is not False:
        found.append(f"{name}: allowPrivilegeEscalation is not false")
    if either("runAsNonRoot") is not True:
        found.append(f"{name}: runAsNonRoot is not true")
    if either("runAsUser") == 0:
        found.append(f"{name}: runAsUser is 0")
    if (either("seccompProfile") or {}).get("type") not in SECCOMP_TYPES:
        found.append(f"{name}: seccompProfile.type is not RuntimeDefault or Localhost")
    capabilities = context.get("capabilities") or {}
    if "ALL" not in (capabilities.get("drop") or []):
        found.append(f"{name}: capabilities.drop lacks ALL")
    if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
        found.append(f"{name}: capabilities.add holds more than NET_BIND_SERVICE")
    if (either("windowsOptions") or {}).get("hostProcess"):
        found.append(f"{name}: windowsOptions.hostProcess")
    if (either("appArmorProfile") or {}).get("type", "RuntimeDefault") not in {"RuntimeDefault", "Localhost"}:
        found.append(f"{name}: appArmorProfile.type is Unconfined")
    selinux = either("seLinuxOptions") or {}
    if selinux.get("type", "container_t") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        found.append(f"{name}: seLinuxOptions outside the allowed types, or a user or role")
    if context.get("procMount", "Default") != "Default":
        found.append(f"{name}: procMount is not Default")
    found += [f"{name}: hostPort {port['hostPort']}" for port in container.get("ports") or [] if port.get("hostPort")]
    return found


def violations(pod: dict) -> list[str]:
    """The restricted profile's rules a pod spec (a Deployment's or Job's ``spec.template.spec``) breaks."""
    context = pod.get("securityContext") or {}
    return _pod_level(pod) + [v for container in containers(pod) for v in _container(context, container)]
