defmodule XlaNode.LogLines do
  @moduledoc """
  A `:logger` handler that sends each message logged to a test process as
  `{:logged, level, text}`, so that a test can wait for a line that comes by its own way (a
  node's output, read from its port) instead of reading only what was logged by a given
  moment.
  """

  @doc "Sends the logged lines to `pid` until `detach/1`; returns the handler's id."
  def attach(pid) do
    id = :"log_lines_#{System.unique_integer([:positive])}"
    :ok = :logger.add_handler(id, __MODULE__, %{config: %{pid: pid}, level: :all})
    id
  end

  def detach(id), do: :logger.remove_handler(id)

  @doc false
  def log(%{level: level, msg: msg}, %{config: %{pid: pid}}),
    do: send(pid, {:logged, level, text(msg)})

  defp text({:string, chardata}), do: IO.chardata_to_string(chardata)
  defp text({:report, report}), do: inspect(report)
  defp text({format, args}), do: format |> :io_lib.format(args) |> IO.chardata_to_string()
end
