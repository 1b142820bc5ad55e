#!/usr/bin/env python3
"""Validates rendered Kubernetes manifests offline, strictly.

- Built-in kinds (Deployment, Service, ConfigMap, PodDisruptionBudget, ...): the JSON schemas of
  the Kubernetes API that the `kubernetes-validate` package ships (PyPI), in strict mode: wrong
  types, missing required fields and unknown fields are all errors.
- Prometheus Operator kinds (ServiceMonitor, PodMonitor, PrometheusRule): the pydantic models
  generated from the operator's CRDs (`cloudcoil-models-prometheus-operator`, PyPI), made strict
  here (every model forbids unknown fields).
- Custom resources whose CRD is given with `--crd FILE` (KEDA's ScaledObject): the CRD's
  openAPIV3Schema, made strict here (an object schema that lists its properties accepts no
  other, unless it says `x-kubernetes-preserve-unknown-fields`).
- Any other kind is an error: nothing passes unvalidated.

Usage: validate-manifests.py [--crd CRD_FILE]... KUBERNETES_VERSION FILE...  (multi-document YAML)
Exit 1 with one line per problem when a document does not validate.
"""

import inspect
import sys

import jsonschema
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


def strict(schema):
    """The schema with every object that lists its properties closed to others."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_validators(paths):
    """(apiVersion, kind) -> a validator of the CRD's served version's schema."""
    validators = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            crd = yaml.safe_load(f)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = version["schema"]["openAPIV3Schema"]
            # metadata is the API server's (ObjectMeta, checked there): an object, nothing more.
            schema.setdefault("properties", {})["metadata"] = {"type": "object"}
            validators[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(
                strict(schema)
            )
    return validators


def main(argv):
    crds = []
    while len(argv) > 2 and argv[1] == "--crd":
        crds.append(argv[2])
        argv = argv[:1] + argv[3:]
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    version, files = argv[1], argv[2:]
    monitoring = strict_monitoring_models()
    custom = crd_validators(crds)
    problems, checked = [], 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            documents = [d for d in yaml.safe_load_all(f) if d]
        for doc in documents:
            checked += 1
            kind, api = doc.get("kind"), doc.get("apiVersion", "")
            name = f"{path}: {kind} {doc.get('metadata', {}).get('name')}"
            try:
                if (api, kind) in custom:
                    errors = sorted(custom[(api, kind)].iter_errors(doc), key=str)
                    if errors:
                        raise ValueError("; ".join(
                            f"{e.message} at {'.'.join(map(str, e.path))}" for e in errors
                        ))
                elif api == "monitoring.coreos.com/v1":
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
