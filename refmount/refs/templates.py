"""Version-1 templates and `gen`, rendered safely and without a jinja call per key.

Every jinja string goes through `Template`:
- when it holds only ``{{ name }}`` and integer arithmetic (names, int literals, + - * // % and
  parentheses), it is evaluated in Python, or over a whole numpy grid for `gen`;
- anything else is compiled once in jinja2's SandboxedEnvironment (GHSA-27vj-qcqg-25rc) and rendered
  per value. Undefined names are errors rather than silently empty strings.
"""

from __future__ import annotations

import _signal
import ast
import functools
import re
import threading

import numpy as np

from refmount.errors import RefsError, quote
from refmount.refs.model import MAX_LENGTH

_BLOCK = re.compile(r"\{\{(.*?)\}\}", re.S)
_ARITH_OPS = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.FloorDiv: np.floor_divide,
              ast.Mod: np.mod}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_DEPTH = 20  # nested calls of callable templates; deeper means a template calls itself


MAX_RENDER_BYTES = 1 << 20  # one rendered key, url, offset or length; also any string made on the way
MAX_ITEMS = 100_000  # items of a list made on the way (jinja's own range() limit)
MAX_INT_BITS = 4096  # integers made on the way (offsets need 53 bits)
RENDER_SECONDS = 2.0  # CPU time of one render (an ordinary one takes microseconds)
# in a format: a width or precision of a million or more, or one taken from an argument ('*', '{:{w}}')
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(\d*)(?:\.(\d*))?")
_BRACE_SPEC = re.compile(r"\{[^{}:]*:([^{}]*)\}")
_BIG_WIDTH = re.compile(r"%(\([^)]*\))?[-+ #0]*(\d{7,}|\*|\d*\.(\d{7,}|\*))|\{[^{}]*:[^{}]*(\d{7,}|\{)")
# str methods whose integer arguments size their result
_SIZED_METHODS = {"center", "ljust", "rjust", "zfill", "expandtabs"}
# filters whose integer arguments size their result or their work
_SIZED_FILTERS = {"center", "indent", "wordwrap", "truncate", "batch", "slice", "random", "filesizeformat"}


class TemplateTooBig(RefsError):
    """A render would make more than the sandbox allows; `Template.render` adds which template."""

    def __init__(self, message: str, located: bool = False) -> None:
        super().__init__(message)
        self.located = located


def _too_big(what: str):
    raise TemplateTooBig(f"would make {what}")


def _text_size(value, budget: int = MAX_RENDER_BYTES) -> int:
    """About how long str(value) would be, giving up once past `budget` (strings inside containers
    count, each time they are shared)."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if not isinstance(value, (list, tuple, dict, set, frozenset)):
        return 8
    total = 0
    stack = [value]
    while stack and total <= budget:
        item = stack.pop()
        if isinstance(item, (str, bytes)):
            total += len(item) + 4
        elif isinstance(item, dict):
            total += 2
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2
            stack.extend(item)
        else:
            total += 8
    return total


def _format_widths(text: str) -> int:
    """The sum of the widths and precisions in a % or {} format (what they can add to the output)."""
    text = text.replace("%%", "")
    total = sum(int(n or 0) for m in _PERCENT_SPEC.finditer(text) for n in m.groups())
    return total + sum(int(n) for m in _BRACE_SPEC.finditer(text) for n in re.findall(r"\d+", m.group(1)))


def _kind(value) -> str:
    if isinstance(value, (str, bytes)):
        return f"a string of more than {MAX_RENDER_BYTES:,} characters"
    return f"a {type(value).__name__} of more than {MAX_ITEMS:,} items"


def _check_operands(*values) -> None:
    """Containers whose text would be too long (a list shared with itself 40 times over would be
    2**40 items)."""
    for value in values:
        if isinstance(value, (list, tuple, dict, set, frozenset)) and _text_size(value) > MAX_RENDER_BYTES:
            _too_big(f"a {type(value).__name__} of more than {MAX_RENDER_BYTES:,} characters as text")


def _check_result(value):
    if isinstance(value, (str, bytes)):
        if len(value) > MAX_RENDER_BYTES:
            _too_big(_kind(value))
    elif isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > MAX_INT_BITS:
            _too_big(f"an integer of more than {MAX_INT_BITS} bits")
    else:
        _check_operands(value)
    return value


def _check_format(text, *args) -> None:
    """A % or {} format: widths from arguments refused, and the output's size bounded before it is made."""
    if not isinstance(text, str):
        return
    if _BIG_WIDTH.search(text.replace("%%", "")):
        _too_big(f"a format with a width of a million or more, or one taken from an argument ({text[:40]!r})")
    if len(text) + _format_widths(text) + sum(_text_size(a) for a in args) > MAX_RENDER_BYTES:
        _too_big(f"a formatted string of more than {MAX_RENDER_BYTES:,} characters")


def _check_join(items, separator) -> None:
    if isinstance(items, (list, tuple)):
        if _text_size(items) + len(items) * len(str(separator)) > MAX_RENDER_BYTES:
            _too_big(f"a joined string of more than {MAX_RENDER_BYTES:,} characters")
    elif hasattr(items, "__len__") and len(items) * (len(str(separator)) + 1) > MAX_RENDER_BYTES:
        _too_big(f"a joined string of more than {MAX_RENDER_BYTES:,} characters")


def _safe_binop(op: str, left, right):
    """The sizes an operator would make, checked before Python allocates them (C does the work,
    so neither a signal nor a later check could stop it)."""
    if op == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        if left.bit_length() * right > MAX_INT_BITS:
            _too_big(f"an integer of more than {MAX_INT_BITS} bits")
    elif op == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(times, int) and times > 0:
                if len(seq) * times > (MAX_RENDER_BYTES if isinstance(seq, (str, bytes)) else MAX_ITEMS):
                    _too_big(_kind(seq))
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            _too_big(f"an integer of more than {MAX_INT_BITS} bits")
    elif op == "%" and isinstance(left, str):
        _check_operands(right)
        _check_format(left, right)
    elif op == "+":
        if isinstance(left, (str, bytes, list, tuple)) and isinstance(right, type(left)):
            if len(left) + len(right) > (MAX_RENDER_BYTES if isinstance(left, (str, bytes)) else MAX_ITEMS):
                _too_big(_kind(left))
    return _check_result(_environment().default_binop_table[op](left, right))


def _capped_join(parts) -> str:
    """str.join for template output, `~` and {% set %} blocks, stopping once past the cap."""
    out = []
    total = 0
    for part in parts:
        if part.__class__ is not str:
            _check_operands(part)
            part = str(part)
        total += len(part)
        if total > MAX_RENDER_BYTES:
            _too_big(f"output of more than {MAX_RENDER_BYTES:,} characters")
        out.append(part)
    return "".join(out)


def _guard_filter(name: str, func):
    """A filter with its arguments and result held to the sandbox's sizes."""

    @functools.wraps(func)
    def guarded(*args, **kwargs):
        values = args[1:] if getattr(func, "jinja_pass_arg", None) is not None else args
        _check_operands(*values, *kwargs.values())
        if name in _SIZED_FILTERS and any(isinstance(v, int) and abs(v) > MAX_RENDER_BYTES
                                          for v in (*values[1:], *kwargs.values())):
            _too_big(f"a result of filter {name!r} sized over {MAX_RENDER_BYTES:,}")
        if name == "format" and values:
            _check_format(values[0], *values[1:], *kwargs.values())
        if name == "indent" and values and isinstance(values[0], str):
            width = values[1] if len(values) > 1 else kwargs.get("width", 4)
            width = len(width) if isinstance(width, str) else width
            if isinstance(width, int) and len(values[0]) + abs(width) * (values[0].count("\n") + 1) > MAX_RENDER_BYTES:
                _too_big(f"a result of filter 'indent' of more than {MAX_RENDER_BYTES:,} characters")
        if name == "replace" and len(values) >= 3 and isinstance(values[0], str):
            if len(values[0]) * (len(str(values[2])) + 1) > MAX_RENDER_BYTES:
                _too_big(f"a result of filter 'replace' of more than {MAX_RENDER_BYTES:,} characters")
        if name == "join" and values:
            _check_join(values[0], values[1] if len(values) > 1 else kwargs.get("d", ""))
        return _check_result(func(*args, **kwargs))

    return guarded


@functools.cache
def _environment():
    """The sandbox templates compile in, made at the first template that needs it: jinja2 takes
    40-80 ms to import, which a set without such templates (a warm archive mount) does not pay."""
    from jinja2 import StrictUndefined
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _CodeGenerator(CodeGenerator):
        def visit_Concat(self, node, frame) -> None:  # `~`: through the capped join
            self.write("environment.concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")


    class _Env(ImmutableSandboxedEnvironment):
        """jinja's sandbox (no private attributes, no mutation of lists and dicts), plus bounds on the
        size of everything a template makes: operators, filters, method calls, `~` and the output."""

        intercepted_binops = frozenset(("*", "**", "%", "+"))
        code_generator_class = _CodeGenerator
        concat = staticmethod(_capped_join)

        def __init__(self):
            super().__init__(undefined=StrictUndefined, autoescape=False, finalize=_check_result)
            for name in ("lipsum", "cycler", "joiner"):  # lipsum(n=10**6) writes without bound
                self.globals.pop(name, None)
            self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}

        def call_binop(self, context, operator, left, right):
            return _safe_binop(operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
            _check_operands(*args, *kwargs.values())
            method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
            owner = getattr(method, "__self__", None)
            if isinstance(owner, str):
                name = getattr(method, "__name__", "")
                if name in _SIZED_METHODS and any(isinstance(v, int) and abs(v) > MAX_RENDER_BYTES for v in args):
                    _too_big(f"a result of str.{name} sized over {MAX_RENDER_BYTES:,}")
                if name in ("format", "format_map"):
                    _check_format(owner, *args, *kwargs.values())
                if name == "expandtabs" and args and isinstance(args[0], int) and \
                        len(owner) + abs(args[0]) * owner.count("\t") > MAX_RENDER_BYTES:
                    _too_big(f"a result of str.expandtabs of more than {MAX_RENDER_BYTES:,} characters")
                if name == "replace" and len(args) >= 2 and len(owner) * (len(str(args[1])) + 1) > MAX_RENDER_BYTES:
                    _too_big(f"a result of str.replace of more than {MAX_RENDER_BYTES:,} characters")
                if name == "join" and args:
                    _check_join(args[0], owner)
            return _check_result(super().call(__context, __obj, *args, **kwargs))

    return _Env()


_MAIN = threading.main_thread()


def _template_error():
    from jinja2 import TemplateError

    return TemplateError


def _render_expired(signum, frame):
    raise TemplateTooBig(f"takes more than {RENDER_SECONDS:g} s")


def _arm_cpu_limit():
    """Interrupt a render that runs longer than RENDER_SECONDS of CPU: the previous SIGPROF handler
    to give back to `_disarm_cpu_limit`, or None when not armed (not the main thread, or the
    outermost render of nested callable templates holds the one timer). The C module's calls, as
    the `signal` wrappers' enum conversions would cost more than a simple render."""
    if _signal.getsignal(_signal.SIGPROF) is _render_expired or threading.current_thread() is not _MAIN:
        return None
    previous = _signal.signal(_signal.SIGPROF, _render_expired)
    _signal.setitimer(_signal.ITIMER_PROF, RENDER_SECONDS)
    return (previous,)


def _disarm_cpu_limit(armed) -> None:
    if armed is not None:
        _signal.setitimer(_signal.ITIMER_PROF, 0)
        _signal.signal(_signal.SIGPROF, armed[0])


def _parse_expr(text: str) -> ast.AST | None:
    """The expression of a ``{{ }}`` block if it is plain arithmetic over names, else None."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _ARITH_OPS:
                return None
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd)):
                return None
        elif isinstance(node, ast.Constant):
            if type(node.value) is not int:
                return None
        elif not isinstance(node, (ast.Name, ast.Load) + tuple(_ARITH_OPS) + (ast.USub, ast.UAdd)):
            return None
    return tree


def _names(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


class Template:
    """One jinja string, parsed once. `parts` alternates literal text and expression trees."""

    def __init__(self, text: str, where: str, templates: TemplateSet):
        self.text = text
        self.where = where
        self.templates = templates
        self.parts: list[str | ast.AST] | None = self._parse_simple(text)
        self._jinja = None

    @staticmethod
    def _parse_simple(text: str):
        if "{%" in text or "{#" in text:
            return None
        if text.endswith("\n"):  # jinja drops one trailing newline by default
            text = text[:-1]
        parts: list[str | ast.AST] = []
        pos = 0
        for m in _BLOCK.finditer(text):
            parts.append(text[pos : m.start()])
            tree = _parse_expr(m.group(1))
            if tree is None:
                return None
            parts.append(tree)
            pos = m.end()
        parts.append(text[pos:])
        if any("{{" in p or "}}" in p for p in parts if isinstance(p, str)):
            return None
        return parts

    @property
    def is_literal(self) -> bool:
        return self.parts is not None and len(self.parts) == 1

    def _compiled(self):
        if self._jinja is None:
            try:
                self._jinja = _environment().from_string(self.text)
            except _template_error() as e:
                raise RefsError(f"{self.where}: template {quote(self.text)} does not compile: {e}") from None
        return self._jinja

    def render(self, **values) -> str:
        """Render for one set of variable values."""
        if self.parts is not None:
            simple = self._render_simple(values)
            if simple is not None:
                return simple
        context = self.templates.context()
        context.update(values)
        armed = _arm_cpu_limit()
        try:
            return self._compiled().render(**context)
        except RecursionError:
            raise RefsError(f"{self.where}: template {quote(self.text)} is recursive") from None
        except TemplateTooBig as e:
            if e.located:  # from a callable template inside this one, which says where
                raise
            raise TemplateTooBig(f"{self.where}: template {quote(self.text)} refused: it {e}", located=True) from None
        except RefsError:
            raise
        except MemoryError:
            raise RefsError(f"{self.where}: template {quote(self.text)} ran out of memory") from None
        except Exception as e:  # the sandbox's SecurityError, undefined names, errors inside expressions
            raise RefsError(f"{self.where}: template {quote(self.text)} failed: {type(e).__name__}: {e}") from None
        finally:
            _disarm_cpu_limit(armed)

    def _render_simple(self, values) -> str | None:
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            if isinstance(part, ast.Name):
                value = values.get(part.id, self.templates.plain.get(part.id))
                if value is None:
                    return None  # let jinja report it (or call a callable template)
                out.append(str(value))
                continue
            names = _names(part)
            if not all(type(values.get(n)) is int for n in names):
                return None
            try:
                out.append(str(_eval_int(part, values)))
            except ZeroDivisionError:
                return None
        return "".join(out)

    # -- whole-grid evaluation for gen ----------------------------------------------------------

    def render_grid(self, grid: dict[str, np.ndarray], n: int, reserve=None) -> list[str]:
        """Render for every point of a gen grid (`grid` maps each dimension to its n values).
        `reserve(nbytes, check_only)` is told the text's size before it is made: exactly (an upper
        bound) on the vectorised path; per rendered value, after a first estimate, through jinja."""
        if n == 0:
            return []
        arrays = self._grid_parts(grid, n)
        if arrays is None:
            names = list(grid)
            columns = [grid[k].tolist() for k in names]
            points = (dict(zip(names, point)) for point in zip(*columns)) if names else iter([{}])
            first = self.render(**next(points))
            if reserve:
                reserve(len(first) * n, True)  # fail early on 100,000 urls of 100 KB each
                reserve(len(first), False)
            if not names:
                return [first] * n
            out = [first]
            for values in points:
                text = self.render(**values)
                if reserve:
                    reserve(len(text), False)
                out.append(text)
            return out
        if reserve:
            widths = [len(a) if isinstance(a, str) else max(len(str(np.min(a))), len(str(np.max(a))))
                      for a in arrays]
            reserve(sum(widths) * n, False)
        fmt = "".join(p.replace("{", "{{").replace("}", "}}") if isinstance(p, str) else "{}" for p in arrays)
        columns = [a.tolist() for a in arrays if not isinstance(a, str)]
        if not columns:
            return [fmt.format()] * n
        return list(map(fmt.format, *columns))

    def int_grid(self, grid: dict[str, np.ndarray], n: int) -> np.ndarray:
        """Evaluate to non-negative integers for every grid point (offset and length of gen)."""
        if self.parts is not None and len(self.parts) == 3 and self.parts[0] == "" and self.parts[2] == "":
            arrays = self._grid_parts(grid, n)
            if arrays is not None:
                values = np.broadcast_to(arrays[1], (n,)).astype(np.int64)
                return self._checked(values)
        if self.is_literal:
            return self._checked(np.full(n, self._to_int(self.parts[0]), dtype=np.int64))
        return self._checked(np.fromiter((self._to_int(s) for s in self.render_grid(grid, n)), np.int64, n))

    def _to_int(self, text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise RefsError(f"{self.where}: {quote(text)} is not an integer") from None
        if not 0 <= value < MAX_LENGTH:
            raise RefsError(f"{self.where}: {value} is out of range (0 to 2**53)")
        return value

    def _checked(self, values: np.ndarray) -> np.ndarray:
        if len(values) and (values.min() < 0 or values.max() >= MAX_LENGTH):
            bad = int(values[(values < 0) | (values >= MAX_LENGTH)][0])
            raise RefsError(f"{self.where}: {bad} is out of range (0 to 2**53)")
        return values

    def _grid_parts(self, grid, n):
        """Literal strings and int64 arrays standing for each part, or None if not vectorisable."""
        if self.parts is None:
            return None
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, ast.Name) and part.id not in grid:
                value = self.templates.plain.get(part.id)
                if value is None:
                    return None
                out.append(str(value))
            else:
                names = _names(part)
                if not all(k in grid and grid[k].dtype.kind == "i" for k in names):
                    return None
                values = _eval_grid(part, grid, n)
                if values is None:
                    return None
                # an expression of constants alone ("{{0}}", "{{2 * 3}}") is one number: a literal part
                out.append(str(int(values)) if np.ndim(values) == 0 else values)
        return out


def _eval_int(node, values):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.UnaryOp):
        v = _eval_int(node.operand, values)
        return -v if isinstance(node.op, ast.USub) else v
    a, b = _eval_int(node.left, values), _eval_int(node.right, values)
    op = type(node.op)
    if op is ast.Add:
        return a + b
    if op is ast.Sub:
        return a - b
    if op is ast.Mult:
        return a * b
    if op is ast.FloorDiv:
        return a // b
    return a % b


def _eval_grid(node, grid, n) -> np.ndarray | None:
    """Integer arithmetic over the grid; None when it could overflow int64 or divide by zero
    (the slow path then gives Python's exact answer or a proper error)."""
    if isinstance(node, ast.Constant):
        return np.int64(node.value) if abs(node.value) < 2**62 else None
    if isinstance(node, ast.Name):
        return grid[node.id]
    if isinstance(node, ast.UnaryOp):
        v = _eval_grid(node.operand, grid, n)
        return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
    a = _eval_grid(node.left, grid, n)
    b = _eval_grid(node.right, grid, n)
    if a is None or b is None:
        return None
    op = type(node.op)
    if op in (ast.FloorDiv, ast.Mod) and np.any(np.asarray(b) == 0):
        return None
    # float64 shadow: a magnitude check that cannot itself overflow
    approx = _ARITH_OPS[op](np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    if np.any(np.abs(approx) >= 2**62):
        return None
    return _ARITH_OPS[op](a, b)


class TemplateSet:
    """The v1 ``templates`` section: plain strings and callable templates (those containing ``{{``)."""

    def __init__(self, raw: dict | None):
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise RefsError("'templates' must be a JSON object of name: string")
        self.plain: dict[str, str] = {}
        self._callable: dict[str, Template] = {}
        self._depth = 0
        for name, text in raw.items():
            if not isinstance(text, str):
                raise RefsError(f"template {quote(name)} must be a string, got {type(text).__name__}")
            if "{{" in text:
                self._callable[name] = Template(text, f"template {quote(name)}", self)
            else:
                self.plain[name] = text

    def context(self) -> dict:
        ctx: dict = dict(self.plain)
        for name, template in self._callable.items():
            ctx[name] = self._caller(template)
        return ctx

    def _caller(self, template: Template):
        def call(**kwargs):
            self._depth += 1
            try:
                if self._depth > _MAX_DEPTH:
                    raise RecursionError
                return template.render(**kwargs)
            finally:
                self._depth -= 1

        return call


def dimension_values(name: str, spec, where: str) -> np.ndarray:
    """One gen dimension: {"start","stop","step"} (a Python range) or an explicit list."""
    if isinstance(spec, list):
        if spec and all(type(v) is int for v in spec):
            if not all(_INT64_MIN <= v <= _INT64_MAX for v in spec):
                raise RefsError(f"{where}: dimension {quote(name)} holds integers beyond 64 bits")
            return np.array(spec, dtype=np.int64)
        if all(isinstance(v, (int, str)) and not isinstance(v, bool) for v in spec):
            return np.array(spec, dtype=object)
        raise RefsError(f"{where}: dimension {quote(name)} list must hold integers or strings")
    if isinstance(spec, dict):
        bad = [k for k in spec if k not in ("start", "stop", "step")]
        if bad or "stop" not in spec:
            raise RefsError(f"{where}: dimension {quote(name)} needs 'stop' (and optional 'start', 'step')")
        start, stop, step = spec.get("start", 0), spec["stop"], spec.get("step", 1)
        if not all(type(v) is int for v in (start, stop, step)) or step == 0:
            raise RefsError(f"{where}: dimension {quote(name)} start/stop/step must be integers, step not 0")
        if not all(_INT64_MIN <= v <= _INT64_MAX for v in (start, stop, step)):
            raise RefsError(f"{where}: dimension {quote(name)} start/stop/step must fit in 64 bits")
        return np.arange(start, stop, step, dtype=np.int64)
    raise RefsError(f"{where}: dimension {quote(name)} must be a range object or a list")


def expand_gen(gens, templates: TemplateSet, builder) -> None:
    """Add every key of the ``gen`` section to `builder`, in fsspec's order."""
    if not isinstance(gens, list):
        raise RefsError("'gen' must be a JSON list")
    for index, gen in enumerate(gens):
        where = f"gen[{index}]"
        if not isinstance(gen, dict):
            raise RefsError(f"{where} must be a JSON object")
        for field in ("key", "url", "dimensions"):
            if field not in gen:
                raise RefsError(f"{where} is missing {quote(field)}")
        if ("offset" in gen) != ("length" in gen):
            raise RefsError(f"{where}: 'offset' and 'length' must be given together")
        dims = gen["dimensions"]
        if not isinstance(dims, dict) or not dims:
            raise RefsError(f"{where}: 'dimensions' must be a non-empty JSON object")
        for field in ("key", "url", "offset", "length"):
            if field in gen and (type(gen[field]) not in (str, int)):
                raise RefsError(f"{where}: {quote(field)} must be a string")
        # Size first, so an oversized product is refused before any work.
        sizes = {}
        for name, spec in dims.items():
            if isinstance(spec, dict) and all(type(spec.get(k, 1)) is int for k in ("start", "stop", "step")) \
                    and spec.get("step", 1) != 0 and "stop" in spec:
                sizes[name] = _range_size(spec.get("start", 0), spec["stop"], spec.get("step", 1))
            elif isinstance(spec, list):
                sizes[name] = len(spec)
            else:
                dimension_values(name, spec, where)  # raises the precise error
        n = 1
        for size in sizes.values():
            n *= size
        builder.reserve(n, where)
        if n == 0:
            continue
        values = {name: dimension_values(name, spec, where) for name, spec in dims.items()}
        grid = _product_grid(values, n)

        def template(field):
            return Template(str(gen[field]), f"{where}.{field}", templates)

        def reserve(nbytes: int, check_only: bool) -> None:
            builder.reserve_bytes(nbytes, where, check_only)

        keys = template("key").render_grid(grid, n, reserve)
        urls = template("url").render_grid(grid, n, reserve)
        if "offset" in gen:
            offsets = template("offset").int_grid(grid, n)
            lengths = template("length").int_grid(grid, n)
        else:
            offsets = np.zeros(n, dtype=np.int64)
            lengths = np.full(n, -1, dtype=np.int64)
        builder.add_batch(keys, builder.url_ids(urls), offsets, lengths)


def _range_size(start: int, stop: int, step: int) -> int:
    """len(range(...)) without its limit of 2**63 (dimensions can be absurd)."""
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    return max(0, (start - stop - step - 1) // -step)


def _product_grid(values: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    """Flatten the cartesian product, last dimension varying fastest (itertools.product order)."""
    grid = {}
    inner = n
    for name, vals in values.items():
        inner //= len(vals)
        grid[name] = np.tile(np.repeat(vals, inner), n // (len(vals) * inner))
    return grid
