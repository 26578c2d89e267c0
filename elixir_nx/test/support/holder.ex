defmodule XlaNode.NxTest.Holder do
  @moduledoc """
  A process that holds tensors in its state, as an application's process would, and uses them
  later: for the lifetime tests, here and on a second BEAM node (its code is on the peer's code
  path; the functions given to `await/2` run only on this node).

  What it holds is an argument of its loop, used again at each message, so that the compiler
  keeps it live; `drop/1` calls a function that does not take it, then collects the garbage.
  """

  @doc "Starts one, unlinked; returns its pid."
  def start, do: spawn(fn -> loop([]) end)

  @doc "Holds `tensors` too, after using each (`Nx.sum/1`); returns their sums."
  def hold(holder, tensors), do: request(holder, {:hold, tensors})

  @doc """
  Holds `tensors` too, without using them (until `sums/1`); returns `:ok`. A message
  `{:params, tensors}` sent to the holder does the same, unanswered.
  """
  def keep(holder, tensors), do: request(holder, {:keep, tensors})

  @doc """
  Runs `fun` in the holder's process, holds the tensors (a list) it returns, and returns their
  sums: `fun` may start tasks, whose caller is then the holder.
  """
  def await(holder, fun), do: request(holder, {:await, fun})

  @doc """
  As `await/2` with `apply(module, function, args)` (a tensor, or a list of them), which runs
  on any node (a function of a test module exists only where the test runs).
  """
  def apply(holder, module, function, args), do: request(holder, {:apply, module, function, args})

  @doc """
  Gives everything it holds to the holder `to` (which uses each, then holds it), and holds it
  no more; returns what `to` answers.
  """
  def give(holder, to), do: request(holder, {:give, to})

  @doc "The sums of everything it holds, read now (in the order held, oldest first)."
  def sums(holder), do: request(holder, :sums)

  @doc "Drops everything it holds and collects its garbage."
  def drop(holder), do: request(holder, :drop)

  defp request(holder, message) do
    ref = make_ref()
    send(holder, {message, self(), ref})

    receive do
      {^ref, reply} -> reply
    after
      60_000 -> raise "the holder #{inspect(holder)} did not answer #{inspect(message)}"
    end
  end

  defp loop(held) do
    receive do
      {{:hold, tensors}, from, ref} ->
        send(from, {ref, sums_of(tensors)})
        loop(held ++ tensors)

      {{:keep, tensors}, from, ref} ->
        send(from, {ref, :ok})
        loop(held ++ tensors)

      # As an application's process is sent them: kept, not used.
      {:params, tensors} ->
        loop(held ++ tensors)

      {{:await, fun}, from, ref} ->
        tensors = fun.()
        send(from, {ref, sums_of(tensors)})
        loop(held ++ tensors)

      {{:apply, module, function, args}, from, ref} ->
        tensors = List.wrap(Kernel.apply(module, function, args))
        send(from, {ref, sums_of(tensors)})
        loop(held ++ tensors)

      {{:give, to}, from, ref} ->
        given(held, to, from, ref)

      {:sums, from, ref} ->
        send(from, {ref, sums_of(held)})
        loop(held)

      {:drop, from, ref} ->
        dropped(from, ref)
    end
  end

  defp given(held, to, from, ref) do
    send(from, {ref, hold(to, held)})
    dropped_quietly()
  end

  defp dropped_quietly do
    :erlang.garbage_collect()
    loop([])
  end

  defp dropped(from, ref) do
    :erlang.garbage_collect()
    send(from, {ref, :dropped})
    loop([])
  end

  defp sums_of(tensors) do
    try do
      Enum.map(tensors, &(&1 |> Nx.sum() |> Nx.to_number()))
    rescue
      e in XlaNode.Error -> {:error, e}
    end
  end
end
