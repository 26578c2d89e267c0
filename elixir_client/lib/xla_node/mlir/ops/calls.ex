defmodule XlaNode.MLIR.Ops.Calls do
  @moduledoc false
  # Calls out of the program: custom calls to FFI targets, EXLA's runtime callbacks, outfeed and
  # infeed.
  # XlaNode.MLIR documents them and delegates here; see XlaNode.MLIR.Ops.Common for what the
  # families share.

  import XlaNode.MLIR.Ops.Common

  ## Custom calls

  def custom_call(target, operands, result_types, opts \\ []) do
    opts =
      options!(opts, "custom_call/4",
        backend_config: :attributes,
        has_side_effect: :boolean,
        output_operand_aliases: :integer_pairs
      )

    operands = Enum.map(operands, &value!("stablehlo.custom_call @#{target}", &1))
    result_types = Enum.map(result_types, &check_type!("stablehlo.custom_call @#{target}", &1))

    config =
      Keyword.get(opts, :backend_config, [])
      |> Enum.map_join(", ", fn {k, v} -> "#{k} = #{v}" end)

    aliases =
      case Keyword.get(opts, :output_operand_aliases, []) do
        [] ->
          []

        pairs ->
          one = length(result_types) == 1

          [
            "output_operand_aliases = [" <>
              Enum.map_join(pairs, ", ", fn {r, o} ->
                "#stablehlo.output_operand_alias<output_tuple_indices = #{if one, do: "[]", else: "[#{r}]"}, operand_index = #{o}, operand_tuple_indices = []>"
              end) <> "]"
          ]
      end

    emit(
      "stablehlo.custom_call",
      operands,
      result_types,
      [
        "call_target_name = \"#{target}\"",
        "api_version = 4 : i32",
        "has_side_effect = #{Keyword.get(opts, :has_side_effect, false)}",
        "backend_config = {#{config}}"
      ] ++ aliases
    )
  end

  def runtime_call(handle, callback_id, args, result_types) do
    handle = check_handle!(handle)

    custom_call("exla_runtime_callback", [handle | args], result_types,
      backend_config: callback_config(callback_id, 0),
      has_side_effect: true
    )
  end

  def io_call(handle, callback_id, args) do
    handle = check_handle!(handle)
    args = Enum.map(args, &value!("io_call", &1))

    custom_call("exla_runtime_callback", [handle | args], Enum.map(args, & &1.type),
      backend_config: callback_config(callback_id, length(args)),
      has_side_effect: true,
      output_operand_aliases: for(i <- 0..(length(args) - 1)//1, do: {i, i + 1})
    )
  end

  def stream_target(target) do
    bin = term_to_binary(target)
    XlaNode.MLIR.Ops.Elementwise.constant(:binary.bin_to_list(bin), {{:u, 8}, [byte_size(bin)]})
  end

  def outfeed(target, payloads) do
    target = check_target!("outfeed", target)

    u8 = {{:u, 8}, []}
    [flag] = custom_call("exla_beam_outfeed", [target | payloads], [u8], has_side_effect: true)
    flag
  end

  def infeed(target, result_types) do
    target = check_target!("infeed", target)
    custom_call("exla_beam_infeed", [target], result_types, has_side_effect: true)
  end

  defp check_target!(op, target) do
    target = value!(op, target)

    case target.type do
      {{:u, 8}, [_]} -> target
      _ -> mismatch!(op, [target], "a u8 vector: the callback handle or a stream_target/1")
    end
  end

  defp check_handle!(handle) do
    handle = value!("runtime_call", handle)

    if handle.type != {{:u, 8}, [8]},
      do:
        mismatch!(
          "runtime_call",
          [handle],
          "the tensor<8xui8> callback handle (the function's first parameter)"
        )

    handle
  end

  # Terms in a program are encoded as OTP 26 and later encode them by default (atoms as UTF-8),
  # which OTP 25 gives with `minor_version: 2`: a program has the same text, and so the same
  # entry in the node's compile cache, whatever release built it.
  defp term_to_binary(term), do: :erlang.term_to_binary(term, minor_version: 2)

  defp callback_config(id, aliased) do
    bin = term_to_binary(id)
    padded = bin <> :binary.copy(<<0>>, rem(8 - rem(byte_size(bin), 8), 8))
    words = for <<w::signed-native-64 <- padded>>, do: w

    [
      {"callback_id", i64_array(words)},
      {"callback_id_size", "#{byte_size(bin)} : ui64"},
      {"num_aliased_data_outputs", "#{aliased} : ui64"}
    ]
  end
end
