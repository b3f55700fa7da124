"""Python source text for generated files: literals and calls, wrapped to a line length.

A generated file holds prompts of any length; a call that does not fit a line puts
its arguments one a line, and a list that does not fit one either is wrapped at the
line length, several items a line, between `# fmt: off` and `# fmt: on` (ruff's
formatter would put one item a line: a 65-token prompt would take 65 lines).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

LINE_LENGTH = 100
INDENT = "    "


def literal(value: object) -> str:
    """`value` as Python source: None, bool, int, float, str, or tuples, lists and dicts
    of those (dicts with str keys, written in insertion order)."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    if isinstance(value, tuple):
        items = [literal(v) for v in value]
        return "(" + items[0] + ",)" if len(items) == 1 else "(" + ", ".join(items) + ")"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no literal for {type(value).__name__}")


def wrapped_list(items: Sequence[int], indent: str) -> list[str]:
    """A list of ints over several lines, as many items a line as fit after `indent`;
    the caller writes what opens and closes it."""
    lines: list[str] = []
    line = ""
    for item in map(str, items):
        piece = f"{item},"
        if line and len(indent) + len(line) + 1 + len(piece) > LINE_LENGTH:
            lines.append(indent + line)
            line = piece
        else:
            line = f"{line} {piece}" if line else piece
    if line:
        lines.append(indent + line)
    return lines


def call(name: str, args: Sequence[str], indent: str, list_arg: Sequence[int] = ()) -> list[str]:
    """`name(args...)` as lines at `indent`: one line if it fits, else an argument a line.
    args are source texts; "@list" among them stands for list_arg, which is wrapped
    when it does not fit a line of its own."""
    inline = [literal(list(list_arg)) if a == "@list" else a for a in args]
    one = f"{indent}{name}({', '.join(inline)})"
    if len(one) <= LINE_LENGTH:
        return [one]
    inner = indent + INDENT
    lines = [f"{indent}{name}("]
    wrapped = False
    for arg, text in zip(args, inline, strict=True):
        if arg == "@list" and len(inner) + len(text) + 1 > LINE_LENGTH:
            lines += [inner + "[", *wrapped_list(list_arg, inner + INDENT), inner + "],"]
            wrapped = True
        else:
            lines.append(f"{inner}{text},")
    lines.append(indent + ")")
    return [f"{indent}# fmt: off", *lines, f"{indent}# fmt: on"] if wrapped else lines


def assignment(name: str, value: object, comment: str = "") -> list[str]:
    """`NAME = value  # comment`; a dict that does not fit a line gets an item a line."""
    tail = f"  # {comment}" if comment else ""
    one = f"{name} = {literal(value)}{tail}"
    if len(one) <= LINE_LENGTH or not isinstance(value, Mapping):
        return [one]
    comment_lines = [f"# {comment}"] if comment else []
    items = [f"{INDENT}{literal(k)}: {literal(v)}," for k, v in value.items()]
    return [*comment_lines, f"{name} = {{", *items, "}"]
