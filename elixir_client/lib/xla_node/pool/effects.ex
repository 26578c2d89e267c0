defmodule XlaNode.Pool.Effects do
  @moduledoc """
  What running a program does besides computing its results, read from its module text: whether
  `XlaNode.Pool` may run it again on another node when the node it ran on went down.

    * `:pure` - nothing leaves the program but its results: a re-sent run is the same run.
    * `:callbacks` - it calls back (`Nx.runtime_call`, EXLA's `exla_runtime_callback` with no
      aliased outputs): it may be re-sent as long as no callback fired in the attempt that died.
    * `{:side_effects, what}` - something outside sees each run (`io_call`, outfeed, infeed, a
      custom call marked `has_side_effect = true`): never re-sent. `what` names the first one.

  MLIR bytecode cannot be read here: a bytecode module that names any of these targets, or the
  `has_side_effect` attribute, is taken as having side effects.

      iex> alias XlaNode.MLIR, as: M
      iex> M.module(fn ->
      ...>   M.function("main", [{{:u, 8}, [8]}, {{:f, 32}, [3]}], fn [handle, x] ->
      ...>     M.runtime_call(handle, :double, [x], [{{:f, 32}, [3]}])
      ...>   end)
      ...> end)
      ...> |> XlaNode.Pool.Effects.of()
      :callbacks
  """

  @type t :: :pure | :callbacks | {:side_effects, String.t()}

  @callback_target "exla_runtime_callback"
  # Ops and custom-call targets whose every run is seen outside the program.
  @stream_ops ["stablehlo.outfeed", "stablehlo.infeed", "mhlo.outfeed", "mhlo.infeed"]
  @stream_targets ["exla_beam_outfeed", "exla_beam_infeed"]

  @doc """
  Classifies a module (text or bytecode).

      iex> XlaNode.Pool.Effects.of("func.func @main(%x: tensor<f32>) -> tensor<f32> { return %x : tensor<f32> }")
      :pure

      iex> XlaNode.Pool.Effects.of(~s|%0 = stablehlo.custom_call @my_log(%x) {has_side_effect = true} : (tensor<f32>) -> tensor<f32>|)
      {:side_effects, "custom call @my_log (has_side_effect = true)"}
  """
  @spec of(binary()) :: t()
  def of(<<"ML", 0xEF, "R", _::binary>> = bytecode), do: of_bytecode(bytecode)
  def of(text) when is_binary(text), do: of_text(text)

  defp of_text(text) do
    stream = Enum.find(@stream_ops, &String.contains?(text, &1))

    if stream do
      {:side_effects, stream}
    else
      text
      |> custom_calls()
      |> Enum.reduce_while(:pure, fn call, acc ->
        case classify(call) do
          {:side_effects, _} = effects -> {:halt, effects}
          :callbacks -> {:cont, :callbacks}
          :pure -> {:cont, acc}
        end
      end)
    end
  end

  # One entry per custom call: its target and the text of its attributes.
  defp custom_calls(text) do
    text
    |> String.split("custom_call")
    |> tl()
    |> Enum.map(&statement/1)
    |> Enum.map(fn statement -> {target(statement), statement} end)
  end

  # The custom call's own text: up to the end of its line, or further while a brace opened on it
  # (a pretty-printed attribute dictionary) is still open.
  defp statement(rest), do: statement(rest, 0, [])

  defp statement(<<>>, _depth, acc), do: acc |> Enum.reverse() |> IO.iodata_to_binary()

  defp statement(<<"\n", _::binary>>, depth, acc) when depth <= 0,
    do: statement(<<>>, depth, acc)

  defp statement(<<c, rest::binary>>, depth, acc) do
    depth =
      case c do
        ?{ -> depth + 1
        ?} -> depth - 1
        _ -> depth
      end

    statement(rest, depth, [c | acc])
  end

  defp target(statement) do
    cond do
      match = Regex.run(~r/^\s*@([\w.$-]+|"[^"]*")/, statement) ->
        match |> Enum.at(1) |> String.trim("\"")

      match = Regex.run(~r/call_target_name\s*=\s*"([^"]*)"/, statement) ->
        Enum.at(match, 1)

      true ->
        "(unnamed)"
    end
  end

  defp classify({@callback_target, statement}) do
    case Regex.run(~r/num_aliased_data_outputs\s*=\s*(\d+)/, statement) do
      [_, n] when n != "0" ->
        {:side_effects, "io_call (#{@callback_target} with aliased outputs)"}

      _ ->
        :callbacks
    end
  end

  defp classify({target, _statement}) when target in @stream_targets,
    do: {:side_effects, "custom call @#{target}"}

  defp classify({target, statement}) do
    if Regex.match?(~r/has_side_effect\s*=\s*true/, statement),
      do: {:side_effects, "custom call @#{target} (has_side_effect = true)"},
      else: :pure
  end

  defp of_bytecode(bytecode) do
    names = [@callback_target, "has_side_effect", "outfeed", "infeed" | @stream_targets]

    case Enum.find(names, &String.contains?(bytecode, &1)) do
      nil -> :pure
      name -> {:side_effects, "MLIR bytecode naming #{name}"}
    end
  end
end
