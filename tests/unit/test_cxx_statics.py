"""The C++ statics of libtorch nbdist writes: found with their sizes in the ELF symbol table,
written only where size and layout are nbdist's, read back after; refused (nothing written,
one line) otherwise. On the real libtorch, in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys

from nbdist.patches import elf_symbols, rpc_barrier, rref_reset, tp_address

SIZES = {rref_reset._CTX: 8, rref_reset._GUARD: 8, rref_reset._NEXT_ID: 8,
         rpc_barrier._BARRIER_ID: 4, tp_address._VALUE: 32, tp_address._GUARD: 8}


def test_the_elf_reader_gives_each_static_its_size_and_kind():
    found = elf_symbols.elf_symbols(elf_symbols.libtorch_cpu(),
                                    [*SIZES, rref_reset._DTOR, "_ZN_no_such_symbol_E"])
    assert {name: (sym.size, sym.kind) for name, sym in found.items() if name in SIZES} == \
        {name: (size, elf_symbols.OBJECT) for name, size in SIZES.items()}
    assert found[rref_reset._DTOR].kind == 2  # STT_FUNC: code, hundreds of bytes
    assert found[rref_reset._DTOR].size > 100
    assert "_ZN_no_such_symbol_E" not in found


def test_statics_answers_only_for_objects_of_the_size_asked():
    name = rpc_barrier._BARRIER_ID
    at = elf_symbols.statics((name, 4))
    assert at is not None and at[0] == elf_symbols.in_libtorch(name)[0].address
    assert elf_symbols.statics((name, 8)) is None
    assert elf_symbols.statics((name, 4), (rref_reset._CTX, 4)) is None
    assert elf_symbols.statics((rref_reset._DTOR, 822)) is None  # a function, not a static
    assert rref_reset.available() and rpc_barrier.available() and tp_address.available()


CHECKS = r'''
import ctypes, json, os, sys
import torch.distributed.rpc as rpc
from nbdist.patches import elf_symbols, rpc_barrier, rref_reset, tp_address

def raw(*layout):  # the bytes of each static, read through the sizes the table gives
    return [ctypes.string_at(s.address, s.size).hex()
            for s in elf_symbols.in_libtorch(*(n for n, _ in layout))]

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], TP_SOCKET_IFNAME="lo")
rpc.init_rpc("solo", rank=0, world_size=1)
rpc.shutdown()
out = {}
writers = {"rref": (rref_reset, rref_reset.reset_singleton),
           "tp": (tp_address, lambda: tp_address.pin("127.0.0.2")),
           "barrier": (rpc_barrier, rpc_barrier.restart)}
ctypes.c_int32.from_address(rpc_barrier._address()).value = 3  # as after three shutdowns
for key, (module, write) in writers.items():  # one size wrong: refused, nothing written
    right = module._LAYOUT
    module._LAYOUT = ((right[0][0], right[0][1] * 2),) + right[1:]
    before = raw(*right)
    out[key + "_wrong_size"] = [write(), raw(*right) == before]
    module._LAYOUT = right
# a layout that reads wrong: refused, one line, nothing written
guard = ctypes.c_uint64.from_address(tp_address._addresses()[1])
guard.value = 2
before = raw(*tp_address._LAYOUT)
out["tp_bad_guard"] = [tp_address.pin("127.0.0.2"), raw(*tp_address._LAYOUT) == before]
guard.value = 1
count = ctypes.c_int32.from_address(rpc_barrier._address())
count.value = -7
out["barrier_negative"] = [rpc_barrier.restart(), count.value]
count.value = 3
rguard = ctypes.c_uint64.from_address(rref_reset._addresses()[1])
rguard.value = 0x101
before = raw(*rref_reset._LAYOUT)
out["rref_bad_guard"] = [rref_reset.reset_singleton(), raw(*rref_reset._LAYOUT) == before]
rguard.value = 1
# the right layout: written and read back
out["tp"] = [tp_address.pin("127.0.0.2"), tp_address.current()]
out["barrier"] = [rpc_barrier.restart(), count.value]
out["rref"] = [rref_reset.reset_singleton(), raw(*rref_reset._LAYOUT[:2])]
print(json.dumps(out))
'''


def test_each_write_checks_size_and_layout_first_and_reads_back(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run([sys.executable, "-c", CHECKS, str(port)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    for key in ("rref", "tp", "barrier"):
        assert out[key + "_wrong_size"] == [False, True], (key, out)
    assert out["tp_bad_guard"] == [False, True]
    assert out["barrier_negative"] == [False, -7]
    assert out["rref_bad_guard"] == [False, True]
    assert out["tp"] == [True, "127.0.0.2"]
    assert out["barrier"] == [True, 0]
    assert out["rref"] == [True, ["0" * 16, "0" * 16]]
    said = [line for line in done.stderr.splitlines() if line.startswith("nbdist: ")]
    assert len(said) == 3, done.stderr[-3000:]  # one a feature, each saying what was read
    assert any("TensorPipe address guard reads 0x2: left as it was" in s for s in said)
    assert any("rpc::barrierId reads -7: left as it was" in s for s in said)
    assert any("RRefContext reads as guard 0x101" in s for s in said)
