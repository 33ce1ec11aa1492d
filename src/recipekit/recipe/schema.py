"""Closed, typed, immutable records — and a checker that reports every problem of a document at once.

A recipe section is a frozen dataclass declared as a :class:`Section` subclass; each field is made with :func:`spec`,
which carries its description and range. :func:`validate` turns a plain dict (composed YAML) into those records, or
raises one :class:`RecipeError` naming every unknown key, missing key, wrong type, out-of-range value and failed
section rule, each with what would be accepted.

Why not pydantic: every ``recipekit`` call starts a fresh process, and importing pydantic and building a dozen models
cost about 0.3 s here — most of the start-up budget `build` has. The recipe needs only flat records with ranges,
enums, optional values, lists, dicts and one tagged union; the standard library's dataclasses plus this checker
cover them in a few milliseconds, with messages in recipekit's own words.

A mapping field takes null as "nothing": ``node_selector: null`` clears what a layer below set, and a key whose value
is null is dropped (``env: {HCCL_BUFFSIZE: null}``), as Helm reads values: Hydra merges layers key by key, so a team
layer that extends a built-in option could otherwise only add keys to its mappings, never remove one.

Every value's domain is explicit, because a recipe value reaches places that parse it again — a Kubernetes API
server, a YAML file, a Markdown README, a process environment — and a value outside its domain either breaks there
or, worse, means something else there. Besides a field's own range, pattern, length and :class:`Domain`, three rules
hold for every value, in every record: text is one line without control, bidirectional-override or surrogate
characters (it is written to YAML, JSON, Markdown and environments that would read those as structure); numbers are
finite and not subnormal (an infinite or denormal peak TFLOPS gives nonsense plans); integers fit in 64 bits (what
the JSON and Kubernetes consumers of a bundle can hold).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import reprlib
import sys
import types
import typing
from collections.abc import Callable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

from recipekit.base.errors import Problem, RecipeError

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:  # what the type checker needs to know; at run time __init_subclass__ does the work

    def dataclass_transform(**_: Any) -> Callable[[type], type]:
        return lambda cls: cls


S = TypeVar("S", bound="Section")

_CONSTRAINTS = {
    "gt": (lambda value, bound: value > bound, "greater than"),
    "ge": (lambda value, bound: value >= bound, "greater than or equal to"),
    "lt": (lambda value, bound: value < bound, "less than"),
    "le": (lambda value, bound: value <= bound, "less than or equal to"),
}


#: Longest text any field accepts unless it says otherwise (PATH_MAX; far above any name, path or description).
MAX_TEXT = 4096
#: Integers must fit a signed 64-bit word: what JSON readers, Kubernetes and the launcher's consumers can hold.
MIN_INT, MAX_INT = -(2**63), 2**63 - 1
#: Characters no text field may hold: C0/C1 controls (NUL, newline, escape, ...), Unicode line and paragraph
#: separators (YAML reads them as line breaks), bidirectional overrides (text that displays unlike what it is) and
#: lone surrogates (not encodable as UTF-8, so the bundle could not even be written).
_FORBIDDEN_TEXT = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


@dataclasses.dataclass(frozen=True)
class Domain:
    """A named set of allowed strings, e.g. "Kubernetes namespace (DNS-1123 label)".

    ``test`` returns None for an allowed value, else what is wrong with it in a few words ("is 70 characters long");
    the problem then says what is allowed in ``allowed``. Used as ``spec(domain=...)`` on a field, or inside a type
    as ``Annotated[str, domain]`` for list items and mapping keys and values.
    """

    name: str
    allowed: str
    test: Callable[[str], str | None]

    def problem(self, value: str) -> str | None:
        """What is wrong with ``value`` (None when it is allowed)."""
        return self.test(value)


@dataclasses.dataclass(frozen=True)
class Allow:
    """Characters a text may hold although every other text may not: ``Annotated[str, Allow("\\t")]``.

    For values that only ever travel as data (an environment value goes from launch.json to ``os.environ``, never
    through a shell or a line-based format), where a tab is the user's business.
    """

    chars: str


def pattern_domain(name: str, allowed: str, pattern: str, *, max_length: int, min_length: int = 1) -> Domain:
    """A :class:`Domain` of the strings of ``min_length``..``max_length`` characters that fully match ``pattern``.

    Full match, not ``re.match`` with ``$``: ``$`` also matches before a trailing newline, which would let
    ``"worker\\n"`` pass as a DNS label.
    """
    compiled = re.compile(pattern)

    def test(value: str) -> str | None:
        if len(value) < min_length:
            return "is empty" if not value else f"is shorter than {min_length} characters"
        if len(value) > max_length:
            return f"is {len(value)} characters long (at most {max_length})"
        return None if compiled.fullmatch(value) else f"is not a valid {name}"

    return Domain(name, allowed, test)


@dataclass_transform(frozen_default=True, kw_only_default=True, field_specifiers=(dataclasses.field,))
class Section:
    """Base of every record: subclasses become frozen, keyword-only dataclasses that reject unknown keys.

    A subclass may define ``rules(self)``: checks that need several of its fields. Each failure is a message, reported
    against the section's own key, or a ``(field, message)`` pair, reported against that field's key.
    """

    if TYPE_CHECKING:  # a dataclass to the type checker (dataclasses.fields, replace)
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(frozen=True, kw_only=True)(cls)

    def rules(self) -> Sequence[str | tuple[str, str]]:
        return []


@dataclasses.dataclass(frozen=True)
class Tagged:
    """Marks a union of sections chosen by one field's Literal value: ``Annotated[A | B, Tagged("kind")]``."""

    field: str


def spec(
    default: Any = dataclasses.MISSING,
    *,
    description: str,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    pattern: str | None = None,
    max_length: int | None = None,
    domain: Domain | None = None,
    omit_default: bool = False,
) -> Any:
    """A field with its documentation and its allowed values (checked by :func:`validate`).

    ``gt``/``ge``/``lt``/``le`` bound numbers; ``pattern`` (a full match), ``max_length`` (default :data:`MAX_TEXT`)
    and ``domain`` restrict text. ``omit_default``: :func:`to_data` leaves the field out while it has its default,
    so a key added to a section later changes no resolved recipe (and no bundle byte) of a recipe that leaves it
    unset.
    """
    bounds = {name: bound for name, bound in (("gt", gt), ("ge", ge), ("lt", lt), ("le", le)) if bound is not None}
    metadata = {
        "description": description,
        "bounds": bounds,
        "pattern": pattern,
        "max_length": max_length,
        "domain": domain,
        "omit_default": omit_default,
    }
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def field_names(cls: type[Section]) -> list[str]:
    """The keys a section accepts, in declaration order."""
    return [f.name for f in dataclasses.fields(cls)]


@cache
def field_types(cls: type[Section]) -> dict[str, Any]:
    """Each field's resolved annotation (``Annotated`` kept, so tagged unions stay visible)."""
    return typing.get_type_hints(cls, include_extras=True)


def sections_in(annotation: Any) -> list[type[Section]]:
    """The sections an annotation stands for: itself, or each member of a (tagged) union."""
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return [annotation]
    return [section for arg in get_args(annotation) for section in sections_in(arg)]


def validate(cls: type[S], data: Any, *, root: str = "") -> S:
    """``data`` as a ``cls`` record, or :class:`RecipeError` with every problem, keyed by dotted path under ``root``."""
    problems: list[Problem] = []
    value = _section(cls, data, root, problems)
    if problems:
        raise RecipeError(problems)
    return value


def to_data(value: Any) -> Any:
    """A record as plain JSON/YAML-ready data (dicts in field order, lists), e.g. for the manifest."""
    if isinstance(value, Section):
        return {
            f.name: to_data(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not (f.metadata.get("omit_default") and getattr(value, f.name) == _default_of(f))
        }
    if isinstance(value, dict):
        return {key: to_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_data(item) for item in value]
    return value


def _default_of(field: dataclasses.Field[Any]) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def unknown_key_hint(key: str, allowed: list[str]) -> str:
    """'did you mean ...? allowed: ...' for a key a section does not have."""
    close = difflib.get_close_matches(key, sorted(allowed), n=1)
    prefix = f"did you mean {close[0]!r}? " if close else ""
    return prefix + "allowed: " + ", ".join(sorted(allowed))


# ------------------------------------------------------------------------------------------------------ checking
class _Invalid:
    """Stands for a value that failed its check (the problem is already recorded)."""


_INVALID = _Invalid()


def _join(loc: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{loc}[{key}]"
    key = printable(key)
    return f"{loc}.{key}" if loc else key


def printable(text: str) -> str:
    """``text`` with each control, invisible-formatting or surrogate character written as its escape (``\\n``,
    ``\\u202e``): a key or value from the input can then never break a one-line message, or hide what it says."""
    return _FORBIDDEN_TEXT.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), text)


def _section(cls: type[Section], data: Any, loc: str, problems: list[Problem]) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if not isinstance(data, dict):
        keys = "keys: " + ", ".join(fields)
        problems.append(Problem(loc or "<root>", f"must be a mapping (got {_show(data)})", keys))
        return _INVALID
    for key in data:
        if key not in fields:
            problems.append(Problem(_join(loc, str(key)), "unknown key", unknown_key_hint(str(key), list(fields))))
    types_ = field_types(cls)  # type: ignore[arg-type]  # a class is hashable (mypy applies the instances' __hash__)
    values: dict[str, Any] = {}
    ok = True
    for name, field in fields.items():
        key = _join(loc, name)
        if name not in data:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                problems.append(Problem(key, "required key is missing"))
                ok = False
            continue
        value = _value(types_[name], data[name], key, problems)
        if value is not _INVALID:
            value = _bounded(field, value, key, problems)
        if value is _INVALID:
            ok = False
        else:
            values[name] = value
    if not ok or any(key not in fields for key in data):
        return _INVALID
    record = cls(**values)
    for rule in record.rules():
        where, message = (_join(loc, rule[0]), rule[1]) if isinstance(rule, tuple) else (loc or "<root>", rule)
        problems.append(Problem(where, message))
    return record


def _bounded(field: dataclasses.Field[Any], value: Any, key: str, problems: list[Problem]) -> Any:
    if value is None:
        return value
    for name, bound in field.metadata.get("bounds", {}).items():
        holds, words = _CONSTRAINTS[name]
        if not holds(value, bound):
            problems.append(Problem(key, f"must be {words} {bound!r} (got {_show(value)})"))
            return _INVALID
    if not isinstance(value, str):
        return value
    max_length = field.metadata.get("max_length")
    if max_length is not None and len(value) > max_length:
        problems.append(Problem(key, f"is {len(value)} characters long (got {_show(value)})", f"at most {max_length}"))
        return _INVALID
    pattern = field.metadata.get("pattern")
    if pattern and not re.fullmatch(pattern, value):
        problems.append(Problem(key, f"must match {pattern} (got {_show(value)})"))
        return _INVALID
    domain = field.metadata.get("domain")
    if domain is not None:
        return _in_domain(domain, value, key, problems)
    return value


def _in_domain(domain: Domain, value: Any, key: str, problems: list[Problem]) -> Any:
    wrong = domain.problem(value) if isinstance(value, str) else None
    if wrong is None:
        return value
    problems.append(Problem(key, f"{wrong} (got {_show(value)})", f"{domain.name}: {domain.allowed}"))
    return _INVALID


def _value(annotation: Any, value: Any, key: str, problems: list[Problem]) -> Any:
    """``value`` checked (and, for floats and nested sections, converted) against ``annotation``."""
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *extras = get_args(annotation)
        tag = next((extra for extra in extras if isinstance(extra, Tagged)), None)
        if tag:
            return _tagged(inner, tag.field, value, key, problems)
        allow = "".join(extra.chars for extra in extras if isinstance(extra, Allow))
        if allow and inner is str:
            checked = (
                _text(value, key, problems, allow=allow)
                if isinstance(value, str)
                else _value(inner, value, key, problems)
            )
        else:
            checked = _value(inner, value, key, problems)
        for domain in (extra for extra in extras if isinstance(extra, Domain)):
            if checked is not _INVALID:
                checked = _in_domain(domain, checked, key, problems)
        return checked
    if origin in (Union, types.UnionType):
        return _union(get_args(annotation), value, key, problems)
    if origin is Literal:
        return _literal(get_args(annotation), value, key, problems)
    if origin in (list, tuple, dict):
        return _container(origin, get_args(annotation), value, key, problems)
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return _section(annotation, value, key, problems)
    if annotation is Any:
        return value
    return _scalar(annotation, value, key, problems)


def _literal(allowed: tuple[Any, ...], value: Any, key: str, problems: list[Problem]) -> Any:
    """``value`` when it is one of ``allowed``. YAML and Hydra's override grammar read an unquoted ``1.12`` as a
    number: where the number's own text is one of the allowed strings (a release, a version) it is taken as that
    string, since no other reading exists; otherwise the refusal says it was read as a number and how to quote it."""
    if any(value == option and type(value) is type(option) for option in allowed):
        return value
    as_text = repr(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if as_text is not None and as_text in allowed:
        return as_text
    got = f"read as the number {as_text}: it was not quoted" if as_text is not None else f"got {_show(value)}"
    example = next((option for option in allowed if isinstance(option, str)), None)
    hint = (
        f"quote it to keep it as text: {key}='{example}' on the command line, \"{example}\" in YAML"
        if as_text and example
        else ""
    )
    shown = ", ".join(repr(option) for option in allowed)
    problems.append(Problem(key, f"must be one of {shown} ({got})", hint))
    return _INVALID


def _scalar(annotation: type, value: Any, key: str, problems: list[Problem]) -> Any:
    if annotation is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number(value, key, problems, as_float=True)
    if annotation is int and isinstance(value, int) and not isinstance(value, bool):
        return _number(value, key, problems)
    if annotation is str and isinstance(value, str):
        return _text(value, key, problems)
    if annotation is bool and isinstance(value, bool):
        return value
    # YAML and Hydra's override grammar read 123, 1.5 and true as numbers and booleans: say how to keep the text.
    as_text = annotation is str and isinstance(value, (int, float))
    hint = f"quote it to keep it as text: {key}='{value}'" if as_text else ""
    problems.append(Problem(key, f"must be {_describe(annotation)} (got {_show(value)})", hint))
    return _INVALID


def _number(value: int | float, key: str, problems: list[Problem], *, as_float: bool = False) -> Any:
    """The rules every number obeys, whatever its field: finite, not subnormal, integers within 64 bits."""
    if isinstance(value, int):
        if not MIN_INT <= value <= MAX_INT:
            problems.append(Problem(key, f"{_show(value)} does not fit in 64 bits", f"between {MIN_INT} and {MAX_INT}"))
            return _INVALID
        return float(value) if as_float else value
    if math.isfinite(value) and (value == 0 or abs(value) >= sys.float_info.min):
        return value
    what = "is not a finite number" if not math.isfinite(value) else "is subnormal (too close to zero to compute with)"
    problems.append(Problem(key, f"{what} (got {value!r})", "a finite number"))
    return _INVALID


def _text(value: str, key: str, problems: list[Problem], *, allow: str = "") -> Any:
    """The rules every string obeys, whatever its field: one line of printable text, at most :data:`MAX_TEXT` long
    (``allow``: characters this field may hold all the same)."""
    if len(value) > MAX_TEXT:
        problems.append(Problem(key, f"is {len(value)} characters long", f"at most {MAX_TEXT}"))
        return _INVALID
    bad = next((match for match in _FORBIDDEN_TEXT.finditer(value) if match.group() not in allow), None)
    if bad:
        problems.append(
            Problem(
                key,
                f"contains U+{ord(bad.group()):04X} at position {bad.start()}, a control or invisible formatting "
                f"character (got {_show(value)})",
                "one line of printable text: no newlines, tabs, NUL or other control characters",
            )
        )
        return _INVALID
    return value


def _container(origin: type, args: tuple[Any, ...], value: Any, key: str, problems: list[Problem]) -> Any:
    if origin is dict:
        if value is None:  # null clears a mapping a layer below set (Helm's rule for values)
            return {}
        if not isinstance(value, dict):
            problems.append(Problem(key, f"must be a mapping (got {_show(value)})"))
            return _INVALID
        key_type, item_type = args
        kept = value if _admits_none(item_type) else {k: v for k, v in value.items() if v is not None}
        checked = {
            _value(key_type, k, _join(key, str(k)), problems): _value(item_type, v, _join(key, str(k)), problems)
            for k, v in kept.items()
        }
        return _INVALID if _INVALID in checked or _INVALID in checked.values() else checked
    if not isinstance(value, (list, tuple)):
        problems.append(Problem(key, f"must be a list (got {_show(value)})"))
        return _INVALID
    if origin is tuple and len(args) != len(value):
        problems.append(Problem(key, f"must have {len(args)} items (got {len(value)})"))
        return _INVALID
    item_types = args if origin is tuple else [args[0]] * len(value)
    items = [_value(t, item, _join(key, i), problems) for i, (t, item) in enumerate(zip(item_types, value))]
    if any(item is _INVALID for item in items):
        return _INVALID
    return tuple(items) if origin is tuple else items


def _admits_none(annotation: Any) -> bool:
    """Whether null is a value of ``annotation`` (then it is kept as one, not read as "drop this key")."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation is Any or (
        get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation)
    )


def _union(members: tuple[Any, ...], value: Any, key: str, problems: list[Problem]) -> Any:
    if value is None and type(None) in members:
        return None
    candidates = [member for member in members if member is not type(None)]
    for member in candidates:
        scratch: list[Problem] = []
        checked = _value(member, value, key, scratch)
        if not scratch:
            return checked
    if len(candidates) == 1:  # Optional[X]: X's own message is the clearest
        return _value(candidates[0], value, key, problems)
    allowed = " or ".join(_describe(member) for member in members)
    problems.append(Problem(key, f"must be {allowed} (got {_show(value)})"))
    return _INVALID


def _tagged(union: Any, tag: str, value: Any, key: str, problems: list[Problem]) -> Any:
    by_tag = {get_args(field_types(member)[tag])[0]: member for member in sections_in(union)}  # type: ignore[arg-type]
    if not isinstance(value, dict):
        problems.append(Problem(key, f"must be a mapping (got {_show(value)})"))
        return _INVALID
    chosen = by_tag.get(value.get(tag))
    if chosen is None:
        allowed = ", ".join(by_tag)
        problems.append(Problem(_join(key, tag), f"unknown {key} {tag} {value.get(tag)!r}", f"allowed: {allowed}"))
        return _INVALID
    return _section(chosen, value, key, problems)


def _describe(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if get_origin(annotation) is Literal:
        return " or ".join(repr(option) for option in get_args(annotation))
    if get_origin(annotation) is list:
        plural = {str: "strings", int: "integers", float: "numbers"}.get(get_args(annotation)[0], "items")
        return f"a list of {plural}"
    if get_origin(annotation) is tuple:
        return "a list"
    if get_origin(annotation) is dict:
        return "a mapping"
    words = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    return words.get(annotation, getattr(annotation, "__name__", str(annotation)))


class _BoundedRepr(reprlib.Repr):
    """``repr`` that never builds a long text: nested and shared structures (a YAML alias bomb expands to billions of
    items) are cut at a few items and levels, and huge integers are described rather than converted (Python refuses
    to convert integers of more than 4300 digits to text at all)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxlist, self.maxtuple, self.maxdict, self.maxset = 3, 4, 4, 4, 4
        self.maxstring, self.maxother, self.maxlong = 60, 60, 40

    def repr_int(self, value: int, level: int) -> str:
        if value.bit_length() > 128:
            return f"<integer of {value.bit_length()} bits>"
        return super().repr_int(value, level)


_REPR = _BoundedRepr()


def _show(value: Any) -> str:
    """A short, bounded rendering of ``value`` for a message (never longer than 60 characters, never slow)."""
    text = _REPR.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
