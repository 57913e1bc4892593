"""google.api.http path templates: `/v1/salons/{salon_id}/slots:batchCreate`.

Grammar (google/api/http.proto):

    Template = "/" Segments [ Verb ] ;
    Segments = Segment { "/" Segment } ;
    Segment  = "*" | "**" | LITERAL | Variable ;
    Variable = "{" FieldPath [ "=" Segments ] "}" ;
    Verb     = ":" LITERAL ;

A template compiles to one anchored regular expression over the *raw* (still percent-encoded)
request path, so a `%2F` inside an id stays inside its segment instead of splitting it; captured
values are decoded afterwards.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
# RFC 3986 pchar minus what the grammar uses itself; literals are matched verbatim.
_LITERAL = re.compile(r"[A-Za-z0-9._~!$&'()+,;=@%-]+$")


class TemplateError(ValueError):
    pass


@dataclass(frozen=True)
class PathTemplate:
    source: str
    variables: tuple[str, ...]  # proto field paths, in order of appearance
    verb: str
    regex: re.Pattern
    # Per variable: True when it may span several segments (`**`), so `/` in it is real.
    multi: tuple[bool, ...]

    def match(self, raw_path: str) -> dict[str, str] | None:
        """Field path -> decoded value, or None when the path does not fit the template."""
        m = self.regex.fullmatch(raw_path)
        if m is None:
            return None
        out = {}
        for i, (name, multi) in enumerate(zip(self.variables, self.multi)):
            value = m.group(i + 1)
            # A single-segment variable decodes everything (%2F included); a multi-segment one
            # keeps %2F encoded so that it cannot be confused with a real separator.
            out[name] = unquote(value.replace("%2F", "%252F").replace("%2f", "%252f")) if multi else unquote(value)
        return out

    @property
    def openapi_path(self) -> str:
        """`/v1/salons/{salon_id}/slots:batchCreate` with each variable as a plain `{name}`."""
        return re.sub(r"\{([^}=]+)(=[^}]*)?\}", lambda m: "{" + m.group(1) + "}", self.source)

    @property
    def specificity(self) -> tuple[int, int]:
        """Sort key: templates with a verb and more literal text are tried first."""
        literal = re.sub(r"\{[^}]*\}", "", self.source)
        return (1 if self.verb else 0, len(literal))


def _segment_regex(seg: str, where: str) -> tuple[str, bool]:
    if seg == "*":
        return r"[^/]+", False
    if seg == "**":
        return r".+", True
    if not _LITERAL.match(seg):
        raise TemplateError(f"bad literal segment {seg!r} in {where!r}")
    return re.escape(seg), False


def parse(template: str) -> PathTemplate:
    if not template.startswith("/"):
        raise TemplateError(f"a path template starts with '/', got {template!r}")
    body, verb = template, ""
    # The verb is a `:literal` after the last segment, outside any `{...}`.
    last_close = body.rfind("}")
    colon = body.rfind(":")
    if colon > body.rfind("/") and colon > last_close:
        body, verb = body[:colon], body[colon + 1:]
        if not _LITERAL.match(verb):
            raise TemplateError(f"bad verb {verb!r} in {template!r}")
    parts: list[str] = []
    variables: list[str] = []
    multi: list[bool] = []
    segs: list[str] = []
    # Split on '/' but not inside braces (a variable may carry its own segments).
    depth, start = 0, 1
    for i in range(1, len(body)):
        c = body[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c == "/" and depth == 0:
            segs.append(body[start:i])
            start = i + 1
    segs.append(body[start:])
    for seg in segs:
        if seg.startswith("{"):
            if not seg.endswith("}"):
                raise TemplateError(f"unclosed variable {seg!r} in {template!r}")
            name, _, sub = seg[1:-1].partition("=")
            if not _IDENT.match(name):
                raise TemplateError(f"bad field path {name!r} in {template!r}")
            if name in variables:
                raise TemplateError(f"variable {name!r} bound twice in {template!r}")
            sub_regexes = [_segment_regex(s, template) for s in (sub or "*").split("/")]
            variables.append(name)
            multi.append(any(m for _, m in sub_regexes) or len(sub_regexes) > 1)
            parts.append("(" + "/".join(r for r, _ in sub_regexes) + ")")
        elif seg == "":
            raise TemplateError(f"empty segment in {template!r}")
        else:
            parts.append(_segment_regex(seg, template)[0])
    if not verb and segs and segs[-1] in ("*", "{" + variables[-1] + "}" if variables else ""):
        # A template without a verb never matches a path that has one: `/v1/checkouts/{id}` is not
        # `/v1/checkouts/x:pay`, so a wrong method on a custom method's path (`GET .../x:pay`) is a
        # 405 whose Allow names the custom method's own (POST) alone. A `:` in an id is sent as %3A.
        parts[-1] = parts[-1].replace("[^/]+", "[^/:]+")
    pattern = "/" + "/".join(parts) + (":" + re.escape(verb) if verb else "")
    return PathTemplate(template, tuple(variables), verb, re.compile(pattern), tuple(multi))
