# The node's side of the GPU benchmark (bench/run.sh gpu): the work bench/gpu_jax.py timed under
# JAX, done through raw :xla requests on a node started on the same device, and both reported
# side by side (node over JAX; medians).
#
#   elixir --sname NAME --cookie COOKIE bench/gpu.exs XLA_NODE_SNAME DIR
#
# DIR holds what bench/gpu_jax.py wrote: jax.txt (JAX's figures), the programs and the MLPs'
# initial params and batches.

[xla_name, dir] = System.argv()
host = node() |> Atom.to_string() |> String.split("@") |> List.last()
xla = :"#{xla_name}@#{host}"
true = Node.connect(xla)

Code.require_file("timing.exs", __DIR__)

defmodule Bench.Gpu do
  defdelegate median(samples), to: Bench.Timing
  defdelegate time(fun), to: Bench.Timing

  def call(xla, request, timeout \\ 600_000), do: GenServer.call({:xla, xla}, request, timeout)

  @doc "The median microseconds of `n` calls of `fun`, after `warmup` untimed ones."
  def median_us(fun, n, warmup \\ 3) do
    for _ <- 1..warmup//1, do: fun.()
    median(for _ <- 1..n, do: time(fun))
  end

  def us(x) when x >= 10_000, do: :erlang.float_to_binary(x / 1000, decimals: 2) <> " ms"
  def us(x), do: :erlang.float_to_binary(x / 1, decimals: 1) <> " us"

  def row(what, node_us, jax_us),
    do: "#{what}: node #{us(node_us)}, JAX #{us(jax_us)}: #{:erlang.float_to_binary(node_us / jax_us, decimals: 2)}x"

  def compile!(xla, mlir) do
    case call(xla, {:compile, mlir}) do
      {:ok, exe} -> exe
      {:error, {kind, message}} -> raise "#{kind}: #{message}"
    end
  end

  def to_device!(xla, tensor) do
    {:ok, buffer} = call(xla, {:to_device, tensor})
    buffer
  end

  def free_all(xla, refs), do: Enum.each(refs, &(:ok = call(xla, {:free, &1})))

  # A program in EXLA's form (parameter 0 the callback handle) computing x * 2 + 1, with or
  # without a runtime callback on x * 2 that the server answers with its argument.
  def callback_program(with_callback?) do
    id = :erlang.term_to_binary(:gpu_bench)
    padded = id <> :binary.copy(<<0>>, rem(8 - rem(byte_size(id), 8), 8))
    words = for <<w::signed-little-64 <- padded>>, do: w
    t = "tensor<4xf32>"

    middle =
      if with_callback? do
        "%c = stablehlo.custom_call @exla_runtime_callback(%cb, %d) {api_version = 4 : i32, has_side_effect = true, backend_config = {callback_id = array<i64: #{Enum.join(words, ", ")}>, callback_id_size = #{byte_size(id)} : ui64, num_aliased_data_outputs = 0 : ui64}} : (tensor<8xui8>, #{t}) -> #{t}"
      else
        "%c = stablehlo.add %d, %zero : #{t}"
      end

    """
    func.func @main(%cb: tensor<8xui8>, %x: #{t}) -> #{t} {
      %two = stablehlo.constant dense<2.0> : #{t}
      %one = stablehlo.constant dense<1.0> : #{t}
      %zero = stablehlo.constant dense<0.0> : #{t}
      %d = stablehlo.multiply %x, %two : #{t}
      #{middle}
      %r = stablehlo.add %c, %one : #{t}
      return %r : #{t}
    }
    """
  end

  def echo_server do
    receive do
      {:exla_runtime_call, _id, [{bin, _shape}], {pid, ref}} -> send(pid, {ref, {:ok, [bin]}})
    end

    echo_server()
  end
end

alias Bench.Gpu, as: B

jax =
  Path.join(dir, "jax.txt")
  |> File.read!()
  |> String.split("\n", trim: true)
  |> Map.new(fn line ->
    [key, value] = String.split(line, " ", parts: 2)

    case Float.parse(value) do
      {number, ""} -> {key, number}
      _ -> {key, value}
    end
  end)

{:ok, info} = B.call(xla, :info)
device_kinds = for %{kind: kind} <- Map.get(info, :device_info) || [], do: kind

IO.puts(
  "\n## gpu: xla_node (#{info.platform}, devices #{Enum.join(info.devices, ", ")}#{if device_kinds != [], do: ": " <> Enum.join(device_kinds, ", ")}) " <>
    "vs JAX #{jax["jax_version"]} (#{jax["device"]}) on the same machine, medians; node over JAX"
)

f32 = fn list -> {for(x <- list, into: <<>>, do: <<x::float-32-little>>), {{:f, 32}, [length(list)]}} end

# A tiny run with host tensors.
add_one = B.compile!(xla, File.read!(Path.join(dir, "add_one.mlir")))
x4 = f32.([0.0, 1.0, 2.0, 3.0])
{:ok, [{_, {{:f, 32}, [4]}}]} = B.call(xla, {:run, add_one, [x4]})
tiny = B.median_us(fn -> {:ok, [_]} = B.call(xla, {:run, add_one, [x4]}) end, 2000, 100)
IO.puts("  " <> B.row("tiny run x + 1 on f32[4], host tensors in and out", tiny, jax["tiny_host"]))

# MLP training steps, params and batch on the device, the loss read back each step.
mlps =
  for file <- File.ls!(dir), match = Regex.run(~r/^mlp_(\d+)_(\d+)\.mlir$/, file), match != nil do
    [_, width, batch] = match
    {String.to_integer(width), String.to_integer(batch)}
  end
  |> Enum.sort_by(fn {width, batch} -> width * batch end)

for {width, batch} <- mlps do
  key = "mlp_#{width}_#{batch}"
  exe = B.compile!(xla, File.read!(Path.join(dir, "#{key}.mlir")))

  [w1, b1, w2, b2, w3, b3, x, y] =
    for {name, dims} <- [w1: [width, width], b1: [width], w2: [width, width], b2: [width], w3: [width, width], b3: [width], x: [batch, width], y: [batch, width]] do
      B.to_device!(xla, {File.read!(Path.join(dir, "#{key}_#{name}.f32")), {{:f, 32}, dims}})
    end

  # One round trip: the new params stay on the device, the loss comes back in the reply.
  step = fn params ->
    {:ok, outputs} =
      B.call(xla, {:run, exe, params ++ [x, y], [keep_on_device: [0, 1, 2, 3, 4, 5]]})

    {new_params, [{<<value::float-32-little>>, _}]} = Enum.split(outputs, 6)
    {new_params, value}
  end

  initial = [w1, b1, w2, b2, w3, b3]
  {params, first_loss} = step.(initial)
  state = :ets.new(:mlp_state, [:set])
  :ets.insert(state, {:params, params})
  # Each step's inputs are the last one's outputs; the old ones are freed outside the timing.
  timed_step = fn ->
    [{:params, params}] = :ets.lookup(state, :params)
    {new_params, _} = step.(params)
    :ets.insert(state, {:params, new_params})
    params
  end

  n = if width * batch <= 1024 * 256, do: 200, else: 30

  samples =
    for i <- 1..(n + 3) do
      t0 = System.monotonic_time(:nanosecond)
      old = timed_step.()
      elapsed = (System.monotonic_time(:nanosecond) - t0) / 1000
      B.free_all(xla, old)
      {i, elapsed}
    end

  per_step = B.median(for {i, us} <- samples, i > 3, do: us)
  [{:params, last}] = :ets.lookup(state, :params)
  B.free_all(xla, last ++ [x, y, exe])
  loss_gap = abs(first_loss - jax["#{key}_first_loss"]) / abs(jax["#{key}_first_loss"])

  IO.puts(
    "  " <>
      B.row("MLP training step, width #{width}, batch #{batch}, params and batch on the device", per_step, jax["#{key}_step"]) <>
      " (first loss #{Float.round(first_loss, 5)}, JAX #{Float.round(jax["#{key}_first_loss"], 5)}: relative gap #{:erlang.float_to_binary(loss_gap, [{:scientific, 1}])})"
  )
end

# An n^3 bf16 matmul on device operands (all ones: the values do not change its speed).
n = trunc(jax["matmul_n"])
ones = {:binary.copy(<<0x80, 0x3F>>, n * n), {{:bf, 16}, [n, n]}}
[a, b] = for _ <- 1..2, do: B.to_device!(xla, ones)
matmul = B.compile!(xla, File.read!(Path.join(dir, "matmul.mlir")))

mm =
  B.median_us(
    fn ->
      # wait: true: answered once computed (otherwise once launched).
      {:ok, [c]} = B.call(xla, {:run, matmul, [a, b], [keep_on_device: true, wait: true]})
      :ok = B.call(xla, {:free, c})
    end,
    20
  )

{:ok, [c]} = B.call(xla, {:run, matmul, [a, b], [keep_on_device: true]})
{:ok, {<<corner::16-little, _::binary>>, _}} = B.call(xla, {:read, c})
<<corner_f32::float-32>> = <<corner::16, 0::16>>
true = corner_f32 == n * 1.0 or raise("matmul of ones: got #{corner_f32} at [0, 0], expected #{n}")
B.free_all(xla, [a, b, c, matmul])
tflops = 2 * n * n * n / (mm * 1.0e-6) / 1.0e12

IO.puts(
  "  " <>
    B.row("#{n}^3 bf16 matmul on device operands (its free included)", mm, jax["matmul"]) <>
    " (node #{:erlang.float_to_binary(tflops, decimals: 2)} TFLOP/s)"
)

# Host -> device and back.
for mib <- jax["transfers_mib"] |> to_string() |> String.split(",") |> Enum.map(&String.to_integer/1) do
  data = {:crypto.strong_rand_bytes(mib * 1024 * 1024), {{:u, 8}, [mib * 1024 * 1024]}}
  buffer = B.to_device!(xla, data)
  {:ok, ^data} = B.call(xla, {:read, buffer})

  h2d =
    B.median_us(fn -> B.free_all(xla, [B.to_device!(xla, data)]) end, 5, 1)

  d2h = B.median_us(fn -> {:ok, _} = B.call(xla, {:read, buffer}) end, 5, 1)
  B.free_all(xla, [buffer])
  mib_s = fn us -> :erlang.float_to_binary(mib / (us * 1.0e-6), decimals: 0) <> " MiB/s" end
  IO.puts("  " <> B.row("#{mib} MiB host -> device (its free included)", h2d, jax["h2d_#{mib}MiB"]) <> " (node #{mib_s.(h2d)}, JAX #{mib_s.(jax["h2d_#{mib}MiB"])})")
  IO.puts("  " <> B.row("#{mib} MiB device -> host", d2h, jax["d2h_#{mib}MiB"]) <> " (node #{mib_s.(d2h)}, JAX #{mib_s.(jax["d2h_#{mib}MiB"])})")
end

# One runtime_call inside a program, over the same program without it, against JAX's
# pure_callback likewise; the input on the device, the result read back.
echo = spawn(&B.echo_server/0)
x_dev = B.to_device!(xla, x4)
without = B.compile!(xla, B.callback_program(false))
jax_extra = jax["callback_with"] - jax["callback_without"]

case B.call(xla, {:compile, B.callback_program(true)}) do
  {:ok, with_cb} ->
    run = fn exe -> fn -> {:ok, [_]} = B.call(xla, {:run, exe, [x_dev], [callback_server: echo]}) end end
    {:ok, [{got, _}]} = run.(with_cb).()
    {:ok, [{^got, _}]} = B.call(xla, {:run, without, [x_dev]})
    with_us = B.median_us(run.(with_cb), 1000, 50)
    without_us = B.median_us(run.(without), 1000, 50)

    IO.puts(
      "  one runtime_call inside a program, over the same program without it: node +#{B.us(with_us - without_us)} " <>
        "(#{B.us(with_us)} over #{B.us(without_us)}), JAX pure_callback +#{B.us(jax_extra)} " <>
        "(#{B.us(jax["callback_with"])} over #{B.us(jax["callback_without"])}): " <>
        "#{:erlang.float_to_binary((with_us - without_us) / jax_extra, decimals: 2)}x"
    )

  {:error, {kind, message}} ->
    IO.puts(
      "  one runtime_call inside a program: not run: the node refuses it (#{kind}: #{String.slice(message, 0, 200)}); " <>
        "JAX pure_callback +#{B.us(jax_extra)}"
    )
end
