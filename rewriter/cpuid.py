"""The CPU's own answer to CPUID, read as Eigen reads it, for the cache size its kernels use.

Eigen sizes the work of TensorFlow's 3-D convolution gradients by the L3 cache it asks the CPU
for. On AMD CPUs it asks leaf 0x80000006, which gives the L3 of the whole package (256 MiB on an
EPYC virtual machine whose Linux reports a 16 MiB cache), not one cache's, as Linux does.
Python cannot execute CPUID itself: a 27-byte function is put in executable memory and called.
"""

from __future__ import annotations

import ctypes
import mmap
import platform

__all__ = ["cpuid", "eigen_amd_l3_bytes", "vendor"]

# push rbx; mov eax, edi; mov ecx, esi; mov r8, rdx; cpuid;
# mov [r8], eax; mov [r8+4], ebx; mov [r8+8], ecx; mov [r8+12], edx; pop rbx; ret
_CODE = bytes.fromhex("5389f889f14989d00fa241890041895804418948084189500c5bc3")
_Registers = ctypes.c_uint32 * 4


def cpuid(leaf: int, subleaf: int = 0) -> tuple[int, int, int, int] | None:
    """EAX, EBX, ECX, EDX of CPUID `leaf`, or None off x86-64 or where memory may not be
    made executable."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        code = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, AttributeError, ValueError):
        return None
    try:
        code.write(_CODE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(code))
        call = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(_Registers))
        out = _Registers()
        call(address)(leaf, subleaf, ctypes.byref(out))
        return out[0], out[1], out[2], out[3]
    finally:
        code.close()


def eigen_amd_l3_bytes(edx: int) -> int:
    """The L3 size Eigen reads from EDX of leaf 0x80000006 on AMD CPUs: bits 27 to 18, in
    units of 512 KiB (its mask, 0xFFFC000, drops the top four of the field's bits)."""
    return ((edx & 0xFFFC000) >> 18) * 512 * 1024


def vendor() -> str:
    """The vendor string of CPUID leaf 0 ('GenuineIntel', 'AuthenticAMD'), or ''."""
    regs = cpuid(0)
    if regs is None:
        return ""
    return b"".join(r.to_bytes(4, "little") for r in (regs[1], regs[3], regs[2])).decode(
        "ascii", "replace"
    )
