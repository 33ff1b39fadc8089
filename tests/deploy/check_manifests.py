#!/usr/bin/env python3
"""Offline checks of deploy/: what an operator applies must at least render, lint, match the
Kubernetes schemas and keep the promises deploy/README.md makes, without a cluster or network.

  1. yamllint (strict) over deploy/
  2. `kubectl kustomize` of deploy/kubernetes and of every example under it
  3. schema validation (required fields, types) with the npm package kubernetes-models, when
     Node and the package are installed (nothing is downloaded here)
  4. the admission policy's CEL evaluated on the manifests' pods (admitted) and on client pods
     broken in each way it names (rejected), with the npm package @marcbachmann/cel-js, when
     installed
  5. a strict unknown-field and type walk over Debian's python3-kubernetes models, plus their
     required-field checks
  6. policy: what the DaemonSet needs (hostPID, OnDelete, system-node-critical, readiness through
     gpuproxyctl, the socket directory at the daemon's default path from protocol/limits.hpp, only
     flags and tenant keys the C++ sources define), that client examples ask for no NVIDIA
     resource, mount no hostPath and do not see the driver, and the sidecar wiring
  7. a self-check: broken copies of the rendered objects must be caught by the checks above

Exit status: 0 all passed (parts whose tool is missing are skipped, saying so), 1 a check failed,
77 kubectl is missing (nothing to render, the test is skipped).
"""

import copy
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

# Debian's python3-kubernetes and python3-yaml belong to Debian's interpreter; the one CMake
# found may be another. Run under Debian's when it has what this one lacks.
DEBIAN_PYTHON = "/usr/bin/python3"
if (importlib.util.find_spec("yaml") is None or importlib.util.find_spec("kubernetes") is None) \
        and not os.environ.get("GPUPROXY_DEPLOY_CHECK_REEXEC") \
        and os.path.realpath(sys.executable) != os.path.realpath(DEBIAN_PYTHON) \
        and os.access(DEBIAN_PYTHON, os.X_OK) \
        and subprocess.run([DEBIAN_PYTHON, "-c", "import yaml, kubernetes"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
    os.environ["GPUPROXY_DEPLOY_CHECK_REEXEC"] = "1"
    os.execv(DEBIAN_PYTHON, [DEBIAN_PYTHON] + sys.argv)

import yaml  # noqa: E402

SKIP = 77

# The extended resource the device plugin advertises for the default slot profile and where
# containers find the stub (CUDA images put it on LD_LIBRARY_PATH) are read from the plugin's
# sources (Facts.resource, Facts.stub_mount): the manifests must use the same.
# Marks an example that could not run before the device plugin existed: it must not come back.
STALE_PLUGIN_MARKER = "DEVICE PLUGIN, WHICH IS NOT YET AVAILABLE"
CLUSTER_SCOPED = {"Namespace", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                  "ClusterRole", "ClusterRoleBinding", "PriorityClass", "RuntimeClass"}
POD_TEMPLATE_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"}


def fail(message):
    print(f"deploy check: {message}", file=sys.stderr)
    sys.exit(1)


class Facts:
    """What the C++ sources define, read from them so that nothing is written down twice."""

    def __init__(self, root):
        limits = (root / "protocol/limits.hpp").read_text()
        self.client_socket = self._constant(limits, "kDefaultClientSocket")
        self.admin_socket = self._constant(limits, "kDefaultAdminSocket")
        options = (root / "server/daemon/daemon_options.cpp").read_text()
        self.daemon_flags = set(re.findall(r'add_option\(\s*"(--[a-z0-9-]+)"', options))
        config = (root / "server/tenant/tenant_config.cpp").read_text()
        keys = re.search(r"kKeys\s*=?\s*\{([^}]*)\}", config)
        self.tenant_keys = set(re.findall(r'"([a-z_]+)"', keys.group(1))) if keys else set()
        ctl = (root / "client/ctl/gpuproxyctl_main.cpp").read_text()
        self.ctl_commands = set(re.findall(r'add_subcommand\(\s*"([a-z-]+)"', ctl))
        slots = (root / "client/deviceplugin/slots.hpp").read_text()
        self.resource = self._constant(slots, "kDefaultResourceName")
        self.stub_mount = self._constant(slots, "kContainerStubDirectory")
        plugin = (root / "client/deviceplugin/device_plugin_main.cpp").read_text()
        self.plugin_flags = set(re.findall(r'add_option\(\s*"(--[a-z0-9-]+)"', plugin))
        profiles = (root / "client/deviceplugin/profiles_config.cpp").read_text()
        keys = re.search(r"kKeys\s*=?\s*\{([^}]*)\}", profiles)
        self.profile_keys = set(re.findall(r'"([a-z_]+)"', keys.group(1))) if keys else set()
        for what, value in [("daemon flags in daemon_options.cpp", self.daemon_flags),
                            ("tenant keys (kKeys) in tenant_config.cpp", self.tenant_keys),
                            ("subcommands in gpuproxyctl_main.cpp", self.ctl_commands),
                            ("flags in device_plugin_main.cpp", self.plugin_flags),
                            ("profile keys (kKeys) in profiles_config.cpp", self.profile_keys)]:
            if not value:
                fail(f"found no {what}: the sources changed shape, update this test")
        if "--metrics-address" not in self.daemon_flags or "status" not in self.ctl_commands:
            fail("daemon_options.cpp or gpuproxyctl_main.cpp no longer reads as expected")

    @staticmethod
    def _constant(text, name):
        match = re.search(name + r'\s*=\s*"([^"]+)"', text)
        if not match:
            fail(f"no {name} in the C++ sources where this test looks: update this test")
        return match.group(1)


# ---- rendering ------------------------------------------------------------------------------


def kustomizations(root):
    base = root / "deploy/kubernetes"
    found = [base]
    found += sorted(path.parent for path in (base / "examples").glob("*/kustomization.yaml"))
    return found


def render(root, directory):
    result = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True,
                            text=True, timeout=120)
    if result.returncode != 0:
        return None, result.stderr.strip() or f"exit {result.returncode}"
    return [obj for obj in yaml.safe_load_all(result.stdout) if obj], None


def name_of(obj):
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{meta.get('name')}"


def pod_spec(obj):
    kind = obj.get("kind")
    if kind == "Pod":
        return obj.get("spec") or {}
    if kind in POD_TEMPLATE_KINDS:
        return ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    return None


def is_sidecar_daemon(container):
    return container.get("restartPolicy") == "Always" and \
        (container.get("command") or [""])[0] == "gpuproxyd"


def resource_names(container):
    resources = container.get("resources") or {}
    return set((resources.get("limits") or {}).keys()) | set((resources.get("requests") or {}).keys())


def env_value(container, name):
    for entry in container.get("env") or []:
        if entry.get("name") == name:
            return entry.get("value")
    return None


def mount_at(container, path):
    for mount in container.get("volumeMounts") or []:
        if PurePosixPath(mount.get("mountPath", "")) == PurePosixPath(path):
            return mount
    return None


def flag_values(args):
    """--flag value pairs (and --flag=value) from an args list."""
    values, i = {}, 0
    while i < len(args):
        arg = str(args[i])
        if arg.startswith("--"):
            if "=" in arg:
                flag, value = arg.split("=", 1)
                values[flag] = value
            elif i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                values[arg] = str(args[i + 1])
                i += 1
            else:
                values[arg] = None
        i += 1
    return values


# ---- policy ---------------------------------------------------------------------------------


def check_daemon_container(where, container, pod, objects, facts, errors, main_socket_dir_volume):
    """What any gpuproxyd container needs: real flags and tenant keys, readiness through
    gpuproxyctl, the default sockets, no liveness probe. Returns the tenants file (or None)."""
    args = [str(a) for a in container.get("args") or []] + \
        [str(a) for a in (container.get("command") or [])[1:]]
    flags = flag_values(args)
    for flag in flags:
        if flag not in facts.daemon_flags:
            errors.append(f"{where}: gpuproxyd has no flag {flag} (daemon_options.cpp)")
    for flag, default in [("--socket", facts.client_socket), ("--admin-socket", facts.admin_socket)]:
        if flag in flags and flags[flag] != default:
            errors.append(f"{where}: {flag} {flags[flag]} is not the default {default}, which the "
                          "stub and gpuproxyctl use (protocol/limits.hpp)")
    for probe in ("readinessProbe", "startupProbe"):
        command = ((container.get(probe) or {}).get("exec") or {}).get("command") or []
        if len(command) < 2 or command[0] != "gpuproxyctl" or command[1] != "status":
            errors.append(f"{where}: {probe} must run `gpuproxyctl status`, not {command}")
    if "livenessProbe" in container:
        errors.append(f"{where}: a livenessProbe restarts gpuproxyd, dropping every client")
    socket_dir = str(PurePosixPath(facts.client_socket).parent)
    run_mount = mount_at(container, socket_dir)
    if run_mount is None:
        errors.append(f"{where}: nothing is mounted at {socket_dir}, the directory of the default "
                      f"socket {facts.client_socket}")
    elif main_socket_dir_volume is not None:
        main_socket_dir_volume(run_mount, socket_dir)

    tenants = None
    config = flags.get("--config")
    if config:
        config_dir = str(PurePosixPath(config).parent)
        mount = mount_at(container, config_dir)
        volume = next((v for v in pod.get("volumes") or []
                       if mount and v.get("name") == mount.get("name")), None)
        map_name = ((volume or {}).get("configMap") or {}).get("name")
        configmap = next((o for o in objects if o.get("kind") == "ConfigMap"
                          and (o.get("metadata") or {}).get("name") == map_name), None)
        key = PurePosixPath(config).name
        if configmap is None or key not in (configmap.get("data") or {}):
            errors.append(f"{where}: --config {config} is not a key of a ConfigMap mounted at "
                          f"{config_dir}")
        else:
            tenants = check_tenants_file(f"{where}: ConfigMap {map_name} {key}",
                                         configmap["data"][key], facts, errors)
    return tenants


def check_tenants_file(where, text, facts, errors):
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        errors.append(f"{where}: not YAML: {error}")
        return None
    if not isinstance(document, dict) or "tenants" not in document \
            or not set(document) <= {"tenants", "device_plugin"} \
            or not isinstance(document["tenants"], list):
        errors.append(f"{where}: gpuproxyd wants a top-level `tenants:` list (and the device "
                      "plugin's `device_plugin:`), nothing else")
        return None
    plugin = document.get("device_plugin") or {}
    for profile in plugin.get("profiles") or [] if isinstance(plugin, dict) else []:
        for key in profile if isinstance(profile, dict) else []:
            if key not in facts.profile_keys:
                errors.append(f"{where}: device_plugin profile {profile.get('resource')}: the plugin "
                              f"refuses the key `{key}` (profiles_config.cpp knows "
                              f"{sorted(facts.profile_keys)})")
    sockets = []
    for tenant in document["tenants"]:
        if not isinstance(tenant, dict) or "name" not in tenant:
            errors.append(f"{where}: a tenant without a name: {tenant}")
            continue
        for key in tenant:
            if key not in facts.tenant_keys:
                errors.append(f"{where}: tenant {tenant['name']}: gpuproxyd refuses the key "
                              f"`{key}` (tenant_config.cpp knows {sorted(facts.tenant_keys)})")
        socket = tenant.get("socket")
        if socket is None and tenant["name"] != "default":
            errors.append(f"{where}: tenant {tenant['name']} needs a socket")
        if socket is not None:
            if not str(socket).startswith("/"):
                errors.append(f"{where}: tenant {tenant['name']}: socket {socket} is not absolute")
            sockets.append(str(socket))
    return sockets


def check_base(where, objects, facts, errors):
    namespaces = {(o.get("metadata") or {}).get("name") for o in objects if o.get("kind") == "Namespace"}
    for obj in objects:
        namespace = (obj.get("metadata") or {}).get("namespace")
        if obj.get("kind") in CLUSTER_SCOPED:
            if namespace:
                errors.append(f"{where}: {name_of(obj)} is cluster-scoped but has namespace {namespace}")
        elif namespace not in namespaces:
            errors.append(f"{where}: {name_of(obj)} is in namespace {namespace}, not the one created "
                          f"here ({sorted(n for n in namespaces if n)})")

    daemonsets = [o for o in objects if o.get("kind") == "DaemonSet"]
    if len(daemonsets) != 1:
        errors.append(f"{where}: expected one DaemonSet, found {len(daemonsets)}")
        return
    ds = daemonsets[0]
    at = f"{where}: {name_of(ds)}"
    spec = ds.get("spec") or {}
    pod = pod_spec(ds)
    if (spec.get("updateStrategy") or {}).get("type") != "OnDelete":
        errors.append(f"{at}: updateStrategy must be OnDelete (a restart drops every client)")
    if pod.get("hostPID") is not True:
        errors.append(f"{at}: hostPID must be true (peer pids through SO_PEERCRED)")
    if pod.get("priorityClassName") != "system-node-critical":
        errors.append(f"{at}: priorityClassName must be system-node-critical")
    if pod.get("automountServiceAccountToken") is not False:
        errors.append(f"{at}: automountServiceAccountToken must be false (no API access needed)")
    if not pod.get("nodeSelector") and not pod.get("affinity"):
        errors.append(f"{at}: no nodeSelector or affinity: it would land on every node")
    if not pod.get("tolerations"):
        errors.append(f"{at}: no tolerations for tainted GPU nodes")
    containers = pod.get("containers") or []
    names = [c.get("name") for c in containers]
    if names != ["gpuproxyd", "device-plugin"]:
        errors.append(f"{at}: containers {names}: expected gpuproxyd and device-plugin")
    daemon = next((c for c in containers if c.get("name") == "gpuproxyd"), None)
    if daemon is None:
        return
    if (daemon.get("command") or [""])[0] != "gpuproxyd":
        errors.append(f"{at}: the gpuproxyd container does not run gpuproxyd")

    def host_path_same(mount, socket_dir):
        volume = next((v for v in pod.get("volumes") or [] if v.get("name") == mount.get("name")), {})
        host = (volume.get("hostPath") or {}).get("path")
        if host is None or PurePosixPath(host) != PurePosixPath(socket_dir):
            errors.append(f"{at}: {socket_dir} must be the host's {socket_dir} (hostPath), not {volume}")

    sockets = check_daemon_container(f"{at} container gpuproxyd", daemon, pod, objects, facts,
                                     errors, host_path_same)
    socket_dir = PurePosixPath(facts.client_socket).parent
    for socket in sockets or []:
        if socket_dir not in PurePosixPath(socket).parents:
            errors.append(f"{at}: tenant socket {socket} is outside {socket_dir}, the host directory "
                          "the pod mounts")

    flags = flag_values([str(a) for a in daemon.get("args") or []])
    address = flags.get("--metrics-address")
    if not address:
        errors.append(f"{at}: no --metrics-address: nothing to scrape")
    else:
        port = int(address.rsplit(":", 1)[1])
        ports = {p.get("name"): p.get("containerPort") for p in daemon.get("ports") or []}
        if ports.get("metrics") != port:
            errors.append(f"{at}: --metrics-address port {port} is not the container port `metrics` "
                          f"({ports.get('metrics')})")
        annotations = ((spec.get("template") or {}).get("metadata") or {}).get("annotations") or {}
        if annotations.get("prometheus.io/port") != str(port):
            errors.append(f"{at}: annotation prometheus.io/port is not {port}")
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        services = [o for o in objects if o.get("kind") == "Service"
                    and ((o.get("spec") or {}).get("selector") or {}).items() <= labels.items()
                    and (o.get("spec") or {}).get("selector")]
        if not any(p.get("targetPort") in ("metrics", port)
                   for s in services for p in (s.get("spec") or {}).get("ports") or []):
            errors.append(f"{at}: no Service selects the pods' metrics port")

    plugin = next((c for c in containers if c.get("name") == "device-plugin"), None)
    if plugin is not None:
        check_device_plugin(f"{at} container device-plugin", plugin, pod, facts, errors)

    policies = [o for o in objects if o.get("kind") == "ValidatingAdmissionPolicy"]
    bindings = [o for o in objects if o.get("kind") == "ValidatingAdmissionPolicyBinding"]
    if not policies:
        errors.append(f"{where}: no ValidatingAdmissionPolicy")
    for policy in policies:
        name = (policy.get("metadata") or {}).get("name")
        text = json.dumps(policy.get("spec"))
        for needed in ("gpuproxy.io/", "nvidia.com/", "privileged"):
            if needed not in text:
                errors.append(f"{where}: {name_of(policy)} never mentions {needed}")
        if not any((b.get("spec") or {}).get("policyName") == name
                   and "Deny" in ((b.get("spec") or {}).get("validationActions") or []) for b in bindings):
            errors.append(f"{where}: no binding denies what {name_of(policy)} rejects")


def check_device_plugin(where, container, pod, facts, errors):
    """The device plugin's container: real flags, the kubelet's directories from the host at the
    same paths (directories, not sockets: the kubelet recreates its sockets), the socket directory
    the daemon uses, and an init container that puts the stub where the plugin mounts it from."""
    if (container.get("command") or [""])[0] != "gpuproxy-device-plugin":
        errors.append(f"{where}: does not run gpuproxy-device-plugin")
    args = [str(a) for a in container.get("args") or []]
    flags = flag_values(args)
    for flag in flags:
        if flag not in facts.plugin_flags:
            errors.append(f"{where}: gpuproxy-device-plugin has no flag {flag} "
                          "(device_plugin_main.cpp)")
    if flags.get("--admin-socket", facts.admin_socket) != facts.admin_socket:
        errors.append(f"{where}: --admin-socket is not gpuproxyd's {facts.admin_socket}")
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    run_dir = str(PurePosixPath(facts.client_socket).parent)
    for path, read_only in [("/var/lib/kubelet/device-plugins", False),
                            ("/var/lib/kubelet/pod-resources", True), (run_dir, False)]:
        mount = mount_at(container, path)
        if mount is None:
            errors.append(f"{where}: nothing mounted at {path}")
            continue
        host = (volumes.get(mount.get("name"), {}).get("hostPath") or {})
        if host.get("path") != path:
            errors.append(f"{where}: {path} must be the host's {path} (hostPath), the paths it "
                          "hands the kubelet")
        if path != run_dir and host.get("type") != "Directory":
            errors.append(f"{where}: {path} must be a hostPath of type Directory (the kubelet's)")
        if read_only and not mount.get("readOnly"):
            errors.append(f"{where}: {path} should be read-only")
    stub_dir = flags.get("--stub-directory", run_dir + "/lib")
    run_mount = mount_at(container, run_dir)
    installers = [c for c in pod.get("initContainers") or []
                  if run_mount and any(m.get("name") == run_mount.get("name") and not m.get("readOnly")
                                       for m in c.get("volumeMounts") or [])
                  and stub_dir in json.dumps(c.get("command") or []) + json.dumps(c.get("args") or [])]
    if not installers:
        errors.append(f"{where}: no init container puts the stub into {stub_dir}, which the plugin "
                      f"mounts into pods at {facts.stub_mount}")
    if (container.get("securityContext") or {}).get("privileged"):
        errors.append(f"{where}: the device plugin needs no privilege")


def check_example(where, directory, objects, facts, errors):
    asks_plugin = False
    for obj in objects:
        pod = pod_spec(obj)
        if pod is None:
            continue
        at = f"{where}: {name_of(obj)}"
        for volume in pod.get("volumes") or []:
            if "hostPath" in volume:
                errors.append(f"{at}: volume {volume.get('name')} is a hostPath (client pods get "
                              "none; PSS baseline forbids them)")
        init = pod.get("initContainers") or []
        sidecars = [c for c in init if is_sidecar_daemon(c)]
        apps = [c for c in init if not is_sidecar_daemon(c)] + (pod.get("containers") or [])
        for container in apps:
            cat = f"{at} container {container.get('name')}"
            names = resource_names(container)
            nvidia = sorted(n for n in names if n.startswith("nvidia.com/"))
            if nvidia:
                errors.append(f"{cat} asks for {nvidia}: only gpuproxyd may hold the GPU")
            gpuproxy = sorted(n for n in names if n.startswith("gpuproxy.io/"))
            for name in gpuproxy:
                asks_plugin = True
                if name != facts.resource:
                    errors.append(f"{cat} asks for {name}, not {facts.resource} (the plugin's "
                                  "kDefaultResourceName)")
            if env_value(container, "NVIDIA_VISIBLE_DEVICES") != "void":
                errors.append(f"{cat}: NVIDIA_VISIBLE_DEVICES must be void (no driver, no "
                              "/dev/nvidia*)")
            if (container.get("securityContext") or {}).get("privileged"):
                errors.append(f"{cat} is privileged")
            socket = env_value(container, "GPUPROXY_SOCKET")
            if socket is not None and socket != facts.client_socket:
                errors.append(f"{cat}: GPUPROXY_SOCKET {socket} is not the stub's default "
                              f"{facts.client_socket}")
        for sidecar in sidecars:
            if pod.get("shareProcessNamespace") is not True:
                errors.append(f"{at}: shareProcessNamespace must be true, or gpuproxyd reads its "
                              "clients' pids as 0 and refuses them")
            check_sidecar(at, pod, sidecar, apps, objects, facts, errors)
        if not sidecars and not any(n.startswith("gpuproxy.io/") for c in apps for n in resource_names(c)):
            errors.append(f"{at}: neither a gpuproxyd sidecar nor a {facts.resource} request")
    if asks_plugin:
        for path in [directory / "kustomization.yaml"] + sorted(directory.glob("*.yaml")):
            if STALE_PLUGIN_MARKER in path.read_text():
                errors.append(f"{where}: {path.name} still says the device plugin is not available")


def check_sidecar(at, pod, sidecar, apps, objects, facts, errors):
    sat = f"{at} sidecar {sidecar.get('name')}"
    if not any(n.startswith("nvidia.com/") for n in resource_names(sidecar)):
        errors.append(f"{sat} asks for no nvidia.com/gpu: it has no GPU to share")
    tenants = check_daemon_container(sat, sidecar, pod, objects, facts, errors, None) or []
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    admin_dir = str(PurePosixPath(facts.admin_socket).parent)
    admin_mount = mount_at(sidecar, admin_dir)
    # Where each volume is mounted in the sidecar.
    in_sidecar = {m.get("name"): m.get("mountPath") for m in sidecar.get("volumeMounts") or []}
    init = pod.get("initContainers") or []
    sidecar_index = init.index(sidecar)
    for app in apps:
        cat = f"{at} container {app.get('name')}"
        if app in init:
            continue  # init containers (the stub's installer) are not clients
        socket = env_value(app, "GPUPROXY_SOCKET") or facts.client_socket
        mount = mount_at(app, str(PurePosixPath(socket).parent))
        if mount is None:
            errors.append(f"{cat}: nothing mounted at {PurePosixPath(socket).parent}, where its "
                          "socket is")
            continue
        if admin_mount is not None and mount.get("name") == admin_mount.get("name"):
            errors.append(f"{cat} mounts the sidecar's {admin_dir}: the admin socket is for operators")
        if "emptyDir" not in volumes.get(mount.get("name"), {}):
            errors.append(f"{cat}: its socket directory {mount.get('name')} is not an emptyDir")
        daemon_dir = in_sidecar.get(mount.get("name"))
        served = str(PurePosixPath(daemon_dir) / PurePosixPath(socket).name) if daemon_dir else None
        if served is None or (served not in tenants and served != facts.client_socket):
            errors.append(f"{cat}: its socket {socket} is {served} in the sidecar, which no tenant "
                          f"listens on ({tenants})")
        stub = mount_at(app, facts.stub_mount)
        if stub is None:
            errors.append(f"{cat}: the stub is not mounted at {facts.stub_mount}")
            continue
        writers = [i for i, c in enumerate(init) if not is_sidecar_daemon(c)
                   and any(m.get("name") == stub.get("name") and not m.get("readOnly")
                           for m in c.get("volumeMounts") or [])]
        if not writers or min(writers) > sidecar_index:
            errors.append(f"{cat}: no init container before the sidecar fills {stub.get('name')} "
                          "with the stub")


def check_images(rendered, root, errors):
    component = yaml.safe_load((root / "deploy/kubernetes/components/image/kustomization.yaml").read_text())
    image = next(i for i in component["images"] if i["name"] == "gpuproxy")
    wanted = f"{image['newName']}:{image['newTag']}"
    for where, objects in rendered.items():
        for obj in objects:
            pod = pod_spec(obj)
            for container in (pod or {}).get("initContainers", []) + (pod or {}).get("containers", []):
                ref = container.get("image", "")
                if ref in ("gpuproxy", "cuda-app") or ":" not in ref:
                    errors.append(f"{where}: {name_of(obj)} container {container.get('name')}: image "
                                  f"{ref!r} is a placeholder kustomize did not set")
                if (container.get("command") or [""])[0] in ("gpuproxyd", "gpuproxyctl",
                                                              "gpuproxy-device-plugin") \
                        and ref != wanted:
                    errors.append(f"{where}: {name_of(obj)} container {container.get('name')} runs "
                                  f"{ref}, not the image components/image sets ({wanted})")


def policy_errors(root, rendered, facts):
    errors = []
    for where, objects in rendered.items():
        if where == "deploy/kubernetes":
            check_base(where, objects, facts, errors)
        else:
            check_example(where, root / where, objects, facts, errors)
    check_images(rendered, root, errors)
    example = root / "deploy/examples/tenants.yaml"
    check_tenants_file(str(example.relative_to(root)), example.read_text(), facts, errors)
    return errors


# ---- strict fields (python3-kubernetes) -----------------------------------------------------

# Fields newer than the models Debian ships (Kubernetes 1.22): checked by hand.
NEWER_FIELDS = {
    ("V1Container", "restartPolicy"): "str",  # native sidecars, 1.28
}
# admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy(Binding) (1.30) are not in the
# 1.22 models: their fields by hand, the rest delegated to the models. A key ending in "!" is
# required.
_RULE = {"apiGroups": "list[str]", "apiVersions": "list[str]", "operations": "list[str]",
         "resources": "list[str]", "resourceNames": "list[str]", "scope": "str"}
_MATCH = {"namespaceSelector": "V1LabelSelector", "objectSelector": "V1LabelSelector",
          "resourceRules": [_RULE], "excludeResourceRules": [_RULE], "matchPolicy": "str"}
HAND_SCHEMAS = {
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): {
        "apiVersion!": "str", "kind!": "str", "metadata!": "V1ObjectMeta",
        "spec!": {
            "paramKind": {"apiVersion": "str", "kind": "str"},
            "matchConstraints": _MATCH,
            "validations": [{"expression!": "str", "message": "str", "messageExpression": "str",
                             "reason": "str"}],
            "auditAnnotations": [{"key!": "str", "valueExpression!": "str"}],
            "matchConditions": [{"name!": "str", "expression!": "str"}],
            "variables": [{"name!": "str", "expression!": "str"}],
            "failurePolicy": "str",
        },
    },
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): {
        "apiVersion!": "str", "kind!": "str", "metadata!": "V1ObjectMeta",
        "spec!": {
            "policyName!": "str",
            "paramRef": {"name": "str", "namespace": "str", "selector": "V1LabelSelector",
                         "parameterNotFoundAction": "str"},
            "matchResources": _MATCH,
            "validationActions!": "list[str]",
        },
    },
}
QUANTITY_MAPS = {"limits", "requests"}


class StrictWalker:
    def __init__(self):
        import kubernetes.client.models as models
        from kubernetes.client import ApiClient
        self.models = models
        self.api = ApiClient()
        self.version = __import__("kubernetes").__version__

    def errors(self, obj):
        key = (obj.get("apiVersion"), obj.get("kind"))
        found = []
        if key in HAND_SCHEMAS:
            self._hand(obj, HAND_SCHEMAS[key], name_of(obj), found)
            return found
        version = str(obj.get("apiVersion")).rpartition("/")[2]
        class_name = "V" + version[1:] + str(obj.get("kind"))
        if not hasattr(self.models, class_name):
            return [f"{name_of(obj)}: python3-kubernetes {self.version} has no model {class_name} "
                    "and this test no hand rule for it"]
        self._walk(obj, class_name, name_of(obj), found)
        try:
            # The models' setters refuse a missing required field.
            self.api._ApiClient__deserialize(copy.deepcopy(obj), class_name)
        except (ValueError, TypeError) as error:
            found.append(f"{name_of(obj)}: {error}")
        return found

    def _hand(self, value, schema, path, found):
        if isinstance(schema, str):
            self._walk(value, schema, path, found)
        elif isinstance(schema, list):
            if not isinstance(value, list):
                found.append(f"{path}: expected a list, got {type(value).__name__}")
                return
            for i, item in enumerate(value):
                self._hand(item, schema[0], f"{path}[{i}]", found)
        else:
            if not isinstance(value, dict):
                found.append(f"{path}: expected an object, got {type(value).__name__}")
                return
            fields = {k.rstrip("!"): v for k, v in schema.items()}
            for key in (k.rstrip("!") for k in schema if k.endswith("!")):
                if key not in value:
                    found.append(f"{path}: missing required field {key}")
            for key, item in value.items():
                if key not in fields:
                    found.append(f"{path}.{key}: unknown field")
                else:
                    self._hand(item, fields[key], f"{path}.{key}", found)

    def _walk(self, value, type_name, path, found):
        if type_name.startswith("list["):
            if not isinstance(value, list):
                found.append(f"{path}: expected a list, got {type(value).__name__}")
                return
            for i, item in enumerate(value):
                self._walk(item, type_name[5:-1], f"{path}[{i}]", found)
            return
        if type_name.startswith("dict("):
            if not isinstance(value, dict):
                found.append(f"{path}: expected a map, got {type(value).__name__}")
                return
            inner = type_name[5:-1].split(",", 1)[1].strip()
            quantity = path.rsplit(".", 1)[-1] in QUANTITY_MAPS
            for key, item in value.items():
                if quantity and isinstance(item, (int, float)) and not isinstance(item, bool):
                    continue
                self._walk(item, inner, f"{path}.{key}", found)
            return
        primitive = {"str": str, "int": int, "bool": bool, "float": (int, float)}
        if type_name in primitive:
            ok = isinstance(value, primitive[type_name]) and \
                not (type_name in ("int", "float") and isinstance(value, bool))
            if not ok:
                found.append(f"{path}: expected {type_name}, got {type(value).__name__} {value!r}")
            return
        if type_name in ("object", "datetime", "date"):
            return
        model = getattr(self.models, type_name, None)
        if model is None:
            found.append(f"{path}: no model {type_name}")
            return
        if not isinstance(value, dict):
            found.append(f"{path}: expected an object ({type_name}), got {type(value).__name__}")
            return
        by_json = {json_name: attr for attr, json_name in model.attribute_map.items()}
        for key, item in value.items():
            if key in by_json:
                self._walk(item, model.openapi_types[by_json[key]], f"{path}.{key}", found)
            elif (type_name, key) in NEWER_FIELDS:
                self._walk(item, NEWER_FIELDS[(type_name, key)], f"{path}.{key}", found)
            else:
                found.append(f"{path}.{key}: unknown field (not in {type_name})")


# ---- schema (kubernetes-models, npm) --------------------------------------------------------


def node_env():
    env = dict(os.environ)
    paths = [p for p in env.get("NODE_PATH", "").split(os.pathsep) if p]
    if shutil.which("npm"):
        result = subprocess.run(["npm", "root", "-g"], capture_output=True, text=True, timeout=60)
        if result.returncode == 0 and result.stdout.strip():
            paths.append(result.stdout.strip())
    env["NODE_PATH"] = os.pathsep.join(paths)
    return env


def schema_errors(script, env, items):
    result = subprocess.run(["node", str(script)], input=json.dumps(items), capture_output=True,
                            text=True, env=env, timeout=120)
    if result.returncode != 0:
        return [f"validate_schema.js failed: {result.stderr.strip()}"]
    return [f"{e['where']}: {e['error']}" for e in json.loads(result.stdout)]


# ---- admission policy CEL (@marcbachmann/cel-js, npm) --------------------------------------


def as_pod(where, spec):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": where}, "spec": copy.deepcopy(spec)}


def policy_cases(rendered):
    """(where, pod, denied?) the admission policy must decide as stated: every pod of the
    manifests is admitted, and a client pod broken in each way the policy names is not."""
    cases = []
    for where, objects in rendered.items():
        for obj in objects:
            spec = pod_spec(obj)
            if spec is not None:
                cases.append((f"{where}: {name_of(obj)}", as_pod(name_of(obj), spec), False))
    client = {"containers": [{"name": "app", "image": "app", "env": [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
        "resources": {"limits": {"gpuproxy.io/gpu": 1}}}]}

    def variant(what, denied, change):
        spec = copy.deepcopy(client)
        change(spec)
        cases.append((f"client pod {what}", as_pod("client", spec), denied))

    variant("as the examples write it", False, lambda s: None)
    variant("with NVIDIA_VISIBLE_DEVICES=none", False,
            lambda s: s["containers"][0]["env"][0].update(value="none"))
    variant("without gpuproxy.io, privileged", False, lambda s: (
        s["containers"][0].pop("resources"),
        s["containers"][0].update(securityContext={"privileged": True})))
    variant("also asking for nvidia.com/gpu", True,
            lambda s: s["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": 1}))
    variant("with an init container requesting nvidia.com/mig-1g.10gb", True,
            lambda s: s.update(initContainers=[{"name": "i", "image": "i", "resources": {
                "requests": {"nvidia.com/mig-1g.10gb": 1}}}]))
    variant("with a privileged container", True,
            lambda s: s["containers"].append({"name": "p", "image": "p",
                                              "securityContext": {"privileged": True}}))
    variant("with a privileged ephemeral container", True,
            lambda s: s.update(ephemeralContainers=[{"name": "d", "image": "d",
                                                     "securityContext": {"privileged": True}}]))
    variant("with NVIDIA_VISIBLE_DEVICES=all", True,
            lambda s: s["containers"][0]["env"][0].update(value="all"))
    variant("with NVIDIA_VISIBLE_DEVICES from a ConfigMap", True,
            lambda s: s["containers"][0].update(env=[{
                "name": "NVIDIA_VISIBLE_DEVICES",
                "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}]))
    return cases


def cel_errors(script, env, rendered):
    policies = [o for objs in rendered.values() for o in objs
                if o.get("kind") == "ValidatingAdmissionPolicy"]
    if not policies:
        return ["no ValidatingAdmissionPolicy to evaluate"]
    cases = policy_cases(rendered)
    items = {"policies": policies, "pods": [{"where": w, "object": p} for w, p, _ in cases]}
    result = subprocess.run(["node", str(script)], input=json.dumps(items), capture_output=True,
                            text=True, env=env, timeout=120)
    if result.returncode != 0:
        return [f"evaluate_policy.js failed: {result.stderr.strip()}"]
    denials = {}
    for entry in json.loads(result.stdout):
        if entry["denied"] is not None:
            denials.setdefault(entry["where"], []).append(f"{entry['policy']}: {entry['denied']}")
    errors = []
    for where, _, denied in cases:
        if denied and where not in denials:
            errors.append(f"{where}: admitted, but the admission policy is to reject it")
        if not denied and where in denials:
            errors.append(f"{where}: rejected ({'; '.join(denials[where])})")
    return errors


# ---- self-check: broken copies must be caught -----------------------------------------------


def find(rendered, where, kind):
    return next(o for o in rendered[where] if o.get("kind") == kind)


def mutations(rendered):
    """(what, check, mutate) triples; check names the part expected to catch it."""
    base, sidecar = "deploy/kubernetes", "deploy/kubernetes/examples/sidecar"

    def ds(r):
        return pod_spec(find(r, base, "DaemonSet"))

    def daemon(r):
        return ds(r)["containers"][0]

    def plugin(r):
        return next(c for c in ds(r)["containers"] if c["name"] == "device-plugin")

    def app(r):
        return pod_spec(find(r, sidecar, "Deployment"))["containers"][0]

    def sidecar_pod(r):
        return pod_spec(find(r, sidecar, "Deployment"))

    def configmap(r):
        return find(r, base, "ConfigMap")["data"]

    cases = [
        ("DaemonSet without hostPID", "policy", lambda r: ds(r).pop("hostPID")),
        ("DaemonSet with RollingUpdate", "policy",
         lambda r: find(r, base, "DaemonSet")["spec"].update(updateStrategy={"type": "RollingUpdate"})),
        ("DaemonSet without priorityClassName", "policy", lambda r: ds(r).pop("priorityClassName")),
        ("gpuproxyd flag that does not exist", "policy",
         lambda r: daemon(r)["args"].extend(["--metrics-adress", "0.0.0.0:1"])),
        ("tenant key gpuproxyd refuses", "policy",
         lambda r: configmap(r).update({"tenants.yaml": "tenants:\n  - name: default\n    memory: 1GiB\n"})),
        ("socket directory not the default", "policy",
         lambda r: daemon(r)["volumeMounts"][0].update(mountPath="/run/gpu")),
        ("readiness without gpuproxyctl", "policy",
         lambda r: daemon(r)["readinessProbe"].update({"exec": {"command": ["true"]}})),
        ("client container asking for nvidia.com/gpu", "policy",
         lambda r: app(r).setdefault("resources", {}).setdefault("limits", {}).update({"nvidia.com/gpu": 1})),
        ("client pod with a hostPath", "policy",
         lambda r: sidecar_pod(r)["volumes"].append({"name": "x", "hostPath": {"path": "/dev"}})),
        ("client container that sees the driver", "policy",
         lambda r: [e.update(value="all") for e in app(r)["env"] if e["name"] == "NVIDIA_VISIBLE_DEVICES"]),
        ("sidecar pod without shareProcessNamespace", "policy",
         lambda r: sidecar_pod(r).pop("shareProcessNamespace")),
        ("client socket no tenant listens on", "policy",
         lambda r: [m.update(name="run") for m in app(r)["volumeMounts"] if m["mountPath"] == "/run/gpuproxy"]),
        ("device plugin without the kubelet's directory", "policy",
         lambda r: plugin(r).update(volumeMounts=[m for m in plugin(r)["volumeMounts"]
                                                  if m["name"] != "device-plugins"])),
        ("device plugin flag that does not exist", "policy",
         lambda r: plugin(r)["args"].extend(["--slots", "4"])),
        ("device plugin profile key it refuses", "policy",
         lambda r: configmap(r).update({"tenants.yaml": "tenants: []\ndevice_plugin:\n  profiles:\n"
                                                        "    - resource: a.io/b\n      memory: 1GiB\n"})),
        ("misspelt field", "strict", lambda r: daemon(r).update(imagePullPolicyy="Always")),
        ("privileged as a string", "strict",
         lambda r: daemon(r)["securityContext"].update(privileged="yes")),
        ("unknown field in the admission policy", "strict",
         lambda r: find(r, base, "ValidatingAdmissionPolicy")["spec"].update(validation=[])),
        ("container without a name", "strict", lambda r: daemon(r).pop("name")),
        ("container without a name", "schema", lambda r: daemon(r).pop("name")),
        ("admission policy that lets nvidia.com/gpu through", "cel",
         lambda r: find(r, base, "ValidatingAdmissionPolicy")["spec"]["validations"][0].update(
             expression="true")),
        ("admission policy that ignores ephemeral containers", "cel",
         lambda r: find(r, base, "ValidatingAdmissionPolicy")["spec"]["validations"][1].update(
             expression="!variables.asksGpuproxy || !variables.containers.exists(c, "
                        "has(c.securityContext) && has(c.securityContext.privileged) && "
                        "c.securityContext.privileged)")),
        ("privileged as a string", "schema",
         lambda r: daemon(r)["securityContext"].update(privileged="yes")),
    ]
    return cases


# ---- main -----------------------------------------------------------------------------------


def main():
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
    facts = Facts(root)
    failures, skipped = [], []

    def report(part, errors):
        print(f"== {part}: {'ok' if not errors else 'FAILED'}")
        for error in errors:
            print(f"   {error}")
        failures.extend(f"{part}: {e}" for e in errors)

    if shutil.which("yamllint"):
        result = subprocess.run(["yamllint", "--strict", "-f", "parsable", "-c",
                                 str(root / "deploy/.yamllint.yaml"), str(root / "deploy")],
                                capture_output=True, text=True, timeout=120)
        lines = [line.replace(str(root) + "/", "") for line in result.stdout.splitlines() if line]
        report("yamllint", lines or ([result.stderr.strip()] if result.returncode else []))
    else:
        skipped.append("yamllint: not installed (Debian package yamllint; scripts/install-deps)")

    if not shutil.which("kubectl"):
        print("SKIPPED: kubectl is not installed: nothing to render (kubectl kustomize)")
        return SKIP
    rendered = {}
    render_errors = []
    for directory in kustomizations(root):
        where = str(directory.relative_to(root))
        objects, error = render(root, directory)
        if error:
            render_errors.append(f"{where}: kubectl kustomize: {error}")
        else:
            rendered[where] = objects
            print(f"   {where}: {len(objects)} objects ({', '.join(name_of(o) for o in objects)})")
    report("kubectl kustomize", render_errors)
    if render_errors:
        return 1

    def all_items(r):
        return [{"where": f"{w}: {name_of(o)}", "object": o} for w, objs in r.items() for o in objs]

    checks = {"policy": lambda r: policy_errors(root, r, facts)}

    env = node_env()
    script = Path(__file__).resolve().parent / "validate_schema.js"
    probe = subprocess.run(["node", str(script), "--probe"], capture_output=True, text=True,
                           env=env, timeout=60) if shutil.which("node") else None
    if probe is not None and probe.returncode == 0:
        print(f"   kubernetes-models {probe.stdout.strip()}")
        checks["schema"] = lambda r: schema_errors(script, env, all_items(r))
    else:
        skipped.append("schema: " + ("node is not installed" if probe is None else
                       "the npm package kubernetes-models is not installed (it is not downloaded "
                       "at test time: `npm install -g kubernetes-models@4.5.1`, which runs on Node 20)"))

    cel_script = Path(__file__).resolve().parent / "evaluate_policy.js"
    probe = subprocess.run(["node", str(cel_script), "--probe"], capture_output=True, text=True,
                           env=env, timeout=60) if shutil.which("node") else None
    if probe is not None and probe.returncode == 0:
        print(f"   @marcbachmann/cel-js {probe.stdout.strip()}")
        checks["cel"] = lambda r: cel_errors(cel_script, env, r)
    else:
        skipped.append("cel: " + ("node is not installed" if probe is None else
                       "the npm package @marcbachmann/cel-js is not installed (it is not "
                       "downloaded at test time: `npm install -g @marcbachmann/cel-js@8.0.0`, "
                       "Node 20.19 or newer)") + "; the admission policy's CEL is not evaluated")

    if importlib.util.find_spec("kubernetes") is not None:
        walker = StrictWalker()
        print(f"   python3-kubernetes {walker.version} (older than the manifests: hand rules for "
              f"{sorted(k for _, k in HAND_SCHEMAS)} and {sorted(f'{m}.{f}' for m, f in NEWER_FIELDS)})")
        checks["strict"] = lambda r: [f"{w}: {e}" for w, objs in r.items() for o in objs
                                      for e in walker.errors(o)]
    else:
        skipped.append("strict: python3-kubernetes is not installed (Debian package; "
                       "scripts/install-deps)")

    for part, check in checks.items():
        report(part, check(rendered))

    missed = []
    for what, part, mutate in mutations(rendered):
        if part not in checks:
            continue
        broken = copy.deepcopy(rendered)
        mutate(broken)
        if not checks[part](broken):
            missed.append(f"{part} did not catch: {what}")
    report("self-check (broken copies are caught)", missed)

    for line in skipped:
        print(f"== SKIPPED part {line}")
    if failures:
        print(f"deploy check: {len(failures)} problem(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
