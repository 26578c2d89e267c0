"""JAX's side of the GPU benchmark (bench/run.sh gpu), and the programs the node runs for it.

Runs each piece of work of the benchmark under JAX on one device and writes, to --out:
    jax.txt                    JAX's medians in microseconds, one "KEY VALUE" line per
                               measurement, and the first training step's loss of each MLP
    add_one.mlir               main(x: f32[4]) = x + 1
    matmul.mlir                main(a, b: bf16[n, n]) = a @ b
    mlp_W_B.mlir               one training step of the MLP below, width W, batch B:
                               main(w1, b1, w2, b2, w3, b3, x, y) = (w1', b1', ..., b3', loss)
    mlp_W_B_NAME.f32           its initial params and batch, raw little-endian f32
The node's programs are JAX's own lowering of the same functions where JAX has one (the MLP), so
that both sides compile the same StableHLO; the rest are written out here, and bench/gpu.exs
writes the callback programs (they name their callback by an Erlang term).

The MLP: h1 = tanh(x @ w1 + b1); h2 = tanh(h1 @ w2 + b2); out = h2 @ w3 + b3;
loss = mean((out - y) ** 2); a step is SGD with rate 0.01 on value_and_grad of the loss.

Every measurement keeps its operands on the device when the work is "on device" (jax.Array from
jax.device_put, results waited for with block_until_ready), and hands numpy arrays in and out
when it is "host".

Usage: python3 bench/gpu_jax.py --out DIR [--platform cuda|cpu] [--small]
(JAX_PLATFORMS is set from --platform; on CPU, PYTHONPATH must reach a JAX install.)
"""

import argparse
import os
import sys
import time

# (width, batch) of the MLP training steps; n of the matmul; the transfers' sizes in MiB.
FULL = {"mlps": [(1024, 256), (4096, 4096)], "matmul": 8192, "transfers": [128, 1024]}
SMALL = {"mlps": [(256, 64), (512, 256)], "matmul": 512, "transfers": [8, 32]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where the programs and JAX's figures go")
    parser.add_argument("--platform", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--small", action="store_true",
                        help="small sizes, for trying the benchmark out on a CPU")
    args = parser.parse_args()
    # pure_callback places its operands on a CPU device, which JAX must have besides the GPU.
    os.environ["JAX_PLATFORMS"] = "cuda,cpu" if args.platform == "cuda" else "cpu"
    # Several processes share the GPU in turn (JAX here, then the node): take memory as needed.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    import jax
    import jax.numpy as jnp
    import numpy as np

    sizes = SMALL if args.small else FULL
    os.makedirs(args.out, exist_ok=True)
    device = jax.devices()[0]
    figures = {"jax_version": jax.__version__,
               "device": f"{device.platform}:{device.device_kind}".replace(" ", "_")}

    def write(name, text):
        with open(os.path.join(args.out, name), "w") as f:
            f.write(text)

    def median_us(fun, n, warmup=3):
        for _ in range(warmup):
            fun()
        samples = []
        for _ in range(n):
            start = time.perf_counter()
            fun()
            samples.append((time.perf_counter() - start) * 1e6)
        samples.sort()
        return samples[len(samples) // 2]

    # A tiny run with host tensors: numpy in, numpy out.
    add_one = jax.jit(lambda x: x + np.float32(1))
    x4 = np.arange(4, dtype=np.float32)
    figures["tiny_host"] = median_us(lambda: np.asarray(add_one(x4)), 2000, 100)
    write("add_one.mlir", """func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<4xf32>
  %y = stablehlo.add %x, %one : tensor<4xf32>
  return %y : tensor<4xf32>
}
""")

    # An eager op on device tensors: one jnp.add of two f32[1024] already on the device, as
    # XlaNode.Backend's Nx.add of two tensors on the node.
    a1k = jax.device_put(np.arange(1024, dtype=np.float32))
    b1k = jax.device_put(np.ones(1024, dtype=np.float32))
    figures["eager_add_device"] = median_us(lambda: jnp.add(a1k, b1k).block_until_ready(), 2000, 100)

    # MLP training steps, params and batch on the device.
    def forward(w1, b1, w2, b2, w3, b3, x):
        h1 = jnp.tanh(x @ w1 + b1)
        h2 = jnp.tanh(h1 @ w2 + b2)
        return h2 @ w3 + b3

    def loss(params, x, y):
        return jnp.mean((forward(*params, x) - y) ** 2)

    def train_step(w1, b1, w2, b2, w3, b3, x, y):
        params = (w1, b1, w2, b2, w3, b3)
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return (*(p - 0.01 * g for p, g in zip(params, grads)), value)

    step = jax.jit(train_step)
    names = ["w1", "b1", "w2", "b2", "w3", "b3", "x", "y"]
    for width, batch in sizes["mlps"]:
        rng = np.random.default_rng(0)
        scale = np.float32(1 / np.sqrt(width))
        host = []
        for _ in range(3):
            host.append(rng.standard_normal((width, width), np.float32) * scale)
            host.append(rng.standard_normal((width,), np.float32) * np.float32(0.1))
        host.append(rng.standard_normal((batch, width), np.float32))
        host.append(rng.standard_normal((batch, width), np.float32))
        key = f"mlp_{width}_{batch}"
        for name, value in zip(names, host):
            value.astype("<f4").tofile(os.path.join(args.out, f"{key}_{name}.f32"))
        write(f"{key}.mlir", step.lower(*host).as_text())
        on_device = [jax.device_put(v) for v in host]
        state = {"params": on_device[:6]}
        first = step(*on_device)
        figures[f"{key}_first_loss"] = float(first[6])

        def one_step():
            *state["params"], value = step(*state["params"], *on_device[6:])
            float(value)  # the loss read back, as the node's side does

        figures[f"{key}_step"] = median_us(one_step, 200 if width * batch <= 1024 * 256 else 30)

    # An n^3 bf16 matmul on device operands.
    n = sizes["matmul"]
    rng = np.random.default_rng(1)
    a = jax.device_put(jnp.asarray(rng.standard_normal((n, n), np.float32), jnp.bfloat16))
    b = jax.device_put(jnp.asarray(rng.standard_normal((n, n), np.float32), jnp.bfloat16))
    matmul = jax.jit(lambda a, b: a @ b)
    figures["matmul"] = median_us(lambda: matmul(a, b).block_until_ready(), 20)
    figures["matmul_n"] = n
    write("matmul.mlir", f"""func.func @main(%a: tensor<{n}x{n}xbf16>, %b: tensor<{n}x{n}xbf16>) -> tensor<{n}x{n}xbf16> {{
  %c = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<{n}x{n}xbf16>, tensor<{n}x{n}xbf16>) -> tensor<{n}x{n}xbf16>
  return %c : tensor<{n}x{n}xbf16>
}}
""")

    # Host -> device and back, u8 of each size.
    for mib in sizes["transfers"]:
        data = np.frombuffer(np.random.default_rng(2).bytes(mib << 20), np.uint8)
        on_device = jax.device_put(data).block_until_ready()
        figures[f"h2d_{mib}MiB"] = median_us(lambda: jax.device_put(data).block_until_ready(), 5, 1)
        figures[f"d2h_{mib}MiB"] = median_us(lambda: np.array(on_device), 5, 1)
        del on_device
    figures["transfers_mib"] = ",".join(str(mib) for mib in sizes["transfers"])

    # One callback inside a program: pure_callback on x * 2, against the same program without.
    def host_echo(v):
        return np.asarray(v)

    spec = jax.ShapeDtypeStruct((4,), jnp.float32)
    with_cb = jax.jit(lambda x: jax.pure_callback(host_echo, spec, x * 2) + 1)
    without_cb = jax.jit(lambda x: x * 2 + 1)
    x_dev = jax.device_put(x4)
    # Results read back to the host on both sides (16 bytes), as the node's run answers them.
    figures["callback_with"] = median_us(lambda: np.asarray(with_cb(x_dev)), 1000, 50)
    figures["callback_without"] = median_us(lambda: np.asarray(without_cb(x_dev)), 1000, 50)

    with open(os.path.join(args.out, "jax.txt"), "w") as f:
        for key, value in figures.items():
            f.write(f"{key} {value}\n")
    print(f"jax {jax.__version__} on {figures['device']}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
