# The eager line of the GPU benchmark (bench/run.sh gpu): one Nx.add of two f32[1024] tensors
# already on the node (XlaNode.Backend), against JAX's jnp.add of two device arrays, whose median
# bench/gpu_jax.py wrote to DIR/jax.txt.
#
# Runs inside the elixir_nx Mix project, which needs Nx (NX_PATH) and Elixir >= 1.17:
#   cd elixir_nx && elixir --sname NAME --cookie COOKIE -S mix run ../bench/gpu_eager.exs XLA_NODE_SNAME DIR

[xla_name, dir] = System.argv()
host = node() |> Atom.to_string() |> String.split("@") |> List.last()
xla = :"#{xla_name}@#{host}"
true = Node.connect(xla)
Code.require_file("timing.exs", __DIR__)

[jax_us] =
  for line <- String.split(File.read!(Path.join(dir, "jax.txt")), "\n"),
      match = Regex.run(~r/^eager_add_device (\S+)$/, line),
      match != nil,
      do: match |> List.last() |> Float.parse() |> elem(0)

Nx.default_backend({XlaNode.Backend, node: xla})
a = Nx.iota({1024}, type: :f32)
b = Nx.broadcast(Nx.tensor(1.0, type: :f32), {1024})
add = fn -> Nx.add(a, b) end

# The results are freed when each scope ends, outside the timings.
samples =
  Enum.flat_map(1..4, fn _ ->
    XlaNode.Backend.scope(fn ->
      for _ <- 1..10, do: add.()
      for _ <- 1..500, do: Bench.Timing.time(add)
    end)
  end)

node_us = Bench.Timing.median(samples)

IO.puts(
  "  eager Nx.add of two f32[1024] on the device (XlaNode.Backend): node " <>
    :erlang.float_to_binary(node_us, decimals: 1) <> " us, JAX jnp.add " <>
    :erlang.float_to_binary(jax_us, decimals: 1) <> " us: " <>
    :erlang.float_to_binary(node_us / jax_us, decimals: 2) <> "x"
)
