"""A validator for the subset of JSON Schema (draft 2020-12) that docs/schemas/ uses.

Supported: type (one or a list), enum, const, properties, required, additionalProperties (a
boolean or a schema), items, minItems, maxItems, minimum, maximum, exclusiveMinimum, minLength,
pattern, anyOf, oneOf, $ref (to "#/$defs/name" or "other.schema.json#/$defs/name", beside the
schema), and the annotations $schema, $id, $comment, title, description, $defs. Any other keyword
is an error, so that a schema cannot use a rule this validator would silently skip.

    python3 json_schema.py SCHEMA DOCUMENT   exit 0: valid; 1: the first errors, one per line
"""
import json
import math
import os
import re
import sys

ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description", "$defs"}
RULES = {"type", "enum", "const", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
         "minimum", "maximum", "exclusiveMinimum", "minLength", "pattern", "anyOf", "oneOf", "$ref"}


class SchemaError(Exception):
    """The schema itself is malformed or uses an unsupported keyword."""


def _is_type(value, name):
    if name == "null":
        return value is None
    if name == "boolean":
        return isinstance(value, bool)
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if name == "string":
        return isinstance(value, str)
    if name == "array":
        return isinstance(value, list)
    if name == "object":
        return isinstance(value, dict)
    raise SchemaError(f"unknown type {name!r}")


class Validator:
    def __init__(self, schema_path):
        self.directory = os.path.dirname(os.path.abspath(schema_path))
        self.files = {}
        self.root_name = os.path.basename(schema_path)
        self.root = self._load(self.root_name)

    def _load(self, name):
        if name not in self.files:
            with open(os.path.join(self.directory, name)) as f:
                self.files[name] = json.load(f)
        return self.files[name]

    def _resolve(self, ref, current_file):
        file_part, _, pointer = ref.partition("#")
        document = self._load(file_part) if file_part else self.files[current_file]
        target = document
        for part in [p for p in pointer.split("/") if p]:
            if not isinstance(target, dict) or part not in target:
                raise SchemaError(f"$ref {ref!r} does not resolve")
            target = target[part]
        return target, file_part or current_file

    def errors(self, document):
        found = []
        self._check(self.root, document, "$", self.root_name, found)
        return found

    def _check(self, schema, value, where, current_file, found):
        if schema is True:
            return
        if schema is False:
            found.append(f"{where}: no value is allowed here")
            return
        if not isinstance(schema, dict):
            raise SchemaError(f"schema at {where} is not an object")
        unknown = set(schema) - ANNOTATIONS - RULES
        if unknown:
            raise SchemaError(f"unsupported keyword(s) {sorted(unknown)} in the schema at {where}")
        if "$ref" in schema:
            target, target_file = self._resolve(schema["$ref"], current_file)
            self._check(target, value, where, target_file, found)
        if "type" in schema:
            types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            if not any(_is_type(value, t) for t in types):
                found.append(f"{where}: {json.dumps(value)[:60]} is not of type {' or '.join(types)}")
                return
        if "enum" in schema and value not in schema["enum"]:
            found.append(f"{where}: {json.dumps(value)[:60]} is not one of {schema['enum']}")
        if "const" in schema and value != schema["const"]:
            found.append(f"{where}: {json.dumps(value)[:60]} is not {json.dumps(schema['const'])}")
        if _is_type(value, "number"):
            if "minimum" in schema and value < schema["minimum"]:
                found.append(f"{where}: {value} is below the minimum {schema['minimum']}")
            if "maximum" in schema and value > schema["maximum"]:
                found.append(f"{where}: {value} is above the maximum {schema['maximum']}")
            if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
                found.append(f"{where}: {value} is not above {schema['exclusiveMinimum']}")
        if isinstance(value, str):
            if "minLength" in schema and len(value) < schema["minLength"]:
                found.append(f"{where}: {value!r} is shorter than {schema['minLength']}")
            if "pattern" in schema and not re.search(schema["pattern"], value):
                found.append(f"{where}: {value!r} does not match {schema['pattern']!r}")
        if isinstance(value, list):
            if "minItems" in schema and len(value) < schema["minItems"]:
                found.append(f"{where}: {len(value)} items, fewer than {schema['minItems']}")
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                found.append(f"{where}: {len(value)} items, more than {schema['maxItems']}")
            if "items" in schema:
                for i, item in enumerate(value):
                    self._check(schema["items"], item, f"{where}[{i}]", current_file, found)
        if isinstance(value, dict):
            for name in schema.get("required", []):
                if name not in value:
                    found.append(f"{where}: the required field {name!r} is missing")
            properties = schema.get("properties", {})
            for name, item in value.items():
                if name in properties:
                    self._check(properties[name], item, f"{where}.{name}", current_file, found)
                elif "additionalProperties" in schema:
                    extra = schema["additionalProperties"]
                    if extra is False:
                        found.append(f"{where}: the field {name!r} is not in the schema")
                    else:
                        self._check(extra, item, f"{where}.{name}", current_file, found)
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                passing = 0
                for option in schema[keyword]:
                    sub = []
                    self._check(option, value, where, current_file, sub)
                    passing += not sub
                if keyword == "anyOf" and passing == 0:
                    found.append(f"{where}: matches none of anyOf's {len(schema[keyword])} schemas")
                if keyword == "oneOf" and passing != 1:
                    found.append(f"{where}: matches {passing} of oneOf's schemas, not exactly one")


def validate(schema_path, document):
    """The errors of `document` against the schema file (an empty list: valid)."""
    return Validator(schema_path).errors(document)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: json_schema.py SCHEMA DOCUMENT")
    with open(sys.argv[2]) as f:
        problems = validate(sys.argv[1], json.load(f))
    for line in problems[:20]:
        print(f"{sys.argv[2]}: {line}")
    sys.exit(1 if problems else 0)
