"""The wire-contract schemas (``protocol/schemas``) for tests.

Usage from any test::

    from .schema_util import assert_valid, validator

    assert_valid("record.response", body)          # raises AssertionError with every problem
    validator("attune.response").is_valid(body)    # plain bool

Schema names are the file stems (``"memory-unit"``, ``"record.request"``);
a trailing ``.json`` is accepted too. Cross-file ``$ref``s
(``urn:akashik-field:0.1.0:<stem>``) resolve through a shared
:class:`referencing.Registry`.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "protocol" / "schemas"
URN_PREFIX = "urn:akashik-field:0.1.0:"


@functools.cache
def _load() -> dict[str, dict[str, Any]]:
    schemas: dict[str, dict[str, Any]] = {}
    for path in sorted(SCHEMA_DIR.glob("*.json")):
        with path.open(encoding="utf-8") as fh:
            schemas[path.name.removesuffix(".json")] = json.load(fh)
    if not schemas:
        raise FileNotFoundError(f"no schemas in {SCHEMA_DIR}")
    return schemas


def load_schemas() -> dict[str, dict[str, Any]]:
    """Every schema by file stem (a fresh copy: mutate it freely)."""
    return copy.deepcopy(_load())


def _stem(name: str) -> str:
    stem = name.removesuffix(".json")
    if stem.startswith(URN_PREFIX):
        stem = stem[len(URN_PREFIX) :]
    if stem not in _load():
        raise KeyError(f"unknown schema {name!r}; known: {sorted(_load())}")
    return stem


@functools.cache
def registry() -> Registry:
    """A registry holding every schema under its ``$id``."""
    resources = [(schema["$id"], Resource.from_contents(schema)) for schema in _load().values()]
    return Registry().with_resources(resources).crawl()


def validator(name: str) -> Draft202012Validator:
    """A 2020-12 validator for one schema, with cross-file refs resolvable (cached)."""
    return _validator(_stem(name))


@functools.cache
def _validator(stem: str) -> Draft202012Validator:
    return Draft202012Validator(
        _load()[stem],
        registry=registry(),
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )


def errors(name: str, instance: Any) -> list[str]:
    """Readable validation errors (empty when the instance is valid)."""
    found = sorted(validator(name).iter_errors(instance), key=lambda e: list(e.absolute_path))
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in found]


def is_valid(name: str, instance: Any) -> bool:
    return bool(validator(name).is_valid(instance))


def assert_valid(name: str, instance: Any) -> None:
    """Fail with every validation error of ``instance`` against schema ``name``."""
    problems = errors(name, instance)
    if problems:
        raise AssertionError(f"not a valid {name}:\n  " + "\n  ".join(problems))
