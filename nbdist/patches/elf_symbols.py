"""Symbols of libtorch's ELF symbol table, for the few process-wide statics nbdist must reset
between worlds (``rref_reset``, ``rpc_barrier``, ``tp_address``).

A static is written only where the table says it is an object of the size nbdist expects
(``statics``): a torch whose layout changed turns the feature off instead of having its memory
overwritten. Each writer also reads the value's layout before it writes and reads it back after.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import sys
from functools import cache
from typing import NamedTuple

__all__ = ["OBJECT", "Symbol", "elf_symbols", "in_libtorch", "libtorch_cpu", "statics"]

# an exported function of libtorch_cpu.so: where the dynamic loader put it gives the base
_ANCHOR = "_ZN5torch11distributed3rpc11RRefContext11getInstanceEv"
OBJECT = 1  # STT_OBJECT: a variable (STT_FUNC is 2)


class Symbol(NamedTuple):
    """One ``.symtab`` entry: ``address`` (``st_value`` in the file, where it lies in this
    process once ``in_libtorch`` moved it), ``size`` in bytes, ``kind`` (its STT_ type)."""

    address: int
    size: int
    kind: int


def libtorch_cpu() -> str:
    """The path of the loaded torch's ``libtorch_cpu.so``."""
    import torch

    return os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")


def elf_symbols(path: str, names: list[str]) -> dict[str, Symbol]:
    """Each named symbol of the ELF ``.symtab`` of ``path`` (those it has)."""
    import numpy as np

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != b"\x7fELF" or mm[4] != 2:
            return {}
        shoff, = struct.unpack_from("<Q", mm, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", mm, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", mm, shoff + i * shentsize)
                    for i in range(shnum)]
        symtab = next((s for s in sections if s[1] == 2), None)  # SHT_SYMTAB
        if symtab is None:
            return {}
        strtab = sections[symtab[6]]
        str_off, str_size = strtab[4], strtab[5]
        wanted = {}
        for name in names:
            pos = mm.find(b"\0" + name.encode() + b"\0", str_off, str_off + str_size)
            if pos >= 0:
                wanted[pos + 1 - str_off] = name
        dtype = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                          ("value", "<u8"), ("size", "<u8")])
        table = np.frombuffer(mm, dtype=dtype, count=symtab[5] // 24, offset=symtab[4])
        hits = np.nonzero(np.isin(table["name"], np.array(list(wanted), dtype="<u4")))[0]
        found = {wanted[int(table["name"][i])]: Symbol(int(table["value"][i]),
                                                       int(table["size"][i]),
                                                       int(table["info"][i]) & 0xF)
                 for i in hits}
        del table
        return found


@cache
def in_libtorch(*names: str) -> tuple[Symbol, ...] | None:
    """Each named symbol of the loaded ``libtorch_cpu.so``, at its address in this process,
    in the order given; None off Linux or if any is missing (another torch build)."""
    if not sys.platform.startswith("linux"):
        return None
    path = libtorch_cpu()
    try:
        syms = elf_symbols(path, [_ANCHOR, *names])
        anchor = ctypes.cast(getattr(ctypes.CDLL(path), _ANCHOR), ctypes.c_void_p).value
    except (OSError, AttributeError, ValueError):
        return None
    if len(syms) != len({_ANCHOR, *names}) or not anchor:
        return None
    base = anchor - syms[_ANCHOR].address
    return tuple(syms[name]._replace(address=base + syms[name].address) for name in names)


def statics(*layout: tuple[str, int]) -> tuple[int, ...] | None:
    """Where each ``(symbol, size)`` of libtorch lies in this process, in the order given;
    None unless every one is there as an object of exactly that many bytes."""
    found = in_libtorch(*(name for name, _ in layout))
    if found is None or any(sym.kind != OBJECT or sym.size != size
                            for sym, (_, size) in zip(found, layout, strict=True)):
        return None
    return tuple(sym.address for sym in found)
