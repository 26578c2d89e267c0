"""JAX baseline for the defn benchmark (bench/run.sh nx): an MLP's forward pass and gradient.

The model, the same as bench/nx_mlp.exs jits with XlaNode.Compiler on the node:
    h1 = tanh(x @ w1 + b1); h2 = tanh(h1 @ w2 + b2); out = h2 @ w3 + b3
with x f32[batch, width] and three dense layers of width x width, and for the gradient
    loss = mean((out - y) ** 2), differentiated w.r.t. w1, b1, w2, b2, w3, b3.

The weights and inputs come from numpy with a fixed seed and are written to --data-dir as raw
little-endian f32 (w1.f32, ..., x.f32, y.f32), so that the node computes on the same values.

JAX runs on the PJRT plugin given by --plugin (the node's own, registered as a JAX plugin) when it
loads, else on jaxlib's built-in CPU client; the first line printed says which:
"ready plugin PATH" or "ready jaxlib-cpu REASON". Then it serves one command per stdin line, so
that a benchmark can interleave JAX's work with another runner's one call at a time:
    run forward|grad host     one call with numpy params and inputs and numpy results (the host
                              copies a caller of plain arrays pays); answers its microseconds
    run forward|grad device   one call with the params already on the device (jax.Array), numpy
                              inputs, results left on the device; answers its microseconds
    train                     one training step (value_and_grad of the loss, then SGD with rate
                              0.01) on params kept on the device from step to step, the batch
                              given as numpy, the loss read back as a float; answers
                              "MICROSECONDS LOSS"
    compile forward|grad N    clears JAX's caches and times jax.jit(f).lower(...) and .compile()
                              for batch N; answers "LOWER_US COMPILE_US"
    check                     writes forward.f32 and grad_<name>.f32 (the base batch's results)
                              to --data-dir; answers "ok"

Usage: PYTHONPATH=$JAX_DIR python3 bench/nx_mlp_jax.py --data-dir DIR [--plugin PATH]
           [--batch 256] [--width 1024]
"""

import argparse
import logging
import os
import sys
import time

PLUGIN_PLATFORM = "xla_node_plugin"


def select_backend(plugin_path):
    """Registers the node's plugin as JAX's only platform; returns the line that says what ran."""
    if plugin_path:
        os.environ["JAX_PLATFORMS"] = PLUGIN_PLATFORM
    else:
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    from jax._src import xla_bridge

    if not plugin_path:
        return "jaxlib-cpu (no --plugin given)"
    # JAX warns that a plugin platform is experimental; the "ready" line says what runs instead.
    logging.getLogger("jax._src.xla_bridge").setLevel(logging.ERROR)
    try:
        xla_bridge.register_plugin(PLUGIN_PLATFORM, library_path=plugin_path)
        jax.devices()
        return f"plugin {plugin_path}"
    except Exception as error:  # noqa: BLE001 - any failure means: fall back, and say why
        reason = " ".join(str(error).split())[:200]
        xla_bridge._clear_backends()
        jax.config.update("jax_platforms", "cpu")
        jax.devices()
        return f"jaxlib-cpu (the plugin did not load: {reason})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True,
                        help="where the weights, inputs and results go")
    parser.add_argument("--plugin", help="the node's PJRT plugin .so, to run JAX on it")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=1024)
    args = parser.parse_args()

    backend = select_backend(args.plugin)
    import jax
    import jax.numpy as jnp
    import numpy as np

    def forward(params, x):
        h1 = jnp.tanh(x @ params["w1"] + params["b1"])
        h2 = jnp.tanh(h1 @ params["w2"] + params["b2"])
        return h2 @ params["w3"] + params["b3"]

    def loss(params, x, y):
        return jnp.mean((forward(params, x) - y) ** 2)

    loss_grad = jax.grad(loss)
    functions = {"forward": forward, "grad": loss_grad}

    # Weights scaled so that tanh stays away from saturation (a gradient worth comparing).
    rng = np.random.default_rng(0)
    width, batch = args.width, args.batch
    scale = np.float32(1 / np.sqrt(width))
    params = {}
    for layer in ("1", "2", "3"):
        params["w" + layer] = rng.standard_normal((width, width), np.float32) * scale
        params["b" + layer] = rng.standard_normal((width,), np.float32) * np.float32(0.1)
    x = rng.standard_normal((batch, width), np.float32)
    y = rng.standard_normal((batch, width), np.float32)
    os.makedirs(args.data_dir, exist_ok=True)
    for name, value in [*params.items(), ("x", x), ("y", y)]:
        value.astype("<f4").tofile(os.path.join(args.data_dir, f"{name}.f32"))

    def arguments(kind, params, x, y):
        return (params, x) if kind == "forward" else (params, x, y)

    jitted = {kind: jax.jit(f) for kind, f in functions.items()}

    def train_step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), value

    train_jitted = jax.jit(train_step)
    trained = {"params": jax.device_put(params)}

    def train():
        start = time.perf_counter()
        trained["params"], value = train_jitted(trained["params"], x, y)
        value = float(value)
        return f"{(time.perf_counter() - start) * 1e6:.1f} {value!r}"

    params_on_device = jax.device_put(params)
    for kind in functions:  # compile and warm up both call styles
        jax.block_until_ready(jitted[kind](*arguments(kind, params_on_device, x, y)))
        jax.tree.map(np.asarray, jitted[kind](*arguments(kind, params, x, y)))

    def run(kind, style):
        start = time.perf_counter()
        if style == "host":
            jax.tree.map(np.asarray, jitted[kind](*arguments(kind, params, x, y)))
        else:
            jax.block_until_ready(jitted[kind](*arguments(kind, params_on_device, x, y)))
        return f"{(time.perf_counter() - start) * 1e6:.1f}"

    def compile_time(kind, n):
        jax.clear_caches()
        param_specs = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
        input_spec = jax.ShapeDtypeStruct((n, width), jnp.float32)
        start = time.perf_counter()
        lowered = jax.jit(functions[kind]).lower(
            *arguments(kind, param_specs, input_spec, input_spec))
        lowered_at = time.perf_counter()
        lowered.compile()
        done = time.perf_counter()
        return f"{(lowered_at - start) * 1e6:.1f} {(done - lowered_at) * 1e6:.1f}"

    def check():
        np.asarray(jitted["forward"](params, x)).astype("<f4").tofile(
            os.path.join(args.data_dir, "forward.f32"))
        for name, value in jitted["grad"](params, x, y).items():
            np.asarray(value).astype("<f4").tofile(os.path.join(args.data_dir, f"grad_{name}.f32"))
        return "ok"

    print(f"ready {backend}", flush=True)
    for line in sys.stdin:
        command = line.split()
        if command[:1] == ["run"] and len(command) == 3:
            answer = run(command[1], command[2])
        elif command[:1] == ["compile"] and len(command) == 3:
            answer = compile_time(command[1], int(command[2]))
        elif command == ["train"]:
            answer = train()
        elif command == ["check"]:
            answer = check()
        else:
            answer = f"error: unknown command {line.strip()!r}"
        print(answer, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
