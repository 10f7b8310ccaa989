"""Job files to JobSpec, as `recfleet submit` reads them (cli/jobs/spec_file.h).

A job file is YAML (.yaml / .yml) or JSON (.json; other names: JSON if the
text starts with '{', else YAML) holding the JobSpec's fields: proto field
names (snake_case, lowerCamel also accepted) and enums by name, in any case.
The mapping to protobuf is protobuf's own JSON mapping (json_format), so a
bad field raises ValueError naming the file and the field, though without a
line number (the CLI's errors carry one).
"""

import json
import os

import yaml
from google.protobuf import descriptor, json_format

from recfleet.v1 import job_pb2


def load_job_spec(spec):
    """A JobSpec from a JobSpec (copied), a dict, or a path to a job file.

    Raises FileNotFoundError for a missing file and ValueError for bad content.
    """
    if isinstance(spec, job_pb2.JobSpec):
        out = job_pb2.JobSpec()
        out.CopyFrom(spec)
        return out
    if isinstance(spec, dict):
        return _from_dict(spec, "spec")
    if isinstance(spec, (str, os.PathLike)):
        path = os.fspath(spec)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        return _from_dict(_parse_text(text, path), path)
    raise TypeError(f"spec must be a JobSpec, a dict or a file path, got {type(spec).__name__}")


def _parse_text(text, path):
    ext = os.path.splitext(path)[1].lower()
    as_json = ext == ".json" or (ext not in (".yaml", ".yml") and text.lstrip().startswith("{"))
    try:
        data = json.loads(text) if as_json else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: not valid {'JSON' if as_json else 'YAML'}: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of JobSpec fields, got {type(data).__name__}")
    return data


def _from_dict(data, label):
    spec = job_pb2.JobSpec()
    try:
        json_format.ParseDict(_upper_enums(data, spec.DESCRIPTOR), spec)
    except json_format.ParseError as e:
        raise ValueError(f"{label}: {e}") from None
    return spec


def _upper_enums(value, message_type):
    """A copy of `value` with enum names upper-cased, as the CLI accepts `block` for BLOCK."""
    if not isinstance(value, dict):
        return value
    fields = {**message_type.fields_by_camelcase_name, **message_type.fields_by_name}
    out = {}
    for key, v in value.items():
        field = fields.get(key)
        if field is None:
            out[key] = v
            continue
        items = v if isinstance(v, list) else None
        if field.type == descriptor.FieldDescriptor.TYPE_ENUM:
            def fix(x):
                return x.upper() if isinstance(x, str) else x
        elif field.type == descriptor.FieldDescriptor.TYPE_MESSAGE and not _is_map(field):
            def fix(x, t=field.message_type):
                return _upper_enums(x, t)
        else:
            out[key] = v
            continue
        out[key] = [fix(x) for x in items] if items is not None else fix(v)
    return out


def _is_map(field):
    return field.message_type is not None and field.message_type.GetOptions().map_entry
