"""StableHLO modules as MLIR bytecode, lowered by JAX on CPU, for the tests of `{:compile, mlir}`
with bytecode, written to the path given (the bytes JAX's own `jit(...).lower(...)` module
serializes to):

    add_one         main(x: f32[4]) = x + 1 (the default)
    int4_transpose  main(x: s4[2, 3]) = (transpose(x), x): a transpose of 4-bit integers that
                    XLA's CPU compiler throws on (the node refuses it with a compile error)

Usage: PYTHONPATH=$JAX_DIR python3 integration/jax/bytecode.py OUT [MODULE]
"""

import io
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

MODULES = {
    "add_one": (lambda x: x + np.float32(1.0), jax.ShapeDtypeStruct((4,), np.float32)),
    "int4_transpose": (lambda x: (x.T, x), jax.ShapeDtypeStruct((2, 3), jnp.int4)),
}


def main():
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] not in MODULES):
        sys.exit(__doc__)
    fun, arg = MODULES[sys.argv[2] if len(sys.argv) == 3 else "add_one"]
    lowered = jax.jit(fun).lower(arg)
    out = io.BytesIO()
    lowered.compiler_ir("stablehlo").operation.write_bytecode(out)
    with open(sys.argv[1], "wb") as f:
        f.write(out.getvalue())


if __name__ == "__main__":
    main()
