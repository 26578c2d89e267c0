defmodule XlaNode.Backend.Scope do
  @moduledoc false

  # Frees at once what a piece of code made and does not return: `XlaNode.Backend.scope/1`.
  #
  # A buffer lives while some process holds its tensor (`XlaNode.Keeper`), and goes some time
  # after the last holder drops it, once that holder's garbage is collected. A scope frees
  # sooner, and without waiting for a collection: every buffer this process makes while a scope
  # is open is noted in the process dictionary, and when the scope's function returns, every
  # noted buffer that the returned term does not hold is freed, whoever else holds it. Scopes
  # nest: what an inner scope returns is noted in the outer one. When the function raises,
  # throws or exits, everything it made is freed.
  #
  # Buffers are freed with one `{:free, buffers}` cast to each node holding some (the node each
  # buffer reference names, `node/1`, also for a pool's tensors): no round trip at all. A buffer
  # freed already (`Nx.backend_deallocate/1`) or whose node is down is skipped silently: either
  # way it is gone.

  @key {__MODULE__, :made}

  @doc "Runs `fun` in a scope; see `XlaNode.Backend.scope/1`."
  def run(fun) when is_function(fun, 0) do
    outer = Process.put(@key, [])

    result =
      try do
        fun.()
      catch
        kind, reason ->
          made = Process.get(@key, [])
          restore(outer, [])
          free(made)
          :erlang.raise(kind, reason, __STACKTRACE__)
      end

    kept = held(result)
    {keep, drop} = @key |> Process.get([]) |> Enum.split_with(&MapSet.member?(kept, &1))
    # What the scope returns now belongs to the enclosing scope, if any.
    restore(outer, keep)
    free(drop)
    result
  end

  defp restore(nil, _keep), do: Process.delete(@key)
  defp restore(outer, keep), do: Process.put(@key, keep ++ outer)

  @doc "Notes a buffer this process made, when a scope is open (otherwise it does nothing)."
  def made(buffer) when is_reference(buffer) do
    case Process.get(@key) do
      nil -> :ok
      made -> Process.put(@key, [buffer | made])
    end

    :ok
  end

  @doc """
  Frees buffers: one `{:free, buffers}` cast to each of their nodes, answered by nothing
  (`XlaNode.free_all/1`); the node frees them in order with this process's next requests.
  Buffers freed already, or on a node that is down, are skipped.
  """
  def free([]), do: :ok
  def free(buffers), do: buffers |> Enum.uniq() |> XlaNode.free_all()

  @doc """
  The buffers of every `XlaNode.Backend` tensor inside a term, however nested (tuples, lists,
  maps and structs such as model states).
  """
  def buffers(term), do: term |> held() |> MapSet.to_list()

  @doc """
  The `{token, buffer}` of every `XlaNode.Backend` tensor inside a term that `XlaNode.Keeper`
  tracks, however nested, each once.
  """
  def tokens(term) do
    term
    |> reduce_data([], fn
      %XlaNode.Backend{buffer: buffer, token: token}, acc
      when is_reference(buffer) and is_binary(token) ->
        [{token, buffer} | acc]

      _data, acc ->
        acc
    end)
    |> Enum.uniq()
  end

  defp held(term) do
    reduce_data(term, MapSet.new(), fn
      %XlaNode.Backend{buffer: buffer}, acc when is_reference(buffer) -> MapSet.put(acc, buffer)
      _data, acc -> acc
    end)
  end

  # `fun` over the data of every XlaNode.Backend tensor inside a term.
  defp reduce_data(%Nx.Tensor{data: %XlaNode.Backend{} = data}, acc, fun), do: fun.(data, acc)
  defp reduce_data(%Nx.Tensor{}, acc, _fun), do: acc

  defp reduce_data(list, acc, fun) when is_list(list),
    do: Enum.reduce(list, acc, &reduce_data(&1, &2, fun))

  defp reduce_data(tuple, acc, fun) when is_tuple(tuple),
    do: tuple |> Tuple.to_list() |> reduce_data(acc, fun)

  defp reduce_data(%_{} = struct, acc, fun),
    do: struct |> Map.from_struct() |> reduce_data(acc, fun)

  defp reduce_data(%{} = map, acc, fun),
    do: Enum.reduce(map, acc, fn {k, v}, acc -> reduce_data(v, reduce_data(k, acc, fun), fun) end)

  defp reduce_data(_other, acc, _fun), do: acc
end
