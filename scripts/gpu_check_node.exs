# Step 2 of scripts/gpu_check.sh: the node started on the plugin under check answers `:info`,
# runs a tiny program on host tensors, and takes a tensor to the device and back bit for bit.
# Writes one line naming the platform and devices to DEVICE_FILE; exits non-zero on any
# failure, saying which.
#
#   elixir --sname NAME --cookie COOKIE scripts/gpu_check_node.exs XLA_NODE_SNAME DEVICE_FILE

[xla_name, device_file] = System.argv()
host = node() |> Atom.to_string() |> String.split("@") |> List.last()
xla = :"#{xla_name}@#{host}"

check = fn what, ok? ->
  if ok? do
    IO.puts("ok: #{what}")
  else
    IO.puts("FAILED: #{what}")
    System.halt(1)
  end
end

check.("connected to #{xla}", Node.connect(xla) == true)
call = fn request -> GenServer.call({:xla, xla}, request, 120_000) end
check.(":ping", call.(:ping) == :pong)

{:ok, info} = call.(:info)
kinds = for %{kind: kind} <- Map.get(info, :device_info) || [], do: kind

device =
  "#{info.platform}: #{Enum.join(info.devices, ", ")}" <>
    if(kinds == [], do: "", else: " (#{Enum.join(Enum.uniq(kinds), ", ")})") <>
    ", host_callbacks #{info.host_callbacks}"

IO.puts("device: #{device}")
File.write!(device_file, device)

mlir = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %one = stablehlo.constant dense<1.0> : tensor<4xf32>
  %y = stablehlo.add %x, %one : tensor<4xf32>
  return %y : tensor<4xf32>
}
"""

f32 = fn list -> for x <- list, into: <<>>, do: <<x::float-32-little>> end
{:ok, exe} = call.({:compile, mlir})
reply = call.({:run, exe, [{f32.([1.0, 2.0, 3.0, 4.0]), {{:f, 32}, [4]}}]})
check.("x + 1 on f32[4]", reply == {:ok, [{f32.([2.0, 3.0, 4.0, 5.0]), {{:f, 32}, [4]}}]})

tensor = {:crypto.strong_rand_bytes(1_048_576), {{:u, 8}, [1_048_576]}}
{:ok, buffer} = call.({:to_device, tensor})
check.("1 MiB to the device and back", call.({:read, buffer}) == {:ok, tensor})
check.("free", call.({:free, buffer}) == :ok and call.({:free, exe}) == :ok)
