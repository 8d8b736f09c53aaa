"""Module code and data (vcudasim.h "Module descriptors and lazy loading"):
with lazy loading a kernel's code is taken at its first launch in a context,
with CUDA_MODULE_LOADING=EAGER at load; unload and context destruction
return it."""

from __future__ import annotations

from pathlib import Path

from simtool import lines, mem

from py_vcuda.sim import MiB, SimConfig

INVALID_IMAGE = 200
MODULE = "vcudasim-module\ndata 2Mi\ndefault code=1Mi\nkernel a code=4Mi\nkernel b  # 1 MiB\n"


def test_lazy_loading_takes_code_at_first_launch(tool) -> None:
    out = tool("init", "primary", "0", "module", MODULE, "mem",
               "fn", "a", "fn", "b", "mem",          # lookups load nothing
               "fn", "a", "run", "0", "mem",
               "run", "0", "mem",                    # once per context
               "fn", "b", "run", "0", "fn", "zz", "run", "0", "mem",  # zz: the default
               "unload", "mem")
    m = [mem(ln).module for ln in lines(out, "mem")]
    assert m == [2 * MiB, 2 * MiB, 6 * MiB, 6 * MiB, 8 * MiB, 0]


def test_eager_loading_takes_listed_kernels_at_load(tool) -> None:
    out = tool("init", "primary", "0", "module", MODULE, "mem", "fn", "a", "run", "0", "mem",
               env={"CUDA_MODULE_LOADING": "EAGER"})
    m = [mem(ln).module for ln in lines(out, "mem")]
    assert m == [2 * MiB + 5 * MiB, 7 * MiB]


def test_images_without_descriptor_use_the_configured_kernel_code(tool, sim: SimConfig) -> None:
    sim.kernel_code = 3 * MiB
    out = tool("init", "primary", "0", "module", "a cubin", "fn", "k", "mem", "run", "0", "mem")
    assert [mem(ln).module for ln in lines(out, "mem")] == [0, 3 * MiB]


def test_library_kernels_load_per_context(tool) -> None:
    out = tool("init", "library", MODULE,        # no context: no data charged
               "ctx", "0", "fn", "a", "run", "0", "mem",
               "ctx", "0", "run", "0", "mem",    # a second context loads its own copy
               "destroy", "mem")                 # and returns it with the context
    m = [mem(ln).module for ln in lines(out, "mem")]
    assert m == [4 * MiB, 8 * MiB, 4 * MiB]


def test_module_file_and_bad_descriptor(tool, tmp_path: Path) -> None:
    path = tmp_path / "k.image"
    path.write_text("vcudasim-module\nkernel a code=1Mi local=2Ki\n")
    out = tool("init", "primary", "0", "modfile", str(path), "fn", "a", "run", "0", "mem",
               "module", "vcudasim-module;kernel", "module", "vcudasim-module;frobnicate 1",
               "module", "vcudasim-module;kernel a code=lots")
    assert int(lines(out, "fn")[0].rest[0]) == 2048
    assert mem(lines(out, "mem")[0]).module == 1 * MiB
    assert [ln.rc for ln in lines(out, "module")] == [INVALID_IMAGE] * 3
