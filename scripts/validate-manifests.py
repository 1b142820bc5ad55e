#!/usr/bin/env python3
"""Validates rendered Kubernetes manifests offline, strictly.

- Built-in kinds (Deployment, Service, ConfigMap, PodDisruptionBudget, ...): the JSON schemas of
  the Kubernetes API that the `kubernetes-validate` package ships (PyPI), in strict mode: wrong
  types, missing required fields and unknown fields are all errors.
- Prometheus Operator kinds (ServiceMonitor, PodMonitor, PrometheusRule): the pydantic models
  generated from the operator's CRDs (`cloudcoil-models-prometheus-operator`, PyPI), made strict
  here (every model forbids unknown fields).
- Any other kind is an error: nothing passes unvalidated.

Usage: validate-manifests.py KUBERNETES_VERSION FILE...  (multi-document YAML files)
Exit 1 with one line per problem when a document does not validate.
"""

import inspect
import sys

import kubernetes_validate
import pydantic
import yaml
from cloudcoil.models.prometheus_operator import v1 as monitoring_v1


def strict_monitoring_models():
    """The monitoring.coreos.com/v1 models by kind, every model forbidding unknown fields."""
    classes = [
        c
        for _, c in inspect.getmembers(monitoring_v1, inspect.isclass)
        if issubclass(c, pydantic.BaseModel) and c.__module__ == monitoring_v1.__name__
    ]
    for c in classes:
        c.model_config["extra"] = "forbid"
    # Nested models are captured when a model is built: rebuild until every level is strict.
    for _ in range(3):
        for c in classes:
            c.model_rebuild(force=True)
    return {
        kind: getattr(monitoring_v1, kind)
        for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule")
    }


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    version, files = argv[1], argv[2:]
    monitoring = strict_monitoring_models()
    problems, checked = [], 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            documents = [d for d in yaml.safe_load_all(f) if d]
        for doc in documents:
            checked += 1
            kind, api = doc.get("kind"), doc.get("apiVersion", "")
            name = f"{path}: {kind} {doc.get('metadata', {}).get('name')}"
            try:
                if api == "monitoring.coreos.com/v1":
                    model = monitoring.get(kind)
                    if model is None:
                        raise ValueError(f"no model for {api} {kind}")
                    model.model_validate(doc)
                else:
                    kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError as e:
                problems.append(f"{name}: no schema: {e}")
            except kubernetes_validate.ValidationError as e:
                problems.append(f"{name}: {e.message} at {'.'.join(map(str, e.path))}")
            except (pydantic.ValidationError, ValueError) as e:
                problems.append(f"{name}: {e}".replace("\n", " "))
    for problem in problems:
        print(problem)
    print(f"{checked} documents, {checked - len(problems)} valid, {len(problems)} invalid "
          f"(Kubernetes {version}, strict)")
    return 1 if problems or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
