"""Pass 4: check and encode instruction statements, driven by the ISA table.

Every check is per field kind and machine shape: a UB address must be below
`shape.ub_rows`, an accumulator address below `shape.acc_rows`, a host row or
weight tile must fit its field (their images are only known at run time), a
length is at least 1.  Each mistake is reported and the statement skipped, so
one run reports them all.
"""
from __future__ import annotations

from ..binary import MachineShape, SourceLoc
from ..encoding import MAX_REPEAT, Instruction
from ..isa import ISA_TABLE, Field, InstructionSpec
from .ast import Instr, Name, Named, Num, Span, Str
from .reporter import Reporter, did_you_mean
from .symbols import MEMORIES, EvalError, Frame, Symbols, frame_notes

_MNEMONICS = sorted({n for s in ISA_TABLE.instructions.values() for n in s.names})


class _Form:
    """What a mnemonic-with-flags means, computed once per distinct spelling."""
    __slots__ = ("spec", "flags", "names", "fields", "by_keyword", "ranges")

    def __init__(self, spec: InstructionSpec, flags: int, limits: dict[str, int]):
        self.spec, self.flags = spec, flags
        self.names, fields = spec.layout(flags)
        by_name = {f.name: f for f in fields}
        self.fields = [by_name[n] for n in self.names]
        self.by_keyword: dict[str, Field] = {}
        for f in fields:
            self.by_keyword[f.name] = f
            for alias in f.aliases:
                self.by_keyword[alias] = f
        # legal values per field on this machine shape: the field's own range,
        # cut to the memory size for UB and accumulator addresses
        self.ranges: dict[str, tuple[int, int]] = {}
        for f in fields:
            hi = f.max
            if f.kind in limits:
                hi = min(hi, limits[f.kind] - 1)
            self.ranges[f.name] = (f.min, hi)


class Encoder:
    def __init__(self, reporter: Reporter, symbols: Symbols, shape: MachineShape,
                 limits: dict[str, int]):
        self.reporter = reporter
        self.symbols = symbols
        self.shape = shape
        self._forms: dict[str, _Form] = {}
        self.limits = limits              # memory kind -> rows, binary.memory_limits

    def encode_all(self, items, macros) -> tuple[list[Instruction], list[SourceLoc]]:
        instructions, locations = [], []
        for st, frame in items:
            ins = self.encode(st, frame, macros)
            if ins is not None:
                instructions.append(ins)
                sp = st.span
                locations.append(SourceLoc(sp.file, sp.line, sp.col))
        return instructions, locations

    # ----------------------------------------------------------- mnemonic
    def form(self, st: Instr, frame, macros) -> _Form | None:
        """The meaning of the mnemonic; only good spellings are memoized, so a bad
        one is reported at every place it occurs."""
        form = self._forms.get(st.name)
        if form is None:
            form = self._make_form(st, frame, macros)
            if form is not None:
                self._forms[st.name] = form
        return form

    def _make_form(self, st: Instr, frame, macros) -> _Form | None:
        base, _, letters = st.name.partition(".")
        spec = ISA_TABLE.lookup(base)
        if spec is None:
            self._mnemonic_error(st, frame, macros)
            return None
        flags, ok = 0, True
        sp = st.span
        col = sp.col + len(base) + 1
        unknown = []                      # positions of letters that are no flag
        for k, ch in enumerate(letters.upper()):
            flag = spec.flags.get(ch)
            if flag is None:
                unknown.append(k)
            elif flags & flag.bit:
                self._error(Span(sp.file, sp.line, col + k, sp.line, col + k + 1),
                            f"flag '{ch}' given twice", frame)
                ok = False
            else:
                flags |= flag.bit
        if unknown:
            self._flag_error(spec, letters, unknown, Span(sp.file, sp.line, col, sp.line, col), frame)
            ok = False
        conflict = spec.flag_conflict(flags) if ok else None
        if conflict:
            self._error(Span(sp.file, sp.line, col, sp.line, col + len(letters)), conflict, frame)
            ok = False
        return _Form(spec, flags, self.limits) if ok else None

    def _flag_error(self, spec: InstructionSpec, letters: str, unknown: list[int], at: Span, frame) -> None:
        """One diagnostic for the letters that are not flags of this instruction."""
        if len(unknown) == 1:
            k = unknown[0]
            at = Span(at.file, at.line, at.col + k, at.line, at.col + k + 1)
            what = f"{spec.key} has no flag '{letters[k]}'"
        else:
            at = Span(at.file, at.line, at.col, at.line, at.col + len(letters))
            what = f"{spec.key} has no flags " + ", ".join(f"'{letters[k]}'" for k in unknown)
        if not spec.flags:
            self._error(at, f"{spec.key} takes no flags", frame)
            return
        message = f"{what}; {spec.key} has flags {', '.join(spec.flags)}"
        # `ACT.relu`, `MMC.switch`: the user wrote a flag's name instead of its letter
        by_name = {f.name: f.letter for f in spec.flags.values()}
        hint = did_you_mean(letters, by_name)
        if hint:
            name = hint.split("'")[1]
            message += f"; did you mean '{spec.key}.{by_name[name]}' ({name})?"
        self._error(at, message, frame)

    def _mnemonic_error(self, st: Instr, frame, macros) -> None:
        if self.reporter.full:           # only counted now: skip the suggestions' cost
            self.reporter.dropped += 1
            return
        base = st.name.partition(".")[0]
        sp = st.span
        macro = macros.get(base.upper())
        if macro is not None:           # defined further down: expansion had not met it yet
            where = f"{macro.span.file}:{macro.span.line}:{macro.span.col}"
            self._error(Span(sp.file, sp.line, sp.col, sp.line, sp.col + len(base)),
                        f"macro '{macro.name}' is used before its definition (at {where})", frame)
            return
        candidates = _MNEMONICS + [m.name for m in macros.values()]
        sp = st.span
        at = Span(sp.file, sp.line, sp.col, sp.line, sp.col + len(base))
        self._error(at, f"unknown instruction '{base}'" + did_you_mean(base, candidates), frame)

    # ----------------------------------------------------------- operands
    def encode(self, st: Instr, frame: Frame | None, macros) -> Instruction | None:
        form = self.form(st, frame, macros)
        if form is None:
            return None
        spec = form.spec
        names, fields = form.names, form.fields
        values: dict[str, int] = {}
        nodes: dict = {}                  # field name -> its value's node (for carets)
        repeat = 1
        ok = True
        positional = 0
        seen_named = seen_repeat = False
        for arg in st.args:
            if type(arg) is Named:
                seen_named = True
                key = arg.name.lower()
                if key == "repeat":
                    r = self._value(arg.value, frame)
                    if seen_repeat:
                        self._error(arg.name_span, "repeat given twice", frame)
                        ok = False
                    seen_repeat = True
                    if r is None:
                        ok = False
                    elif not spec.repeat:
                        self._error(arg.span, f"{spec.key} does not take a repeat count", frame)
                        ok = False
                    elif not 1 <= r <= MAX_REPEAT:
                        self._error(arg.value.span, f"repeat {r} out of range 1..{MAX_REPEAT}", frame)
                        ok = False
                    else:
                        repeat = r
                    continue
                field = form.by_keyword.get(key)
                if field is None:
                    keywords = list(form.by_keyword) + (["repeat"] if spec.repeat else [])
                    self._error(arg.name_span, f"{spec.key} has no operand '{arg.name}'"
                                + did_you_mean(arg.name, keywords)
                                + f" (operands: {', '.join(names) or 'none'})", frame)
                    ok = False
                    continue
                if field.name in values:
                    self._error(arg.name_span, f"operand '{field.name}' given twice", frame)
                    ok = False
                    continue
                v = self._field_value(form, field, arg.value, frame)
                if v is None:
                    ok = False
                values[field.name] = v
                nodes[field.name] = arg.value
                continue
            if seen_named:
                self._error(arg.span, "positional operand after a named one", frame)
                return None
            if positional >= len(fields):
                self._error(arg.span, self._count_message(spec, names, len(
                    [a for a in st.args if type(a) is not Named])), frame)
                return None
            field = fields[positional]
            positional += 1
            v = self._field_value(form, field, arg, frame)
            if v is None:
                ok = False
            values[field.name] = v
            nodes[field.name] = arg
        missing = [n for n in names if n not in values]
        if missing and ok:              # after another operand error "missing" is only noise
            self._error(st.span, self._count_message(spec, names, len(names) - len(missing))
                        + f": missing {', '.join(missing)}", frame)
            return None
        if not ok or missing:
            return None
        ins = Instruction(spec.key, form.flags, repeat, values)
        if spec.key == "CFG" and not self._check_cfg_value(ins, st, frame):
            return None
        if spec.same_or_disjoint and not self._check_overlap(ins, nodes, frame):
            return None
        return ins

    def _check_overlap(self, ins: Instruction, nodes: dict, frame) -> bool:
        """VADD/VMUL: the destination is an operand's very rows or disjoint from them
        (spec/isa.md 5.11); checked for the first iteration, whose addresses are known."""
        ok = True
        length = ins.operands["length"]
        broadcast = "B" in ins.flag_letters
        spec = ins.spec
        for dst, src in spec.same_or_disjoint:
            if broadcast and src == "b":
                continue                      # the constant row is read once, first
            d, s = ins.operands[dst], ins.operands[src]
            # a 16-bit operand takes two rows a vector (spec/isa.md 5.11)
            nd = length * spec.rows_per_vector(ins.flags, dst)
            ns = length * spec.rows_per_vector(ins.flags, src)
            if d == s and nd == ns:
                continue                      # in place: row r is read before it is written
            if d < s + ns and s < d + nd:
                self._error(nodes[dst].span,
                            f"{spec.key} destination rows {d}..{d + nd - 1} overlap "
                            f"operand '{src}' rows {s}..{s + ns - 1} without being the same "
                            f"rows (in place is allowed on an operand of the same width, a "
                            f"shifted overlap is not)", frame)
                ok = False
        return ok

    @staticmethod
    def _count_message(spec, names, got) -> str:
        if not names:
            return f"{spec.key} takes no operands"
        return f"{spec.key} takes {', '.join(names)}" + (f" (got {got} operands)" if got > len(names) else "")

    def _value(self, node, frame) -> int | None:
        if type(node) is Str:
            self._error(node.span, "expected a number, not a string", frame)
            return None
        return self.symbols.try_eval(node, frame)

    def _field_value(self, form: _Form, field: Field, node, frame) -> int | None:
        if field.kind == "reg":
            return self._register(node, frame)
        v = node.value if type(node) is Num else None      # the common case, inline
        if v is None:
            v = self._value(node, frame)
            if v is None:
                return None
        lo, hi = form.ranges[field.name]
        if not lo <= v <= hi:
            # an address is named by what it addresses (isa.toml [kinds]); lengths and
            # immediates by their field ("height 0 out of range 1..65535")
            what = ISA_TABLE.kinds[field.kind] if field.kind in MEMORIES else field.name
            self._error(node.span, f"{what} {v} out of range {lo}..{hi} ({form.spec.key} operand '{field.name}')",
                        frame)
            return None
        return v

    def _register(self, node, frame) -> int | None:
        regs = ISA_TABLE.registers
        if type(node) is Name and node.text in regs:
            return regs[node.text].index
        if type(node) is Name and node.text.lower() in regs:
            return regs[node.text.lower()].index
        if type(node) is Name and not self._defined(node, frame):
            self._error(node.span, f"unknown configuration register '{node.text}'"
                        + did_you_mean(node.text, regs), frame)
            return None
        v = self._value(node, frame)
        if v is None:
            return None
        if v not in ISA_TABLE.register_by_index:
            self._error(node.span, f"no configuration register {v} "
                        f"(registers are 0..{max(ISA_TABLE.register_by_index)})", frame)
            return None
        return v

    def _defined(self, node: Name, frame) -> bool:
        try:
            self.symbols.eval(node, frame)
            return True
        except EvalError:
            return False
        except RecursionError:
            return False

    def _error(self, span: Span, message: str, frame) -> None:
        self.reporter.error(span, message, frame_notes(frame))

    def _check_cfg_value(self, ins: Instruction, st: Instr, frame) -> bool:
        """CFG's value must lie in its register's range (spec/isa.toml [registers])."""
        reg = ISA_TABLE.register_by_index[ins.operands["reg"]]
        value = ins.operands["value"]
        if reg.min <= value <= reg.max:
            return True
        node = st.args[1] if len(st.args) > 1 else st
        for a in st.args:
            if type(a) is Named and a.name.lower() == "value":
                node = a.value
        self.reporter.error(node.span, f"value {value} out of range {reg.min}..{reg.max} for register {reg.name}",
                       frame_notes(frame))
        return False
