#!/usr/bin/env python3
"""What a rendered Deployment's container runs, as shell words for `buildah run`.

Reads the manifests `helm template` rendered (stdin) and writes into DIR:
  materializer.toml  the ConfigMap's file, as the pod mounts it at /etc/materializer
  args               the container's args, one a line (the image's ENTRYPOINT runs them)
  env                the container's env, NAME=VALUE a line: literal values as they are, a
                     fieldRef to metadata.name as the pod's name; optional secretKeyRefs are left
                     out (no Secret here), a required one is an error
  port               the containerPort named `metrics`
  probes             each probe's path (startup, liveness, readiness), one a line
Usage: scripts/rendered-pod.py DIR < rendered.yaml
"""
import os
import sys

import yaml


def main() -> int:
    out = sys.argv[1]
    docs = [d for d in yaml.safe_load_all(sys.stdin) if d]
    deployment = next(d for d in docs if d.get("kind") == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "materializer")
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/etc/materializer")
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    config_map = next(
        d
        for d in docs
        if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"]
    )
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "materializer.toml"), "w") as f:
        f.write(config_map["data"]["materializer.toml"])
    with open(os.path.join(out, "args"), "w") as f:
        f.write("\n".join(container.get("args", [])) + "\n")
    env = []
    for entry in container.get("env", []):
        if "value" in entry:
            env.append(f"{entry['name']}={entry['value']}")
            continue
        source = entry.get("valueFrom", {})
        if source.get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env.append(f"{entry['name']}={deployment['metadata']['name']}-0")
        elif "secretKeyRef" in source and source["secretKeyRef"].get("optional"):
            continue
        else:
            print(f"env {entry['name']}: a source this check cannot provide: {source}", file=sys.stderr)
            return 1
    with open(os.path.join(out, "env"), "w") as f:
        f.write("".join(line + "\n" for line in env))
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
    with open(os.path.join(out, "port"), "w") as f:
        f.write(f"{port}\n")
    with open(os.path.join(out, "probes"), "w") as f:
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = container[probe]["httpGet"]
            if get["port"] not in ("metrics", port):
                print(f"{probe} targets port {get['port']}, not the metrics port", file=sys.stderr)
                return 1
            f.write(f"{probe} {get['path']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
