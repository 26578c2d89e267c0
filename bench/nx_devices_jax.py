"""JAX baseline for the devices benchmark (bench/nx_devices.exs, part of bench/run.sh nx).

The model bench/nx_devices.exs runs: an MLP's forward pass
    h1 = tanh(x @ w1); h2 = tanh(h1 @ w2); out = h2 @ w3
with x f32[batch, width], w1 and w2 f32[width, width], w3 f32[width, 16], the weights held on
the devices and the batch given as a numpy array at each call, its result read back as numpy
(what the Elixir side's calls pay too: the batch crosses to the node, the result comes back).

Measures, for --seconds each, with one caller calling in a loop:
    jit on one device                      jax.jit, everything on device 0
    jit over N devices (NamedSharding)     jax.jit with the batch split over a 1-D Mesh of the
                                           first N CPU devices, the weights replicated
Each also with the batch already on the devices and the result left there, awaited ("computation
alone"): a rate that no caller in another process can exceed.
Prints one line per measurement: "LABEL: RATE batches/s".

JAX's CPU client shows as many devices as XLA_FLAGS=--xla_force_host_platform_device_count=N
asks for; bench/nx_devices.exs sets it to the node's device count.

Usage: PYTHONPATH=$JAX_DIR XLA_FLAGS=--xla_force_host_platform_device_count=4 \
           python3 bench/nx_devices_jax.py --devices 4 [--batch 64] [--width 512] [--seconds 10]
"""

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402 - after choosing the platform
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402


def forward(params, x):
    h = jnp.tanh(x @ params["w1"])
    h = jnp.tanh(h @ params["w2"])
    return h @ params["w3"]


def throughput(call, x, seconds):
    """Batches per second of `call(x)` (its result read back to the host) over `seconds`."""
    np.asarray(call(x))  # warm: compiles once
    count = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        np.asarray(call(x))
        count += 1
    return count / seconds


def computation_rate(call, seconds):
    """Calls per second of `call()`, its inputs already on the devices, each awaited but its
    result left there: XLA's computation and JAX's dispatch, without the batch's way in or the
    result's way out."""
    call().block_until_ready()
    count = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        call().block_until_ready()
        count += 1
    return count / seconds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()

    devices = jax.devices()[: args.devices]
    if len(devices) < args.devices:
        raise SystemExit(f"JAX shows {len(jax.devices())} devices, fewer than {args.devices}")

    rng = np.random.default_rng(7)
    weights = {
        "w1": rng.normal(0.0, 0.05, (args.width, args.width)).astype(np.float32),
        "w2": rng.normal(0.0, 0.05, (args.width, args.width)).astype(np.float32),
        "w3": rng.normal(0.0, 0.05, (args.width, 16)).astype(np.float32),
    }
    x = np.tile(
        (np.arange(1, args.batch + 1, dtype=np.float32) / args.batch)[:, None], (1, args.width)
    )

    one = jax.device_put(weights, devices[0])
    single = jax.jit(forward)
    rate = throughput(lambda batch: single(one, jax.device_put(batch, devices[0])), x, args.seconds)
    print(f"jit on one device: {rate:.1f} batches/s", flush=True)
    on_device = jax.device_put(x, devices[0])
    rate = computation_rate(lambda: single(one, on_device), args.seconds)
    print(f"jit on one device, computation alone: {rate:.1f} batches/s", flush=True)

    mesh = Mesh(np.array(devices), ("batch",))
    replicated = NamedSharding(mesh, PartitionSpec())
    by_rows = NamedSharding(mesh, PartitionSpec("batch"))
    everywhere = jax.device_put(weights, replicated)
    sharded = jax.jit(forward, in_shardings=(replicated, by_rows), out_shardings=by_rows)
    rate = throughput(lambda batch: sharded(everywhere, batch), x, args.seconds)
    print(f"jit over {args.devices} devices (NamedSharding): {rate:.1f} batches/s", flush=True)
    split = jax.device_put(x, by_rows)
    rate = computation_rate(lambda: sharded(everywhere, split), args.seconds)
    print(
        f"jit over {args.devices} devices (NamedSharding), computation alone: {rate:.1f} batches/s",
        flush=True,
    )


if __name__ == "__main__":
    main()
