"""Pydantic validation errors as short messages a person can act on.

Each error becomes a ``Problem``: the key path in the user's document (union tags such as
``openai`` removed) and what is wrong there — "unknown key 'api_kye'; did you mean 'api_key'?",
"expected an integer, got 'abc'", "must be >= 1, got 0". Values of secret fields, and values that
came from the environment, are never shown.
"""

from __future__ import annotations

import difflib
import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr, ValidationError

from titan.config.keypath import KeyPath

# Keys whose values may hold credentials although their type is not SecretStr.
_CREDENTIAL_KEYS = frozenset({"headers"})

_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping of keys to values",
    "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
}
_BOUNDS = {
    "greater_than": (">", "gt"),
    "greater_than_equal": (">=", "ge"),
    "less_than": ("<", "lt"),
    "less_than_equal": ("<=", "le"),
}


@dataclass(frozen=True)
class Problem:
    path: KeyPath  # in the document; () for the whole document
    message: str
    is_unknown_key: bool = False
    is_invalid_key: bool = False  # a key that is not a string


@dataclass(frozen=True)
class _Location:
    path: KeyPath
    parent: type[BaseModel] | None  # the model that holds the path's last key
    annotation: Any  # the type expected at the path; None when unknown
    is_secret: bool


def validation_problems(
    exc: ValidationError, root: type[BaseModel], hidden_paths: set[KeyPath]
) -> list[Problem]:
    """One Problem per error; values at ``hidden_paths`` (and secret fields) are not shown."""
    problems = []
    for error in exc.errors(include_url=False):
        location = _locate(root, error["loc"])
        is_hidden = location.is_secret or location.path in hidden_paths
        problems.append(_problem(error, location, is_hidden))
    return problems


def secret_field_names(root: type[BaseModel]) -> frozenset[str]:
    """Names of fields, anywhere under ``root``, whose values are credentials."""
    names: set[str] = set(_CREDENTIAL_KEYS)
    pending, seen = [root], set()
    while pending:
        model = pending.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            if _mentions(field.annotation, SecretStr):
                names.add(name)
            pending.extend(_models_in(field.annotation))
    return frozenset(names)


def suggestion(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """``"; did you mean 'port'?"`` when a choice is close to ``word``, else ``""``."""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _problem(error: Any, location: _Location, is_hidden: bool) -> Problem:
    kind, ctx, path = error["type"], error.get("ctx") or {}, location.path
    got = "" if is_hidden else f", got {_show(error.get('input'))}"
    if kind == "missing":
        return Problem(path, "required key is missing")
    if kind == "invalid_key":
        return Problem(
            path,
            f"key {_show(path[-1]) if path else ''} is not a string; quote it (YAML reads "
            "unquoted on, off, yes and no as true or false)",
            is_invalid_key=True,
        )
    if kind == "extra_forbidden":
        return Problem(path, _unknown_key(str(path[-1]), location.parent), is_unknown_key=True)
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        discriminator = str(ctx.get("discriminator", "")).strip("'")
        tags = _union_tags(location.annotation, discriminator)
        expected = f"one of {', '.join(repr(t) for t in tags)}"
        if kind == "union_tag_not_found":
            return Problem((*path, discriminator), f"required key is missing: {expected}")
        tag = str(ctx.get("tag"))
        message = f"unknown {discriminator} {tag!r}; expected {expected}{suggestion(tag, tags)}"
        if discriminator == "backend" and "openai" in tags:
            # The likeliest mistake: naming the server software instead of its protocol.
            message += " (vLLM, SGLang, TGI, Ollama and llama.cpp servers are 'openai' backends)"
        return Problem((*path, discriminator), message)
    if kind == "literal_error":
        choices = _literal_values(location.annotation)
        hint = suggestion(str(error.get("input")), choices) if not is_hidden else ""
        return Problem(path, f"expected one of {ctx.get('expected')}{got}{hint}")
    if kind in _BOUNDS:
        operator, bound_key = _BOUNDS[kind]
        return Problem(path, f"must be {operator} {ctx.get(bound_key)}{got}")
    if kind in _EXPECTED:
        return Problem(path, f"expected {_EXPECTED[kind]}{got}")
    if kind in ("value_error", "assertion_error"):
        return Problem(path, str(ctx.get("error", error["msg"])))
    message = str(error["msg"])
    return Problem(path, message[:1].lower() + message[1:] + got)


def _unknown_key(key: str, parent: type[BaseModel] | None) -> str:
    if parent is None:
        return f"unknown key {key!r}"
    allowed = list(parent.model_fields)
    hint = suggestion(key, allowed)
    return f"unknown key {key!r}" + (hint or f" (allowed keys: {', '.join(allowed)})")


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _locate(root: type[BaseModel], loc: tuple[Any, ...]) -> _Location:
    """Follow pydantic's ``loc`` through the model classes, dropping union tags from the path."""
    path: list[str | int] = []
    annotation: Any = root
    parent: type[BaseModel] | None = None
    is_secret = False
    for key in loc:
        annotation = _unwrap(annotation)
        members = _union_members(annotation)
        if members is not None:  # a tagged union: pydantic puts the tag in loc
            annotation = next((m for m in members if key in _tags_of(m)), None)
            continue
        path.append(key)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            parent = annotation
            field = annotation.model_fields.get(str(key))
            annotation = field.annotation if field is not None else None
            is_secret = is_secret or (field is not None and _mentions(field.annotation, SecretStr))
        elif get_origin(annotation) in (list, tuple):
            annotation = get_args(annotation)[0] if get_args(annotation) else None
        elif get_origin(annotation) is dict:
            annotation = get_args(annotation)[1] if get_args(annotation) else None
        else:
            annotation = None
        is_secret = is_secret or key in _CREDENTIAL_KEYS
    return _Location(tuple(path), parent, _unwrap(annotation), is_secret)


def _unwrap(annotation: Any) -> Any:
    """``Annotated[X, ...]`` → X and ``X | None`` → X; other unions are left alone."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
        elif get_origin(annotation) in (Union, types.UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def _union_members(annotation: Any) -> list[type[BaseModel]] | None:
    if get_origin(annotation) not in (Union, types.UnionType):
        return None
    members = [a for a in get_args(annotation) if a is not type(None)]
    if all(isinstance(m, type) and issubclass(m, BaseModel) for m in members):
        return members
    return None


def _tags_of(model: type[BaseModel]) -> set[Any]:
    """Every Literal value of the model's fields: its tag in a tagged union is among them."""
    return {v for f in model.model_fields.values() for v in _literal_values(f.annotation)}


def _union_tags(annotation: Any, discriminator: str) -> list[str]:
    tags: list[str] = []
    for member in _union_members(_unwrap(annotation)) or []:
        field = member.model_fields.get(discriminator)
        tags += [str(v) for v in _literal_values(field.annotation)] if field else []
    return tags


def _literal_values(annotation: Any) -> tuple[Any, ...]:
    annotation = _unwrap(annotation)
    return get_args(annotation) if get_origin(annotation) is Literal else ()


def _mentions(annotation: Any, target: type) -> bool:
    return annotation is target or any(_mentions(a, target) for a in get_args(annotation))


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _models_in(a)]
