"""Errors a user can act on.

Every stage collects :class:`Problem` s instead of stopping at the first one, then raises one :class:`RecipeError`
holding all of them. The CLI prints each on its own line and exits with code 2; no traceback is ever shown for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with the input: where (a dotted key or a file), what, and what would be accepted."""

    key: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        text = f"{self.key}: {self.message}"
        return f"{text} ({self.hint})" if self.hint else text


@dataclass
class RecipeError(Exception):
    """A recipe (or bundle request) that cannot be built, with every problem found."""

    problems: list[Problem] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)


class Collector:
    """Accumulates problems across checks; ``raise_if_any`` ends a stage with all of them at once."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, key: str, message: str, hint: str = "") -> None:
        self.problems.append(Problem(key, message, hint))

    def extend(self, problems: list[Problem]) -> None:
        self.problems.extend(problems)

    def raise_if_any(self) -> None:
        if self.problems:
            raise RecipeError(list(self.problems))
