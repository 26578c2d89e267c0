"""Reference data for the native-kernel tests, produced by JAX on CPU.

Loads an XLA FFI kernel library (built by scripts/kernels.sh), registers its
handlers with JAX and, for each case, writes into OUT/<case>/: the lowered
StableHLO (module.mlir), the input (input.bin), each output computed by JAX
(output_<i>.bin; raw little-endian row-major bytes) and meta.terms describing
dtypes and shapes as Erlang terms, one `{input | output, Dtype, Dims}.` per line
(read with :file.consult/1). The node runs module.mlir on input.bin and must match.

Usage: PYTHONPATH=$JAX_DIR python3 integration/jax/ffi_crosscheck.py --library PATH --out DIR
"""

import argparse
import ctypes
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402

DTYPES = {np.dtype(np.float32): "f32"}


def add_scaled(x):
    call = jax.ffi.ffi_call("xn_add_scaled", jax.ShapeDtypeStruct(x.shape, x.dtype))
    return call(x, n=np.float32(2.5))


def sum_max(x):
    scalar = jax.ShapeDtypeStruct((), x.dtype)
    return jax.ffi.ffi_call("xn_sum_max", (scalar, scalar))(x)


CASES = {
    "add_scaled": (
        add_scaled,
        np.array([[1.0, -2.5, -0.0], [1e-39, 1e30, 0.125]], dtype=np.float32),
    ),
    "sum_max": (sum_max, np.array([3.0, -1.5, 7.25, 0.0, -8.0], dtype=np.float32)),
}


def describe(role, a):
    dims = ",".join(str(d) for d in a.shape)
    return f"{{{role}, {DTYPES[np.dtype(a.dtype)]}, [{dims}]}}.\n"


def raw(a):
    return np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


def write_case(out, name, f, x):
    case_dir = os.path.join(out, name)
    os.makedirs(case_dir, exist_ok=True)
    jitted = jax.jit(f)
    with open(os.path.join(case_dir, "module.mlir"), "w") as fh:
        fh.write(jitted.lower(x).as_text())
    outputs = jitted(x)
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    outputs = [np.asarray(o) for o in outputs]
    with open(os.path.join(case_dir, "input.bin"), "wb") as fh:
        fh.write(raw(x))
    for i, o in enumerate(outputs):
        with open(os.path.join(case_dir, f"output_{i}.bin"), "wb") as fh:
            fh.write(raw(o))
    with open(os.path.join(case_dir, "meta.terms"), "w") as fh:
        fh.write(describe("input", x))
        fh.writelines(describe("output", o) for o in outputs)
    return case_dir


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", required=True, help="path of the kernel .so")
    parser.add_argument("--out", required=True, help="directory to write cases into")
    args = parser.parse_args()

    lib = ctypes.cdll.LoadLibrary(os.path.abspath(args.library))
    for name in ("xn_add_scaled", "xn_sum_max"):
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")

    for name, (f, x) in CASES.items():
        print(write_case(args.out, name, f, x))
    return 0


if __name__ == "__main__":
    sys.exit(main())
