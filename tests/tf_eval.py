"""A small evaluator for the Terraform subset deploy/terraform uses, for executable checks.

Why not ``terraform plan``: no Terraform binary, provider or AWS account here. The checks
need only values the module computes without AWS (IAM policy documents, listener rules), and
those use a handful of constructs: string templates, ``var.``/``local.`` references, a few
data-source attributes, ``coalesce``, ``==``, the conditional operator, list literals and
``dynamic`` blocks over them. This evaluator implements exactly that and raises
:class:`Unsupported`, naming the construct, for anything else, so a module change it does
not understand fails the tests loudly instead of being read wrongly.

python-hcl2 (8.x) gives string literals with their quotes (``'"abc"'``) and expressions as
``'${...}'``; both forms are handled here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2

ACCOUNT_ID = "123456789012"
PARTITION = "aws"

KNOWN_ATTRIBUTES: dict[str, str] = {
    "data.aws_caller_identity.current.account_id": ACCOUNT_ID,
    "data.aws_partition.current.partition": PARTITION,
    "aws_kms_key.icefloe.arn": f"arn:{PARTITION}:kms:us-east-1:{ACCOUNT_ID}:key/icefloe",
    **{f"aws_lb_target_group.{name}.arn":
       f"arn:{PARTITION}:elasticloadbalancing:us-east-1:{ACCOUNT_ID}:targetgroup/{name}"
       for name in ("http", "grpc")},
    # resources with count = var.enable_kafka ? 1 : 0, referenced as the one instance
    "aws_lb_target_group.kafka[0].arn":
        f"arn:{PARTITION}:elasticloadbalancing:us-east-1:{ACCOUNT_ID}:targetgroup/kafka",
    "aws_lb.kafka[0].dns_name": "ifkafk-0123456789abcdef.elb.us-east-1.amazonaws.com",
    "aws_lb.kafka[0].arn":
        f"arn:{PARTITION}:elasticloadbalancing:us-east-1:{ACCOUNT_ID}:loadbalancer/net/kafka",
    "aws_lb.ingest.dns_name": "ifingest-0123456789.us-east-1.elb.amazonaws.com",
}
"""Attributes of resources and data sources that only AWS knows, fixed for the tests.
Any other resource attribute is :class:`Unsupported`."""


class Unsupported(Exception):
    """A construct this evaluator does not implement (the message names it)."""


@dataclass
class Module:
    """The parsed ``.tf`` files of one folder, with variables overridable per evaluation."""

    folder: Path
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.files = {p.name: hcl2.load(p.open()) for p in sorted(self.folder.glob("*.tf"))}
        self._locals_raw: dict[str, Any] = {}
        for parsed in self.files.values():
            for block in parsed.get("locals", []):
                self._locals_raw.update({k: v for k, v in block.items()
                                         if not k.startswith("__")})
        self._locals: dict[str, Any] = {}
        self._resolving: set[str] = set()

    # -- blocks ---------------------------------------------------------------------------

    def blocks(self, kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
        for parsed in self.files.values():
            for block in parsed.get(kind, []):
                for name, body in block.items():
                    yield unquote(name), body

    def typed_blocks(self, kind: str) -> dict[tuple[str, str], dict[str, Any]]:
        """``resource`` or ``data`` blocks by (type, name)."""
        found = {}
        for rtype, named in self.blocks(kind):
            for name, body in named.items():
                found[(rtype, unquote(name))] = body
        return found

    # -- values ---------------------------------------------------------------------------

    def var(self, name: str) -> Any:
        if name in self.overrides:
            return self.overrides[name]
        declared = dict(self.blocks("variable"))
        if name not in declared:
            raise Unsupported(f"var.{name} is not declared")
        if "default" not in declared[name]:
            raise Unsupported(f"var.{name} has no default; pass it as an override")
        return self.value(declared[name]["default"])

    def local(self, name: str) -> Any:
        if name not in self._locals:
            if name not in self._locals_raw:
                raise Unsupported(f"local.{name} is not defined")
            if name in self._resolving:
                raise Unsupported(f"local.{name} refers to itself")
            self._resolving.add(name)
            self._locals[name] = self.value(self._locals_raw[name])
            self._resolving.discard(name)
        return self._locals[name]

    def value(self, raw: Any) -> Any:
        """Evaluate a value as python-hcl2 gives it."""
        if isinstance(raw, bool | int | float) or raw is None:
            return raw
        if isinstance(raw, list):
            return [self.value(item) for item in raw]
        if isinstance(raw, dict):
            return {unquote(k): self.value(v) for k, v in raw.items() if not k.startswith("__")}
        if isinstance(raw, str):
            if len(raw) >= 2 and raw.startswith('"') and raw.endswith('"'):
                return self.template(raw[1:-1])
            if raw.startswith("${") and raw.endswith("}") and _closing(raw, 1) == len(raw) - 1:
                return self.expression(raw[2:-1])
            if raw in ("null",):
                return None
            raise Unsupported(f"bare value {raw!r}")
        raise Unsupported(f"value of type {type(raw).__name__}")

    def template(self, text: str) -> str:
        """A string template: literal text with ``${expr}`` interpolations."""
        out, i = [], 0
        while i < len(text):
            if text.startswith("$${", i):
                out.append("${")
                i += 3
            elif text.startswith("${", i):
                end = _closing(text, i + 1)
                result = self.expression(text[i + 2:end])
                if not isinstance(result, str | int | float) or isinstance(result, bool):
                    raise Unsupported(f"interpolation of a {type(result).__name__} in "
                                      f"{text!r}")
                out.append(str(result))
                i = end + 1
            elif text.startswith("%{", i):
                raise Unsupported(f"template directive in {text!r}")
            else:
                out.append(text[i])
                i += 1
        return "".join(out).replace('\\"', '"')

    def expression(self, text: str) -> Any:
        parser = _Parser(self, _tokens(text), text)
        result = parser.ternary()
        parser.expect_end()
        return result

    def reference(self, name: str) -> Any:
        head, _, rest = name.partition(".")
        if head == "var":
            return self.var(rest)
        if head == "local":
            return self.local(rest)
        if name == "path.module":
            return str(self.folder)
        if name in KNOWN_ATTRIBUTES:
            return KNOWN_ATTRIBUTES[name]
        raise Unsupported(f"reference {name}")

    # -- IAM ------------------------------------------------------------------------------

    def policy_document(self, name: str) -> dict[str, Any]:
        """``data.aws_iam_policy_document.NAME`` as IAM policy JSON."""
        body = self.typed_blocks("data")[("aws_iam_policy_document", name)]
        allowed = {"statement", "dynamic", "__is_block__", "__comments__"}
        if set(body) - allowed:
            raise Unsupported(f"policy document {name}: {sorted(set(body) - allowed)}")
        statements = [self._statement(s, name) for s in body.get("statement", [])]
        for dynamic in body.get("dynamic", []):
            for label, spec in dynamic.items():
                if unquote(label) != "statement" or set(spec) - {"for_each", "content",
                                                                   "__is_block__"}:
                    raise Unsupported(f"policy document {name}: dynamic {label}")
                items = self.value(spec["for_each"])
                if not isinstance(items, list):
                    raise Unsupported(f"policy document {name}: for_each of a non-list")
                for _ in items:  # the content uses no iterator value (checked by parsing)
                    if "statement.value" in json.dumps(spec["content"]):
                        raise Unsupported(f"policy document {name}: statement.value")
                    statements += [self._statement(c, name) for c in spec["content"]]
        return {"Version": "2012-10-17", "Statement": statements}

    def _statement(self, raw: dict[str, Any], doc: str) -> dict[str, Any]:
        known = {"sid", "effect", "actions", "resources", "condition", "__is_block__",
                 "__comments__"}
        if set(raw) - known:
            raise Unsupported(f"policy document {doc}: statement keys "
                              f"{sorted(set(raw) - known)}")
        statement: dict[str, Any] = {
            "Sid": self.value(raw["sid"]), "Effect": self.value(raw.get("effect", '"Allow"')),
            "Action": self.value(raw["actions"]), "Resource": self.value(raw["resources"])}
        for condition in raw.get("condition", []):
            test, variable = self.value(condition["test"]), self.value(condition["variable"])
            statement.setdefault("Condition", {}).setdefault(test, {})[variable] = \
                self.value(condition["values"])
        return statement

    def role_policies(self, roles: tuple[str, ...]) -> dict[str, dict[str, Any]]:
        """Each of ``roles`` (``aws_iam_role`` names) → its inline policy (the documents of
        its ``aws_iam_role_policy`` resources, statements concatenated). A managed policy
        attached to one of them is :class:`Unsupported` (its text is not in the module)."""
        policies: dict[str, dict[str, Any]] = {}
        for (rtype, name), body in self.typed_blocks("resource").items():
            if rtype == "aws_iam_role_policy_attachment":
                attached = re.match(r"\$\{aws_iam_role\.(\w+)", body["role"])
                if attached is None or attached.group(1) in roles:
                    raise Unsupported(f"aws_iam_role_policy_attachment.{name} (a managed "
                                      "policy on a task role)")
                continue
            if rtype != "aws_iam_role_policy":
                continue
            role = _ref(body["role"], r"aws_iam_role\.(\w+)\.id")
            doc = _ref(body["policy"], r"data\.aws_iam_policy_document\.(\w+)\.json")
            if role not in roles:
                continue
            policy = policies.setdefault(role, {"Version": "2012-10-17", "Statement": []})
            policy["Statement"] += self.policy_document(doc)["Statement"]
        return policies


def unquote(text: str) -> str:
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text


def _ref(raw: str, pattern: str) -> str:
    match = re.fullmatch(r"\$\{" + pattern + r"\}", raw)
    if not match:
        raise Unsupported(f"expected a reference like {pattern}, got {raw!r}")
    return match.group(1)


def _closing(text: str, open_at: int) -> int:
    """Index of the brace closing the one at ``open_at``, skipping quoted strings."""
    depth, i, quoted = 0, open_at, False
    while i < len(text):
        char = text[i]
        if quoted:
            if char == "\\":
                i += 1
            elif char == '"':
                quoted = False
            elif text.startswith("${", i):
                end = _closing(text, i + 1)
                i = end
        elif char == '"':
            quoted = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise Unsupported(f"unbalanced braces in {text!r}")


_TOKEN = re.compile(r"\s*(?:(?P<num>\d+)|(?P<name>[A-Za-z_][\w.-]*(?:\[\d+\][\w.-]*)*)"
                    r"|(?P<op>==|[?:,()\[\]])|(?P<str>\"))")
"""A name may index a counted resource (``aws_lb.kafka[0].dns_name``): one reference, looked
up whole in :data:`KNOWN_ATTRIBUTES`. A ``[`` after anything else opens a list literal."""


def _tokens(text: str) -> list[tuple[str, Any]]:
    tokens: list[tuple[str, Any]] = []
    i = 0
    while i < len(text):
        if text[i:].strip() == "":
            break
        match = _TOKEN.match(text, i)
        if not match:
            raise Unsupported(f"expression syntax at {text[i:]!r} in {text!r}")
        if match.group("str"):
            start = match.end()
            j = start
            while text[j] != '"':
                if text.startswith("${", j):
                    j = _closing(text, j + 1)
                elif text[j] == "\\":
                    j += 1
                j += 1
            tokens.append(("str", text[start:j]))
            i = j + 1
            continue
        kind = next(k for k in ("num", "name", "op") if match.group(k))
        tokens.append((kind, match.group(kind)))
        i = match.end()
    return tokens


class _Parser:
    """ternary := equality ['?' ternary ':' ternary]; equality := primary ['==' primary];
    primary := string | number | true/false/null | [list] | func(args) | reference."""

    FUNCTIONS = ("coalesce",)

    def __init__(self, module: Module, tokens: list[tuple[str, Any]], text: str) -> None:
        self.module, self.tokens, self.text, self.at = module, tokens, text, 0

    def peek(self) -> tuple[str, Any] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, Any]:
        token = self.peek()
        if token is None or (value is not None and token[1] != value):
            raise Unsupported(f"expected {value or 'more'} in {self.text!r}")
        self.at += 1
        return token

    def expect_end(self) -> None:
        if self.peek() is not None:
            raise Unsupported(f"operator or syntax {self.peek()[1]!r} in {self.text!r}")

    def ternary(self) -> Any:
        condition = self.equality()
        if self.peek() == ("op", "?"):
            self.take("?")
            yes = self.ternary()
            self.take(":")
            no = self.ternary()
            if not isinstance(condition, bool):
                raise Unsupported(f"condition of a non-bool in {self.text!r}")
            return yes if condition else no
        return condition

    def equality(self) -> Any:
        left = self.primary()
        if self.peek() == ("op", "=="):
            self.take("==")
            return left == self.primary()
        return left

    def primary(self) -> Any:
        kind, value = self.take()
        if kind == "str":
            return self.module.template(value)
        if kind == "num":
            return int(value)
        if kind == "op" and value == "[":
            items = []
            while self.peek() != ("op", "]"):
                items.append(self.ternary())
                if self.peek() == ("op", ","):
                    self.take(",")
            self.take("]")
            return items
        if kind == "name":
            if value in ("true", "false"):
                return value == "true"
            if value == "null":
                return None
            if self.peek() == ("op", "("):
                return self.call(value)
            return self.module.reference(value)
        raise Unsupported(f"{value!r} in {self.text!r}")

    def call(self, name: str) -> Any:
        if name not in self.FUNCTIONS:
            raise Unsupported(f"function {name}() in {self.text!r}")
        self.take("(")
        args = []
        while self.peek() != ("op", ")"):
            args.append(self.ternary())
            if self.peek() == ("op", ","):
                self.take(",")
        self.take(")")
        return next((a for a in args if a not in (None, "")), None)
