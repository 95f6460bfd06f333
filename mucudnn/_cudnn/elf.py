"""Read a shared library's ``DT_SONAME`` without loading it (a small ELF reader).

The loader asks a library who it is *before* ``dlopen`` runs its constructors:
the soname a library was linked with is its own claim of identity and major
version (cuDNN 9's main library is ``libcudnn.so.9``). Only what the dynamic
loader itself uses is read: the ELF header, the program headers, the
``PT_DYNAMIC`` segment and, through the ``PT_LOAD`` segments, the string at
``DT_STRTAB + DT_SONAME``. Section headers (which ``strip`` may remove) are not
needed. ELF32 and ELF64, either byte order; standard library only.

>>> from mucudnn._cudnn import loader
>>> from mucudnn._cudnn.elf import read_soname
>>> read_soname(loader.library_path())
'libcudnn.so.9'
>>> read_soname("/dev/null")
Traceback (most recent call last):
  ...
mucudnn._cudnn.elf.ElfFormatError: /dev/null is not an ELF file (it starts with b'')

Every malformed or truncated file raises :class:`ElfFormatError`; nothing is
read past the end of the file and every count is bounded.
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO, NamedTuple, Optional

from ..errors import MucudnnError

__all__ = ["ElfFormatError", "read_soname", "is_elf"]

_MAGIC = b"\x7fELF"
_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_STRTAB, _DT_SONAME = 0, 5, 14
_MAX_PHNUM = 0xFFFF        # e_phnum is 16 bits; PN_XNUM files are refused as malformed
_MAX_DYNAMIC = 1 << 16     # dynamic entries read at most
_MAX_NAME = 4096           # bytes of a soname read at most


class ElfFormatError(MucudnnError, ValueError):
    """The file is not an ELF file, or its headers point outside it."""


class _Layout(NamedTuple):
    """struct formats of one ELF class and byte order."""

    header: str        # e_type .. e_shstrndx, after e_ident
    phdr: str          # one program header, fields in file order
    phdr_fields: tuple  # names of phdr's fields in that order
    dyn: str           # one dynamic entry (d_tag, d_val)


_FIELDS64 = ("type", "flags", "offset", "vaddr", "paddr", "filesz", "memsz", "align")
_FIELDS32 = ("type", "offset", "vaddr", "paddr", "filesz", "memsz", "flags", "align")


def _layout(elf_class: int, data: int) -> _Layout:
    order = {1: "<", 2: ">"}.get(data)
    if order is None or elf_class not in (1, 2):
        raise ElfFormatError(f"unknown ELF class {elf_class} or data encoding {data}")
    if elf_class == 2:
        return _Layout(order + "HHIQQQIHHHHHH", order + "IIQQQQQQ", _FIELDS64, order + "qQ")
    return _Layout(order + "HHIIIIIHHHHHH", order + "IIIIIIII", _FIELDS32, order + "iI")


def _read_at(f: BinaryIO, size: int, offset: int, length: int, what: str) -> bytes:
    if offset < 0 or length < 0 or offset + length > size:
        raise ElfFormatError(f"{what} at offset {offset} (+{length} bytes) lies outside the "
                             f"file ({size} bytes)")
    f.seek(offset)
    data = f.read(length)
    if len(data) != length:  # pragma: no cover - the file shrank under us
        raise ElfFormatError(f"{what}: short read at offset {offset}")
    return data


def is_elf(path: "str | os.PathLike[str]") -> bool:
    """Whether ``path`` starts with the ELF magic bytes."""
    with open(path, "rb") as f:
        return f.read(4) == _MAGIC


def read_soname(path: "str | os.PathLike[str]") -> Optional[str]:
    """The ``DT_SONAME`` of the ELF shared object at ``path``; None when it has
    none (no ``PT_DYNAMIC`` segment, or no ``DT_SONAME`` entry).

    Raises :class:`ElfFormatError` when ``path`` is not a well-formed ELF file
    and OSError when it cannot be read.
    """
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        ident = f.read(16)
        if len(ident) < 16 or ident[:4] != _MAGIC:
            raise ElfFormatError(f"{path} is not an ELF file (it starts with {ident[:4]!r})")
        lay = _layout(ident[4], ident[5])
        hdr = struct.unpack(lay.header, _read_at(f, size, 16, struct.calcsize(lay.header),
                                                 "the ELF header"))
        phoff, phentsize, phnum = hdr[4], hdr[8], hdr[9]
        if phnum == 0:
            return None
        if phnum >= _MAX_PHNUM or phentsize < struct.calcsize(lay.phdr):
            raise ElfFormatError(f"{path}: bad program header table (e_phnum={phnum}, "
                                 f"e_phentsize={phentsize})")
        table = _read_at(f, size, phoff, phnum * phentsize, "the program header table")
        phdrs = [dict(zip(lay.phdr_fields, struct.unpack_from(lay.phdr, table, i * phentsize)))
                 for i in range(phnum)]
        dynamic = [ph for ph in phdrs if ph["type"] == _PT_DYNAMIC]
        if not dynamic:
            return None
        ph = dynamic[0]
        entsize = struct.calcsize(lay.dyn)
        count = min(ph["filesz"] // entsize, _MAX_DYNAMIC)
        raw = _read_at(f, size, ph["offset"], count * entsize, "the dynamic segment")
        strtab = soname = None
        for i in range(count):
            tag, val = struct.unpack_from(lay.dyn, raw, i * entsize)
            if tag == _DT_NULL:
                break
            if tag == _DT_STRTAB:
                strtab = val
            elif tag == _DT_SONAME:
                soname = val
        if soname is None:
            return None
        if strtab is None:
            raise ElfFormatError(f"{path}: DT_SONAME without DT_STRTAB")
        offset = _file_offset(phdrs, strtab, path)
        if offset is None:
            raise ElfFormatError(f"{path}: DT_STRTAB {strtab:#x} lies in no PT_LOAD segment")
        start = offset + soname
        name = _read_at(f, size, start, min(_MAX_NAME, max(0, size - start)), "the soname")
        end = name.find(b"\0")
        if end < 0:
            raise ElfFormatError(f"{path}: the soname at offset {start} is not terminated")
        return name[:end].decode("utf-8", "replace")


def _file_offset(phdrs: list, vaddr: int, path: str) -> Optional[int]:
    """The file offset of virtual address ``vaddr`` (through the PT_LOAD segments)."""
    for ph in phdrs:
        if ph["type"] == _PT_LOAD and ph["vaddr"] <= vaddr < ph["vaddr"] + ph["filesz"]:
            return vaddr - ph["vaddr"] + ph["offset"]
    return None
