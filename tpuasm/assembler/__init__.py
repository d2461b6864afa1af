"""The assembler: .tasm source -> Program (parse, expand, resolve, encode)."""
