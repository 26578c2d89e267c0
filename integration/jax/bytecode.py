"""A StableHLO module as MLIR bytecode, lowered by JAX on CPU, for the tests of `{:compile, mlir}`
with bytecode: `main(x: f32[4]) = x + 1`, written to the path given (the bytes JAX's own
`jit(...).lower(...)` module serializes to).

Usage: PYTHONPATH=$JAX_DIR python3 integration/jax/bytecode.py OUT
"""

import io
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    lowered = jax.jit(lambda x: x + np.float32(1.0)).lower(jax.ShapeDtypeStruct((4,), np.float32))
    out = io.BytesIO()
    lowered.compiler_ir("stablehlo").operation.write_bytecode(out)
    with open(sys.argv[1], "wb") as f:
        f.write(out.getvalue())


if __name__ == "__main__":
    main()
