"""Reference data for the SPMD tests: programs jax.jit compiles over a mesh of CPU devices.

For each case, writes into OUT/<case>/: the StableHLO that `jax.jit(f, in_shardings=...)`
lowers to (module.mlir: Shardy's `sdy.mesh` and `sdy.sharding`, as JAX exports today), each
whole argument (arg_<i>.bin) and JAX's whole result (result.bin), raw little-endian row-major
f32 bytes, and meta.terms with one `{arg | result, f32, Dims}.` per line and
`{mesh, [AxisSize, ...]}.` (read with :file.consult/1). The node compiles module.mlir over as
many devices, runs it with each device's shards, and must give JAX's result.

Usage: PYTHONPATH=$JAX_DIR python3 integration/jax/sharded_export.py --out DIR
"""

import argparse
import os

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402


def layer(x, w):
    return jnp.tanh(x @ w)


def cases():
    devices = np.array(jax.devices()[:4])
    x = np.arange(8 * 6, dtype=np.float32).reshape(8, 6) / 40
    w = (np.arange(6 * 4, dtype=np.float32).reshape(6, 4) - 12) / 20

    # The batch split over a 1-D mesh of 4; the weight whole on every device.
    batch = Mesh(devices, ("batch",))
    yield "batch", [4], batch, (P("batch"), P()), (x, w)

    # A 2x2 mesh: the batch split over its first axis, the weight's columns over its second.
    grid = Mesh(devices.reshape(2, 2), ("batch", "model"))
    yield "grid", [2, 2], grid, (P("batch", None), P(None, "model")), (x, w)


def write(out, name, mesh_shape, mesh, specs, args):
    shardings = tuple(NamedSharding(mesh, spec) for spec in specs)
    jitted = jax.jit(layer, in_shardings=shardings)
    result = np.asarray(jitted(*args))
    directory = os.path.join(out, name)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "module.mlir"), "w") as f:
        f.write(jitted.lower(*args).as_text())
    meta = [f"{{mesh, {list(mesh_shape)}}}."]
    for i, arg in enumerate(args):
        with open(os.path.join(directory, f"arg_{i}.bin"), "wb") as f:
            f.write(np.ascontiguousarray(arg, dtype="<f4").tobytes())
        meta.append(f"{{arg, f32, {list(arg.shape)}}}.")
    with open(os.path.join(directory, "result.bin"), "wb") as f:
        f.write(np.ascontiguousarray(result, dtype="<f4").tobytes())
    meta.append(f"{{result, f32, {list(result.shape)}}}.")
    with open(os.path.join(directory, "meta.terms"), "w") as f:
        f.write("\n".join(meta) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = parser.parse_args().out
    for name, mesh_shape, mesh, specs, args in cases():
        write(out, name, mesh_shape, mesh, specs, args)


if __name__ == "__main__":
    main()
